#pragma once
// What the backward's gradients are judged against (the rule is judge.h's): per element of dq, dk
// and dv, the exact value (reference::attention_backward, from the rounded inputs), the value
// computed again the way a path is allowed to, its scale and its floor.
//
// The allowed computation, row by row in fp32, from the kernels' own inputs (out as the forward
// stored it, the forward's fp32 LSE):
//   D_i   = sum_c dO_ic O_ic (- dlse_i with an LSE gradient)   one fp32 chain
//   x_ij  = mods(fl(fl(q_i.k_j) * scale))             as attention_expected.h
//   P_ij  = fl(exp(x_ij - lse_i)),  dP_ij = fl(dO_i.v_j),  dS_ij = fl(P_ij (dP_ij - D_i)) (softcap factor)
//   with dropout (the problem's keep mask) P_ij and dP_ij times the float 1 / (1 - p) or 0 where
//   dV and dS take them (dS = P (dP - D) with the undropped P)
//   P and scale * dS rounded to the input dtype where the path rounds them (tensor cores: f16/bf16)
//   dV_j = sum_i P_ij dO_i,  dQ_i = sum_j dS_ij k_j,  dK_j = sum_i dS_ij q_i   fp32 chains, then the
//   gradient's dtype.
// Scales: dV_jc |dV_jc| + sqrt(sum_i (P_ij dO_ic)^2); dQ_ic |dQ_ic| + sqrt(sum_j (s m_ij k_jc)^2) and
// dK_jc |dK_jc| + sqrt(sum_i (s m_ij q_ic)^2), with s the scale and m_ij = P_ij (|dP_ij| + |D_i|) the
// magnitude dS's rounding errors are proportional to (the difference dP - D cancels, its parts do not).
// Floors: rounding_floor(gradient dtype, 4 + sqrt(terms) + 2 max_j a_ij, scale) as attention_expected.h
// (a_ij the magnitude of the score, whose fp32 error moves P).
#include <vector>

#include "judge.h"
#include "selfattn/reference.h"
#include "selfattn/types.h"

namespace selfattn::testing {

struct BackwardArithmetic {
  DType dtype = DType::f32;       // of q, k, v, out, dout (inputs already representable in it)
  DType grad_dtype = DType::f32;  // of dq, dk, dv
  bool rounded = false;           // P and dS rounded to dtype before the products they feed
};

struct BackwardExpected {
  Expected dq, dk, dv;  // BHSD like q / k / v: dq, dk rows of head_dim, dv rows of v_dim()
};

// q, k, v, dout, out: contiguous BHSD (out as the kernel reads it; v, dout and out rows of v_dim()); lse [batch, heads, seq_q] fp32 values;
// dlse: the LSE's upstream gradient in lse's layout, or empty for none.
BackwardExpected expected_backward(const reference::Problem& problem, const std::vector<double>& q,
                                   const std::vector<double>& k, const std::vector<double>& v,
                                   const std::vector<double>& dout, const std::vector<double>& out,
                                   const std::vector<double>& lse, const BackwardArithmetic& arithmetic,
                                   const std::vector<double>& dlse = {});

}  // namespace selfattn::testing
