#pragma once
// What attention's results are judged against (the rule is in judge.h): per output element and per
// LSE row, the exact value (selfattn::reference, double), the value computed again the way a path
// is allowed to, its scale and its floor.
//
// The allowed computation, row by row, in fp32 with every rounding explicit:
//   x_j = fl(fl(sum_e q_e k_je) * scale)       scores in fp32 (the library holds scale as a float),
//         then softcap, ALiBi and bias in fp32 (kernels/common/score_mods.cuh), over the keys the
//         mask rule leaves (reference::visible_key_range); a_j grows by what each adds
//   m = max x_j,  l = sum_j fl(exp(x_j - m)),  lse = fl(m + log l)
//   with a sink s: m' = max(m, s), l' = fl(l e^(m - m') + e^(s - m')), lse = fl(m' + log l') and
//   p_j scaled by e^(m - m') / l' (kernels/common/score_mods.cuh, softmax_row_end); a row whose
//   only term is the sink has out 0 exactly and LSE s within a few fp32 roundings
//   p_j = fl(exp(x_j - m) / l), times the float 1 / (1 - dropout_p) or 0 with dropout (the
//         problem's keep mask; the LSE is the one before), then rounded to the input dtype where the path does that (a
//         tensor-core P V takes A and B of one type: P becomes f16/bf16)
//   out_c = round_to_dtype(sum_j p_j v_jc)     the result stored in dtype
// Dot products and P V sum key by key in one fp32 chain, as the SIMT kernels do; l, a sum of
// positive terms, sums as a tree, as every kernel's per-thread partials and reductions do.
//
// Scales (what each element's rounding errors are proportional to):
//   out_c  |out_c| + sqrt(sum_j (p_j v_jc)^2)   rounding P_j moves out_c by about p_j v_jc u, and
//                                               storing out_c by about |out_c| u
//   lse    |lse| + sum_j p_j a_j + 1            a_j = scale sum_e |q_e k_je|, the magnitude the
//                                               score x_j's fp32 error scales with; 1 for log l's
// Floors (what one sample of the allowed computation may miss by luck), with u_out the unit
// roundoff of the output dtype (2^-24 fp32, 2^-11 f16, 2^-8 bf16), u = 2^-24 and, per row,
//   c = 4 + sqrt(n) + 2 max_j a_j              statistical count of the fp32 roundings a result
//                                               goes through: a few fixed steps, the sums over the
//                                               n visible keys, the score's error (x2: the score and
//                                               the max it is shifted by)
//   out_c  (u_out + u c) scale(out_c)          one rounding of the stored value, plus fp32
//   lse    u (|lse| + c)                       a few ulps of the row's magnitude, plus fp32
#include <optional>
#include <vector>

#include "judge.h"
#include "selfattn/reference.h"
#include "selfattn/types.h"

namespace selfattn::testing {

struct AttentionArithmetic {
  DType dtype = DType::f32;  // of q, k, v and out; inputs are already representable in it
  bool p_rounded = false;    // P rounded to dtype before P V
  // The Hopper FP8 kernel's P V (FlashAttention-3's): each unnormalised probability e^(x_j - m) is
  // rounded to this FP8 format and the sum of the products divided by the fp32 l. Its relative
  // error (2^-4 e4m3) joins the floor, and so does its absolute error below the format's smallest
  // normal (half the subnormal step, 2^-10 e4m3, per unnormalised probability): the kernel rounds
  // e^(x_j - m_t) at each tile's running max m_t, not at the row's, so its roundings are other
  // draws of the same size, which twice the allowed computation's error alone need not cover.
  std::optional<DType> p_fp8;
};

struct AttentionExpected {
  Expected out;  // [batch, heads, seq_q, head_dim], rows of head_dim
  Expected lse;  // [batch, heads, seq_q], natural log; -inf where a row sees no key
};

// q, k, v as for reference::attention (contiguous BHSD, values as the device sees them).
AttentionExpected expected_attention(const reference::Problem& problem, const std::vector<double>& q,
                                     const std::vector<double>& k, const std::vector<double>& v,
                                     const AttentionArithmetic& arithmetic);

}  // namespace selfattn::testing
