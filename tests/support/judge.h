#pragma once
// The tolerance rule every test of a computed result uses (attention's out and LSE, the self-attention
// pipeline, the sim's GEMM; decode, masks and backward reuse it). It is written once, here.
//
// Why a measured rule. A kernel that reads f16 inputs, computes in fp32 and stores f16 cannot match
// the exact result better than its own roundings allow; a judge looser than that passes small
// wrong-value bugs (a constant off in its fifth digit, a rescale skipped near 1), a judge tighter
// than that fails correct kernels at random. So the tolerance is measured, not chosen (the rule
// FlashAttention's tests use): next to the exact result (double precision, from the same rounded
// inputs) the test computes the result a second time the way the path is ALLOWED to - fp32
// arithmetic, intermediates rounded where the path rounds them (P before P V on tensor cores), the
// result stored in its dtype - and the path's error may be at most
//
//     kAllowedErrorMultiple (2) x the allowed computation's error  +  a floor.
//
// Units. Errors of different elements differ in size for good reasons (an output near zero, a row
// that averages many keys), so each element's error is divided by its `scale`: the magnitude its
// rounding errors are proportional to (for a weighted sum, |result| plus the root sum of squares
// of its terms). In those units the allowed computation's errors are alike across the output.
//
// Levels. With W the allowed computation's worst error at a level, the path must stay within
// 2 W + floor at each of three levels:
//   element  every element: one wrong value among millions fails;
//   row      the root mean square of each row (row_length consecutive elements): a row that is
//            slightly but systematically off fails, however many other rows are right;
//   all      the root mean square of the whole result: a small error everywhere fails.
// W at a level is the allowed computation's worst group at that level (its worst element, its
// worst row, its overall RMS): like is compared with like, so the rule stays as tight and as
// stable for a million elements as for a hundred.
//
// The floor (per element, in the result's units) covers what a single sample of the allowed
// computation can miss by luck: one rounding of the stored result, plus a statistical bound of
// the fp32 arithmetic. Callers derive it from the computation (see attention_expected.h). Over a
// row or the whole result the allowed computation's luck averages out, so the floor of a group of
// n elements is the RMS of its elements' floors divided by sqrt(n).
//
// Exactness. Where the exact value is not finite (LSE -inf of a row that sees no key) or its scale
// is 0 (out of such a row), the result must equal it exactly. NaN or inf in a result never passes.
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "selfattn/types.h"

namespace selfattn::testing {

constexpr double kAllowedErrorMultiple = 2.0;

// The unit roundoff of a dtype: half the gap from 1 to the next value (2^-24 fp32, 2^-11 f16,
// 2^-8 bf16); rounding to the dtype moves a value by at most this fraction of it.
double unit_roundoff(DType dtype);

// The usual floor of an element of this scale, stored in `stored` after about `fp32_roundings` fp32
// roundings (a statistical count, not a worst case): one rounding of the stored value plus the fp32
// arithmetic, (u_stored + u_fp32 * fp32_roundings) * scale.
double rounding_floor(DType stored, double fp32_roundings, double scale);

// What a computed result is judged against: one entry per element, rows of row_length elements.
struct Expected {
  std::vector<double> exact;    // the exact result (double precision, from the rounded inputs)
  std::vector<double> allowed;  // recomputed with the roundings the path is allowed
  std::vector<double> scale;    // >= 0: the magnitude the element's rounding errors scale with
  std::vector<double> floor;    // >= 0: absolute error always tolerated
  int row_length = 1;

  size_t size() const { return exact.size(); }
  // Appends other's elements (same row_length): a result assembled from parts (varlen sequences).
  void append(const Expected& other);
};

// How close a result came to its bounds: the worst ratio of error to bound at each level (<= 1
// passes), and the allowed computation's worst error at each level (in scale units).
struct Judgement {
  double element = 0, row = 0, all = 0;
  double allowed_element = 0, allowed_row = 0, allowed_all = 0;
};

// Names row r of a result in a failure message ("batch 1 head 3 query 17"); null: "row r".
using RowNamer = std::function<std::string(size_t row)>;

// Judges `got` (same order as expected) by the rule above; `what` names the result ("out", "lse").
// The failure message names the level, the element or row, the error, the bound and its parts.
::testing::AssertionResult judge(const std::string& what, const std::vector<double>& got, const Expected& expected,
                                 Judgement* judgement = nullptr, const RowNamer& row_name = nullptr);

}  // namespace selfattn::testing
