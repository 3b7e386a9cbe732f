// The allowed computation of the backward (tests/support/backward_expected.h) on a small problem
// with every option: its errors must be the size of the dtype's rounding in scale units (a scale
// far too large would make them tiny, one far too small would make them large), nothing may be
// tolerated where nothing is seen, and gradients a little wrong the way a kernel goes wrong must
// fail judge() while a path computing P and dS in fp32 passes the rounded rule.
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "attention_harness.h"
#include "backward_expected.h"
#include "judge.h"
#include "selfattn/reference.h"

namespace selfattn::testing {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Batch 0 sees 31 of 40 keys (keys 31.. unseen), batch 1 none (key length 0). GQA 4/2, causal
// bottom_right, softcap, ALiBi and a bias with -inf entries and one row masked entirely.
reference::Problem every_option() {
  reference::Problem p;
  p.batch = 2;
  p.heads = 4;
  p.kv_heads = 2;
  p.seq_q = 24;
  p.seq_k = 40;
  p.head_dim = 32;
  p.causal = Causal::bottom_right;
  p.key_lengths = {31, 0};
  p.softcap = 8;
  p.alibi_slopes = {0.5, 0.25, 0.125, 0.0625};
  p.bias.assign(size_t(p.batch) * p.heads * p.seq_q * p.seq_k, 0.0);
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  for (double& b : p.bias) b = uniform(rng) < -0.8 ? -kInf : uniform(rng);
  for (int j = 0; j < p.seq_k; ++j) p.bias[size_t(5) * p.seq_k + j] = -kInf;  // batch 0 head 0 row 5
  return p;
}

struct Inputs {
  std::vector<double> q, k, v, dout, out, lse;  // out rounded to the dtype, lse to fp32: as stored
};

Inputs inputs(const reference::Problem& p, DType dtype, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto operand = [&](int heads, int seq) {
    std::vector<double> values(size_t(p.batch) * heads * seq * p.head_dim);
    for (double& x : values) x = round_to(dtype, normal(rng));
    return values;
  };
  Inputs in;
  in.q = operand(p.heads, p.seq_q);
  in.k = operand(p.kv_heads, p.seq_k);
  in.v = operand(p.kv_heads, p.seq_k);
  in.dout = operand(p.heads, p.seq_q);
  const reference::Result r = reference::attention(p, in.q, in.k, in.v);
  for (double x : r.out) in.out.push_back(round_to(dtype, float(x)));
  for (double x : r.lse) in.lse.push_back(double(float(x)));
  return in;
}

BackwardExpected expected(const reference::Problem& p, const Inputs& in, DType dtype, bool rounded) {
  return expected_backward(p, in.q, in.k, in.v, in.dout, in.out, in.lse, {dtype, dtype, rounded});
}

struct Part {
  const char* name;
  const Expected BackwardExpected::*member;
};
constexpr Part kParts[] = {{"dq", &BackwardExpected::dq}, {"dk", &BackwardExpected::dk}, {"dv", &BackwardExpected::dv}};

// Lower bound 0.2 u, not attention's 0.3 u: dS's error magnitude P (|dP| + |D|) in the dk/dq scales
// overstates the error where dP and D nearly cancel (over 40 seeds the lowest, dk's, was 0.28 u).
TEST(BackwardExpected, AllowedErrorIsTheDtypesRounding) {
  const reference::Problem p = every_option();
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    const Inputs in = inputs(p, dtype, 5);
    const BackwardExpected e = expected(p, in, dtype, dtype != DType::f32);
    const double u = unit_roundoff(dtype);
    for (const Part& part : kParts) {
      const Expected& x = e.*part.member;
      ASSERT_EQ(x.size(), part.member == &BackwardExpected::dq ? in.q.size() : in.k.size());
      Judgement j;
      EXPECT_TRUE(judge(part.name, x.allowed, x, &j)) << to_string(dtype);
      EXPECT_GT(j.allowed_element, 0.2 * u) << part.name << " " << to_string(dtype);
      EXPECT_LT(j.allowed_element, (dtype == DType::f32 ? 100 : 4) * u) << part.name << " " << to_string(dtype);
      EXPECT_TRUE(judge(part.name, x.exact, x)) << "the exact result passes";
    }
  }
}

// Rows that see no key (batch 1; batch 0 head 0 row 5, masked by the bias) and keys no row sees
// (batch 0 keys 31..39; all of batch 1): exact 0, scale 0, so judge() accepts nothing but 0.
TEST(BackwardExpected, NothingToleratedWhereNothingIsSeen) {
  const reference::Problem p = every_option();
  const Inputs in = inputs(p, DType::f16, 6);
  const BackwardExpected e = expected(p, in, DType::f16, true);
  const size_t d = size_t(p.head_dim);
  const auto expect_exact_zero = [&](const char* name, const Expected& x, size_t row) {
    for (size_t c = 0; c < d; ++c) {
      const size_t i = row * d + c;
      ASSERT_EQ(x.exact[i], 0.0) << name << " row " << row;
      ASSERT_EQ(x.allowed[i], 0.0) << name << " row " << row;
      ASSERT_EQ(x.scale[i], 0.0) << name << " row " << row;
    }
    std::vector<double> got = x.allowed;
    got[row * d] = 1e-30;
    EXPECT_FALSE(judge(name, got, x)) << name << " row " << row;
  };
  expect_exact_zero("dq", e.dq, 5);
  for (size_t row = size_t(p.heads) * p.seq_q; row < size_t(2) * p.heads * p.seq_q; ++row)
    expect_exact_zero("dq", e.dq, row);
  for (int kvh = 0; kvh < p.kv_heads; ++kvh)
    for (int j = 31; j < p.seq_k; ++j) {
      expect_exact_zero("dk", e.dk, size_t(kvh) * p.seq_k + j);
      expect_exact_zero("dv", e.dv, size_t(kvh) * p.seq_k + j);
    }
  for (size_t row = size_t(p.kv_heads) * p.seq_k; row < size_t(2) * p.kv_heads * p.seq_k; ++row) {
    expect_exact_zero("dk", e.dk, row);
    expect_exact_zero("dv", e.dv, row);
  }
}

// A kernel that reads the LSE a little off (P scaled by e^-delta, a few units of the dtype's
// rounding) fails on every gradient; so does one element off by a few of its own scales' roundings;
// a path that keeps P and dS in fp32 passes the rule of one that rounds them (judged loosely).
TEST(BackwardExpected, SmallKernelErrorsFailFp32IntermediatesPass) {
  const reference::Problem p = every_option();
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    const Inputs in = inputs(p, dtype, 7);
    const bool rounded = dtype != DType::f32;
    const BackwardExpected e = expected(p, in, dtype, rounded);
    // In fp32 the floor of fp32 arithmetic on scores of magnitude ~10 (softcap, ALiBi, bias) is
    // tens of roundings, so the errors planted there are larger in units of u (still ~1e-5).
    const double u = unit_roundoff(dtype) * (dtype == DType::f32 ? 32 : 1);

    Inputs off = in;
    for (double& l : off.lse) l += 6 * u;  // -inf stays -inf
    const BackwardExpected wrong = expected(p, off, dtype, rounded);
    const BackwardExpected fp32 = expected(p, in, dtype, false);
    for (const Part& part : kParts) {
      const Expected& x = e.*part.member;
      EXPECT_FALSE(judge(part.name, (wrong.*part.member).allowed, x)) << part.name << " " << to_string(dtype);
      EXPECT_TRUE(judge(part.name, (fp32.*part.member).allowed, x)) << part.name << " " << to_string(dtype);

      std::vector<double> got = x.allowed;
      size_t at = 0;  // the element of largest scale
      for (size_t i = 0; i < x.size(); ++i)
        if (x.scale[i] > x.scale[at]) at = i;
      got[at] += 16 * u * x.scale[at];
      EXPECT_FALSE(judge(part.name, got, x)) << part.name << " " << to_string(dtype) << ": one element off";
    }
  }
}

}  // namespace
}  // namespace selfattn::testing
