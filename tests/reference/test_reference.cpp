// The CPU reference (selfattn/reference.h) against values computed by hand. Each case is small
// enough to check with pencil and paper; the comment beside it shows the arithmetic.
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "selfattn/error.h"
#include "selfattn/reference.h"

namespace selfattn::reference {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

Problem problem(int seq_q, int seq_k, int head_dim, double scale = 0) {
  Problem p;
  p.seq_q = seq_q;
  p.seq_k = seq_k;
  p.head_dim = head_dim;
  p.scale = scale;
  return p;
}

TEST(VisibleKeys, FollowsTheDocumentedMask) {
  // none: every key of the batch's key length.
  EXPECT_EQ(visible_keys(0, 2, 3, Causal::none), 3);
  // top_left: row i sees keys 0..i.
  EXPECT_EQ(visible_keys(0, 2, 3, Causal::top_left), 1);
  EXPECT_EQ(visible_keys(1, 2, 3, Causal::top_left), 2);
  EXPECT_EQ(visible_keys(5, 8, 3, Causal::top_left), 3);  // clamped to len_k
  // bottom_right: row i sees keys 0..i + (len_k - seq_q); the last row sees all of them.
  EXPECT_EQ(visible_keys(0, 2, 3, Causal::bottom_right), 2);
  EXPECT_EQ(visible_keys(1, 2, 3, Causal::bottom_right), 3);
  // More queries than keys: the first rows see nothing (row 0 of 3 with 1 key: 0 + 1 + (1 - 3) = -1 -> 0).
  EXPECT_EQ(visible_keys(0, 3, 1, Causal::bottom_right), 0);
  EXPECT_EQ(visible_keys(1, 3, 1, Causal::bottom_right), 0);
  EXPECT_EQ(visible_keys(2, 3, 1, Causal::bottom_right), 1);
  // The two alignments agree when seq_q == len_k.
  for (int row = 0; row < 7; ++row) {
    EXPECT_EQ(visible_keys(row, 7, 7, Causal::top_left), visible_keys(row, 7, 7, Causal::bottom_right));
  }
  // No keys at all.
  EXPECT_EQ(visible_keys(0, 1, 0, Causal::none), 0);
}

TEST(Reference, OneKeyCopiesItsValue) {
  // softmax over one score is 1, so out = v; lse = the score itself = 0.5 * (2 * 3) = 3.
  const Result r = attention(problem(1, 1, 1, 0.5), {2.0}, {3.0}, {-7.25});
  EXPECT_DOUBLE_EQ(r.out[0], -7.25);
  EXPECT_DOUBLE_EQ(r.lse[0], 3.0);
}

TEST(Reference, TwoKeysByHand) {
  // q = 1, keys 0 and ln 3, scale 1: scores 0 and ln 3, exp: 1 and 3, weights 1/4 and 3/4.
  // out = 1/4 * 4 + 3/4 * 8 = 7; lse = ln(1 + 3) = ln 4.
  const Result r = attention(problem(1, 2, 1, 1.0), {1.0}, {0.0, std::log(3.0)}, {4.0, 8.0});
  EXPECT_NEAR(r.out[0], 7.0, 1e-14);
  EXPECT_NEAR(r.lse[0], std::log(4.0), 1e-14);
}

TEST(Reference, DefaultScaleIsOneOverSqrtHeadDim) {
  // head_dim 4: scale 1/2. q = k0 = [1,1,1,1] gives q.k0 = 4 -> score 2; k1 = 0 gives score 0.
  // weights e^2/(e^2+1) and 1/(e^2+1); values 1 and 0 -> out[0] = e^2/(e^2+1).
  const std::vector<double> q{1, 1, 1, 1}, k{1, 1, 1, 1, 0, 0, 0, 0}, v{1, 0, 0, 0, 0, 0, 0, 0};
  const Result r = attention(problem(1, 2, 4), q, k, v);
  const double e2 = std::exp(2.0);
  EXPECT_NEAR(r.out[0], e2 / (e2 + 1), 1e-14);
  EXPECT_NEAR(r.lse[0], std::log(e2 + 1), 1e-14);
  for (int d = 1; d < 4; ++d) EXPECT_EQ(r.out[d], 0.0);
}

TEST(Reference, CausalAlignments) {
  // q = 0: all scores 0, so each row averages the values it sees. v = 1, 10, 100.
  Problem p = problem(2, 3, 1, 1.0);
  const std::vector<double> q{0, 0}, k{5, 6, 7}, v{1, 10, 100};
  p.causal = Causal::top_left;  // row 0 sees {1}, row 1 sees {1, 10}
  Result r = attention(p, q, k, v);
  EXPECT_NEAR(r.out[0], 1.0, 1e-14);
  EXPECT_NEAR(r.out[1], 5.5, 1e-14);
  EXPECT_NEAR(r.lse[1], std::log(2.0), 1e-14);
  p.causal = Causal::bottom_right;  // row 0 sees {1, 10}, row 1 sees all three: 111 / 3 = 37
  r = attention(p, q, k, v);
  EXPECT_NEAR(r.out[0], 5.5, 1e-14);
  EXPECT_NEAR(r.out[1], 37.0, 1e-13);
  EXPECT_NEAR(r.lse[1], std::log(3.0), 1e-14);
}

TEST(Reference, FullyMaskedRowsAreZeroWithMinusInfinityLse) {
  // bottom_right with 3 queries and 1 key: rows 0 and 1 see no key.
  Problem p = problem(3, 1, 2, 1.0);
  p.causal = Causal::bottom_right;
  const Result r = attention(p, {1, 2, 3, 4, 5, 6}, {1, 1}, {9, -9});
  EXPECT_EQ(r.out[0], 0.0);
  EXPECT_EQ(r.out[3], 0.0);
  EXPECT_EQ(r.lse[0], -kInf);
  EXPECT_EQ(r.lse[1], -kInf);
  EXPECT_EQ(r.out[4], 9.0);  // row 2 sees its one key: out = v
  EXPECT_EQ(r.out[5], -9.0);
  EXPECT_NEAR(r.lse[2], 11.0, 1e-14);  // 5 * 1 + 6 * 1
}

TEST(Reference, KeyLengthsPadEachBatch) {
  // Batch 0 has key length 0: out 0, lse -inf. Batch 1 uses 2 of 3 keys, q = 0: mean of 2 and 4.
  // A length above seq_k is clamped to seq_k (batch 2: mean of 1, 2, 3), a negative one to 0.
  Problem p = problem(1, 3, 1, 1.0);
  p.batch = 4;
  p.key_lengths = {0, 2, 99, -5};
  const std::vector<double> q(4, 0.0), k(12, 1.0), v{7, 7, 7, 2, 4, 1000, 1, 2, 3, 5, 5, 5};
  const Result r = attention(p, q, k, v);
  EXPECT_EQ(r.out[0], 0.0);
  EXPECT_EQ(r.lse[0], -kInf);
  EXPECT_NEAR(r.out[1], 3.0, 1e-14);
  EXPECT_NEAR(r.out[2], 2.0, 1e-14);
  EXPECT_EQ(r.out[3], 0.0);
  EXPECT_EQ(r.lse[3], -kInf);
}

TEST(Reference, GroupedQueryHeadsShareKvHeads) {
  // 4 query heads, 2 kv heads: heads 0,1 read kv head 0 (value 3), heads 2,3 kv head 1 (value -1).
  Problem p = problem(1, 1, 1, 1.0);
  p.heads = 4;
  p.kv_heads = 2;
  const Result r = attention(p, {1, 2, 3, 4}, {0.5, 0.25}, {3, -1});
  EXPECT_EQ(r.out, (std::vector<double>{3, 3, -1, -1}));
  // lse = the single score: q * k of the shared head.
  EXPECT_NEAR(r.lse[0], 0.5, 1e-15);
  EXPECT_NEAR(r.lse[1], 1.0, 1e-15);
  EXPECT_NEAR(r.lse[2], 0.75, 1e-15);
  EXPECT_NEAR(r.lse[3], 1.0, 1e-15);
}

TEST(Reference, LargeScoresStayFinite) {
  // Scores around 1e4 overflow exp() unless the row maximum is subtracted first.
  // Scores 10000 and 10000 - ln 3: weights 3/4 and 1/4.
  const Result r = attention(problem(1, 2, 1, 1.0), {1.0}, {10000.0, 10000.0 - std::log(3.0)}, {0.0, 4.0});
  EXPECT_NEAR(r.out[0], 1.0, 1e-9);
  EXPECT_NEAR(r.lse[0], 10000.0 + std::log(4.0 / 3.0), 1e-9);
}

TEST(Reference, ZeroSizes) {
  Problem p = problem(0, 3, 2);
  EXPECT_TRUE(attention(p, {}, std::vector<double>(6, 1.0), std::vector<double>(6, 1.0)).out.empty());
  p = problem(2, 0, 2);  // no keys: zero rows, lse -inf
  const Result r = attention(p, {1, 2, 3, 4}, {}, {});
  EXPECT_EQ(r.out, std::vector<double>(4, 0.0));
  EXPECT_EQ(r.lse, std::vector<double>(2, -kInf));
}

TEST(Reference, RejectsInconsistentArguments) {
  EXPECT_THROW(attention(problem(1, 2, 1), {1.0}, {1.0}, {1.0, 2.0}), InvalidArgument);
  Problem p = problem(1, 1, 1);
  p.heads = 3;
  p.kv_heads = 2;
  EXPECT_THROW(attention(p, {1, 1, 1}, {1, 1}, {1, 1}), InvalidArgument);
  p = problem(1, 1, 1);
  p.key_lengths = {1, 1};
  EXPECT_THROW(attention(p, {1.0}, {1.0}, {1.0}), InvalidArgument);
  p = problem(1, 2, 1);
  p.head_dim_v = 2;  // v: 2 keys x 2 columns
  EXPECT_THROW(attention(p, {1.0}, {1.0, 2.0}, {1.0, 2.0}), InvalidArgument);
  EXPECT_NO_THROW(attention(p, {1.0}, {1.0, 2.0}, {1.0, 2.0, 3.0, 4.0}));
}

// The seed document's worked example: tokens 动物, 马路, 它 (rows 1, 5 and 7 of its X), d_k = 2.
// head_dim_v apart from head_dim, derived from problems of one head dim: zero columns change no
// dot product, so v zero-padded to q's width (or q and k to v's, the scale kept at 1/sqrt(d_qk))
// gives the same softmax, and out's first head_dim_v columns are the two-head-dim result.
TEST(Reference, TwoHeadDimsAgreeWithZeroPaddedOnes) {
  auto padded = [](const std::vector<double>& x, size_t rows, size_t from, size_t to) {
    std::vector<double> y(rows * to, 0.0);
    for (size_t r = 0; r < rows; ++r)
      for (size_t e = 0; e < from; ++e) y[r * to + e] = x[r * from + e];
    return y;
  };
  for (const auto& [d_qk, d_v] : {std::pair{5, 3}, std::pair{2, 7}, std::pair{4, 1}}) {
    Problem p;
    p.batch = 2;
    p.heads = 4;
    p.kv_heads = 2;
    p.seq_q = 3;
    p.seq_k = 6;
    p.head_dim = d_qk;
    p.head_dim_v = d_v;
    p.causal = Causal::top_left;
    p.key_lengths = {6, 4};
    const size_t q_rows = size_t(p.batch) * p.heads * p.seq_q, kv_rows = size_t(p.batch) * p.kv_heads * p.seq_k;
    std::vector<double> q(q_rows * d_qk), k(kv_rows * d_qk), v(kv_rows * d_v);
    for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.7 * double(i));
    for (size_t i = 0; i < k.size(); ++i) k[i] = std::cos(1.3 * double(i));
    for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.3 * double(i) + 1);
    const Result two = attention(p, q, k, v);
    ASSERT_EQ(two.out.size(), q_rows * d_v);

    const int d = std::max(d_qk, d_v);
    Problem one = p;
    one.head_dim = d;
    one.head_dim_v = 0;
    one.scale = 1.0 / std::sqrt(double(d_qk));
    const Result same = attention(one, padded(q, q_rows, d_qk, d), padded(k, kv_rows, d_qk, d),
                                  padded(v, kv_rows, d_v, d));
    for (size_t r = 0; r < q_rows; ++r) {
      EXPECT_NEAR(two.lse[r], same.lse[r], 1e-12) << "row " << r;
      for (int e = 0; e < d_v; ++e)
        EXPECT_NEAR(two.out[r * d_v + e], same.out[r * d + e], 1e-12) << "row " << r << " column " << e;
    }
  }
}

TEST(Reference, SeedWorkedExample) {
  const double x[3][4] = {{0.55, 0.20, -0.11, 0.44}, {0.62, -0.10, 0.24, -0.31}, {0.19, -0.37, 0.28, 0.06}};
  const double wq[4][2] = {{1, 0}, {0, 1}, {1, 1}, {0, -1}};
  const double wk[4][2] = {{0.5, 0}, {0, 0.5}, {0.5, 0.5}, {0, -0.5}};
  const double wv[4][2] = {{0.1, 0.2}, {0.2, 0.1}, {-0.1, 0.3}, {0.3, -0.2}};
  std::vector<double> q(6), k(6), v(6);
  for (int t = 0; t < 3; ++t)
    for (int j = 0; j < 2; ++j)
      for (int i = 0; i < 4; ++i) {
        q[t * 2 + j] += x[t][i] * wq[i][j];
        k[t * 2 + j] += x[t][i] * wk[i][j];
        v[t * 2 + j] += x[t][i] * wv[i][j];
      }
  // The document prints Q 它 = [0.47, -0.15], K 马路 = [0.43, 0.225], V 动物 = [0.238, 0.009].
  EXPECT_NEAR(q[4], 0.47, 1e-12);
  EXPECT_NEAR(q[5], -0.15, 1e-12);
  EXPECT_NEAR(k[2], 0.43, 1e-12);
  EXPECT_NEAR(k[3], 0.225, 1e-12);
  EXPECT_NEAR(v[0], 0.238, 1e-12);
  EXPECT_NEAR(v[1], 0.009, 1e-12);

  const Result r = attention(problem(3, 3, 2), q, k, v);
  // Query 它 (row 2): scores 0.12965, 0.16835, 0.1217; scaled by 1/sqrt(2): 0.0917, 0.1190, 0.0861.
  // Weights round to 0.331, 0.340, 0.329; output is 0.0319 exactly (the document prints 0.031, having
  // rounded the weights first) and 0.111.
  const double s = 1 / std::sqrt(2.0);
  const double scaled[3] = {0.12965 * s, 0.16835 * s, 0.1217 * s};
  const double denominator = std::exp(scaled[0]) + std::exp(scaled[1]) + std::exp(scaled[2]);
  EXPECT_NEAR(std::exp(r.lse[2]), denominator, 1e-12);
  // The document's denominator sums exp of the rounded scaled scores [0.092, 0.119, 0.086].
  EXPECT_NEAR(std::exp(r.lse[2]), 3.3125069954097492, 5e-4);  // exact: 3.31229
  const double printed_weights[3] = {0.331, 0.340, 0.329};
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(std::exp(scaled[j]) / denominator, printed_weights[j], 5e-4);
  EXPECT_NEAR(r.out[4], 0.0319, 5e-5);
  EXPECT_NEAR(r.out[5], 0.111, 5e-4);
}

}  // namespace
}  // namespace selfattn::reference
