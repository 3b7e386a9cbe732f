#pragma once
// --check: compares one run's output with a double-precision CPU reference. Small problems are
// compared whole (selfattn::reference::attention); large ones on sampled rows, evaluated here in
// double with the library's own mask rule (reference::visible_keys), so a 16k-token case checks in
// well under a second.
#include <string>
#include <vector>

#include "bench.h"

namespace selfattn_bench {

// Above this many multiply-adds (batch * heads * seq_q * seq_k * head_dim) the whole-output
// reference would take seconds: rows are sampled instead.
constexpr double kWholeReferenceMacs = 3e7;

struct AccuracyResult {
  bool passed = false;
  bool sampled = false;
  double max_abs_err = 0;
  double rel_err = 0;       // ||out - ref|| / ||ref|| over the compared rows (||out|| when ref is all zero)
  std::string failure;      // empty when passed
};

// Tolerated relative error by dtype: f32 1e-5, f16 2e-3, bf16 1e-2. A coarse check that a kernel
// is not broken at benchmark sizes; the tests judge every element, row and LSE by the tighter rule
// of tests/support/judge.h.
double default_tolerance(DType dtype);

// q: [batch, heads, seq_q, head_dim], k and v: [batch, kv_heads, seq_k, head_dim], out like q; all
// contiguous BHSD holding exactly the values the device saw (already rounded to the dtype).
// Every element of out must be finite: outputs are poisoned with NaN before the checked run, so a
// NaN left means an element was never written (or the kernel produced one).
AccuracyResult check_against_reference(const Case& c, const std::vector<float>& q, const std::vector<float>& k,
                                       const std::vector<float>& v, const std::vector<float>& out,
                                       double tolerance, double whole_reference_macs = kWholeReferenceMacs);

// Records a check's outcome in a case's result (a failed check: status check_failed, note why).
void record_check(const AccuracyResult& acc, CaseResult& result);

}  // namespace selfattn_bench
