// The tolerance rule (tests/support/judge.h) on made-up results whose errors are known, so each
// level is seen to fail on what it is for: a single wrong element, a row slightly off throughout,
// a small error everywhere; and the allowed computation of attention (attention_expected.h) on a
// small problem, where its error must be the size of the dtype's rounding.
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "attention_expected.h"
#include "attention_harness.h"
#include "judge.h"

namespace selfattn::testing {
namespace {

// rows x row_length elements of scale 1 and floor 0; the allowed computation errs by `allowed(r, c)`.
template <class AllowedError>
Expected made_up(int rows, int row_length, AllowedError allowed) {
  Expected e;
  e.row_length = row_length;
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < row_length; ++c) {
      const double exact = std::sin(r * 0.37 + c);  // anything: errors are measured against it
      e.exact.push_back(exact);
      e.allowed.push_back(exact + allowed(r, c));
      e.scale.push_back(1.0);
      e.floor.push_back(0.0);
    }
  return e;
}

std::vector<double> with_error(const Expected& e, double error) {
  std::vector<double> got(e.exact);
  for (double& x : got) x += error;
  return got;
}

TEST(Judge, PassesErrorsLikeTheAllowedOnes) {
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> rounding(-1e-3, 1e-3);
  const Expected e = made_up(10000, 8, [&](int, int) { return rounding(rng); });
  std::vector<double> got(e.exact);
  for (double& x : got) x += rounding(rng);
  Judgement j;
  EXPECT_TRUE(judge("out", got, e, &j));
  EXPECT_GT(j.all, 0.3);  // comparable to the allowed errors, not far below the bound
}

TEST(Judge, OneWrongElementAmongEightyThousandFails) {
  std::mt19937_64 rng(2);
  std::uniform_real_distribution<double> rounding(-1e-3, 1e-3);
  const Expected e = made_up(10000, 8, [&](int, int) { return rounding(rng); });
  std::vector<double> got(e.exact);
  got[5 * 8 + 3] += 2.5e-3;
  const ::testing::AssertionResult verdict = judge("out", got, e);
  ASSERT_FALSE(verdict);
  EXPECT_NE(std::string(verdict.message()).find("element error at row 5 column 3"), std::string::npos)
      << verdict.message();
}

// Every element of row 7 is off by 0.9, below the element bound (2 x the worst allowed element,
// 1) but above the row bound (2 x the worst allowed row RMS, about 0.37).
TEST(Judge, ARowOffThroughoutFailsAtTheRowLevel) {
  const Expected e = made_up(1000, 8, [](int, int c) { return c == 0 ? 1.0 : 0.1; });
  std::vector<double> got(e.exact);
  for (int c = 0; c < 8; ++c) got[7 * 8 + c] += 0.9;
  const ::testing::AssertionResult verdict = judge("out", got, e);
  ASSERT_FALSE(verdict);
  EXPECT_NE(std::string(verdict.message()).find("row RMS error at row 7"), std::string::npos) << verdict.message();
}

// Every element is off by 0.5: within the element and row bounds (row 0 is allowed errors of 1),
// but far above 2 x the allowed RMS over the whole result.
TEST(Judge, ASmallErrorEverywhereFailsOverall) {
  const Expected e = made_up(1000, 8, [](int r, int) { return r == 0 ? 1.0 : 0.01; });
  const ::testing::AssertionResult verdict = judge("out", with_error(e, 0.5), e);
  ASSERT_FALSE(verdict);
  EXPECT_NE(std::string(verdict.message()).find("overall RMS error"), std::string::npos) << verdict.message();
}

TEST(Judge, FloorCoversWhatTheAllowedComputationMissedByLuck) {
  Expected e = made_up(1, 1, [](int, int) { return 0.0; });  // the allowed computation happened to be exact
  EXPECT_FALSE(judge("out", with_error(e, 1e-6), e));
  e.floor[0] = 1.5e-6;
  EXPECT_TRUE(judge("out", with_error(e, 1e-6), e));
  EXPECT_FALSE(judge("out", with_error(e, 2e-6), e));
}

TEST(Judge, NotFiniteNeverPassesAndZeroScaleMeansExact) {
  Expected e = made_up(2, 2, [](int, int) { return 1e-3; });
  std::vector<double> got(e.exact);
  got[1] = std::numeric_limits<double>::quiet_NaN();
  EXPECT_FALSE(judge("out", got, e));
  got[1] = std::numeric_limits<double>::infinity();
  EXPECT_FALSE(judge("out", got, e));

  // A row that sees no key: out exactly 0 (scale 0), LSE exactly -inf.
  e.exact[2] = e.allowed[2] = 0;
  e.scale[2] = 0;
  e.exact[3] = e.allowed[3] = -std::numeric_limits<double>::infinity();
  got = e.exact;
  EXPECT_TRUE(judge("out", got, e));
  got[2] = 1e-30;
  EXPECT_FALSE(judge("out", got, e));
  got[2] = 0;
  got[3] = -1e30;
  EXPECT_FALSE(judge("out", got, e));
}

// The allowed computation of a small attention problem errs by about the dtype's unit roundoff
// (in scale units), and not at all in a row with a single key (its output is that key's value).
TEST(AttentionExpected, AllowedErrorIsTheDtypesRounding) {
  reference::Problem p;
  p.seq_q = 16;
  p.seq_k = 40;
  p.head_dim = 32;
  p.causal = Causal::top_left;
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    auto operand = [&](int seq) {
      std::vector<double> values(size_t(seq) * p.head_dim);
      for (double& x : values) x = round_to(dtype, normal(rng));
      return values;
    };
    const std::vector<double> q = operand(p.seq_q), k = operand(p.seq_k), v = operand(p.seq_k);
    const AttentionExpected e = expected_attention(p, q, k, v, {dtype, dtype != DType::f32});
    const Judgement j = [&] {
      Judgement judgement;
      EXPECT_TRUE(judge("out", e.out.allowed, e.out, &judgement));
      return judgement;
    }();
    const double u = unit_roundoff(dtype);
    EXPECT_GT(j.allowed_element, 0.3 * u) << to_string(dtype);
    EXPECT_LT(j.allowed_element, (dtype == DType::f32 ? 100 : 4) * u) << to_string(dtype);
    for (int c = 0; c < p.head_dim; ++c) EXPECT_EQ(e.out.allowed[size_t(c)], v[size_t(c)]) << "row 0 sees key 0 only";
  }
}

}  // namespace
}  // namespace selfattn::testing
