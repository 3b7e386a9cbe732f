#pragma once
// --check: compares one run's output with a double-precision CPU reference. Small problems are
// compared whole (selfattn::reference::attention); large ones on sampled rows, evaluated here in
// double with the library's own mask rule (reference::visible_keys), so a 16k-token case checks in
// well under a second.
#include <string>
#include <vector>

#include "bench.h"

namespace selfattn_bench {

// Above this many multiply-adds (batch * heads * seq_q * seq_k * head_dim, the mean of the two
// head dims where v's differs) the whole-output
// reference would take seconds: rows are sampled instead.
constexpr double kWholeReferenceMacs = 3e7;

struct AccuracyResult {
  bool passed = false;
  bool sampled = false;
  double max_abs_err = 0;
  double rel_err = 0;       // ||out - ref|| / ||ref|| over the compared rows (||out|| when ref is all zero)
  std::string failure;      // empty when passed
  bool compared = true;     // false: the problem was too large to check (the backward has no sampled check)
};

// Tolerated relative error by dtype: f32 1e-5, f16 2e-3, bf16 1e-2, FP8 inputs (e4m3, e5m2) 1e-1
// (accuracy.cpp says why). A coarse check that a kernel
// is not broken at benchmark sizes; the tests judge every element, row and LSE by the tighter rule
// of tests/support/judge.h.
double default_tolerance(DType dtype);

// q: [batch, heads, seq_q, head_dim], k: [batch, kv_heads, seq_k, head_dim], v: its rows v_dim(c)
// long, out like q with v's rows; all
// contiguous BHSD holding exactly the values the device saw (already rounded to the dtype).
// Every element of out must be finite: outputs are poisoned with NaN before the checked run, so a
// NaN left means an element was never written (or the kernel produced one).
AccuracyResult check_against_reference(const Case& c, const std::vector<float>& q, const std::vector<float>& k,
                                       const std::vector<float>& v, const std::vector<float>& out,
                                       double tolerance, double whole_reference_macs = kWholeReferenceMacs);

// The backward's gradients as the device stored them, in BHSD order (dq like q; dk, dv like k).
struct Gradients {
  std::vector<float> dq, dk, dv;
};

// Tolerated relative error of each gradient: twice the forward's (dS = P (dP - D) cancels, and P
// and dS are rounded to the input dtype before the products they feed).
double default_backward_tolerance(DType dtype);

// Compares dq, dk and dv with selfattn::reference::attention_backward when the problem has at most
// whole_reference_macs multiply-adds; above that nothing is compared (compared = false): every
// gradient element depends on a whole row or column of P, so no cheap sampled check exists. The
// relative error reported is the worst of the three.
AccuracyResult check_backward_against_reference(const Case& c, const std::vector<float>& q, const std::vector<float>& k,
                                                const std::vector<float>& v, const std::vector<float>& dout,
                                                const Gradients& gradients, double tolerance,
                                                double whole_reference_macs = kWholeReferenceMacs);

// Records a check's outcome in a case's result (a failed check: status check_failed, note why).
void record_check(const AccuracyResult& acc, CaseResult& result);

}  // namespace selfattn_bench
