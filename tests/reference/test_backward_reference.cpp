// The backward reference judged by the forward reference: its gradients must equal central
// differences of L = sum(dout * out) (+ sum(dlse * lse) with an LSE gradient) computed with
// reference::attention, in fp64, for every option the backward honours. So the judge of every
// backward path is itself judged.
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "selfattn/reference.h"

namespace selfattn::reference {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Inputs {
  std::vector<double> q, k, v, dout;
  std::vector<double> dlse;  // [batch, heads, seq_q] or empty
};

Inputs random_inputs(const Problem& p, uint64_t seed, bool with_dlse = false) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  Inputs in;
  const size_t q_size = size_t(p.batch) * p.heads * p.seq_q * p.head_dim;
  const size_t k_size = size_t(p.batch) * p.kv_heads * p.seq_k * p.head_dim;
  const size_t v_size = size_t(p.batch) * p.kv_heads * p.seq_k * p.v_dim();
  const size_t out_size = size_t(p.batch) * p.heads * p.seq_q * p.v_dim();
  for (auto [vec, n] : {std::pair{&in.q, q_size}, {&in.k, k_size}, {&in.v, v_size}, {&in.dout, out_size}}) {
    vec->resize(n);
    for (double& x : *vec) x = normal(rng);
  }
  if (with_dlse) {
    in.dlse.resize(size_t(p.batch) * p.heads * p.seq_q);
    for (double& x : in.dlse) x = normal(rng);
  }
  return in;
}

double loss(const Problem& p, const Inputs& in) {
  const Result r = attention(p, in.q, in.k, in.v);
  double l = 0;
  for (size_t i = 0; i < r.out.size(); ++i) l += in.dout[i] * r.out[i];
  for (size_t i = 0; i < in.dlse.size(); ++i) {
    if (std::isfinite(r.lse[i])) l += in.dlse[i] * r.lse[i];  // a row without keys keeps lse -inf
  }
  return l;
}

// Every element of each input against the central difference (h = 1e-5: truncation ~1e-10,
// cancellation ~1e-11 at |L| ~ 1).
void expect_matches_finite_differences(const Problem& p, uint64_t seed, bool with_dlse = false) {
  Inputs in = random_inputs(p, seed, with_dlse);
  const Gradients g = attention_backward(p, in.q, in.k, in.v, in.dout, in.dlse);
  constexpr double h = 1e-5, h_step = h;
  const std::pair<const char*, std::pair<std::vector<double>*, const std::vector<double>*>> parts[] = {
      {"dq", {&in.q, &g.dq}}, {"dk", {&in.k, &g.dk}}, {"dv", {&in.v, &g.dv}}};
  for (const auto& [name, pair] : parts) {
    std::vector<double>& x = *pair.first;
    const std::vector<double>& analytic = *pair.second;
    ASSERT_EQ(x.size(), analytic.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const double saved = x[i];
      x[i] = saved + h;
      const double up = loss(p, in);
      x[i] = saved - h;
      const double down = loss(p, in);
      x[i] = saved;
      const double numeric = (up - down) / (2 * h);
      EXPECT_NEAR(analytic[i], numeric, 1e-6 * (1 + std::abs(numeric))) << name << "[" << i << "]";
    }
  }
  // Each head's sink logit, a parameter of the problem.
  ASSERT_EQ(g.dsinks.size(), p.sinks.size());
  for (size_t h = 0; h < p.sinks.size(); ++h) {
    Problem moved = p;
    moved.sinks[h] = p.sinks[h] + h_step;
    const double up = loss(moved, in);
    moved.sinks[h] = p.sinks[h] - h_step;
    const double down = loss(moved, in);
    const double numeric = (up - down) / (2 * h_step);
    EXPECT_NEAR(g.dsinks[h], numeric, 1e-6 * (1 + std::abs(numeric))) << "dsinks[" << h << "]";
  }
}

Problem base(int heads, int kv_heads, int seq_q, int seq_k, int head_dim) {
  Problem p;
  p.batch = 2;
  p.heads = heads;
  p.kv_heads = kv_heads;
  p.seq_q = seq_q;
  p.seq_k = seq_k;
  p.head_dim = head_dim;
  return p;
}

TEST(BackwardReference, FiniteDifferencesPlain) { expect_matches_finite_differences(base(2, 2, 5, 7, 3), 1); }

// v and out with a head dim of their own (head_dim_v), narrower and wider than q's and k's.
TEST(BackwardReference, FiniteDifferencesTwoHeadDims) {
  Problem narrow = base(4, 2, 5, 7, 5);
  narrow.head_dim_v = 3;
  narrow.causal = Causal::bottom_right;
  expect_matches_finite_differences(narrow, 8, /*with_dlse=*/true);
  Problem wide = base(2, 1, 6, 4, 2);
  wide.head_dim_v = 7;
  wide.sinks = {0.5, -kInf};
  expect_matches_finite_differences(wide, 9);
}

TEST(BackwardReference, FiniteDifferencesCausalBothAlignments) {
  for (Causal causal : {Causal::top_left, Causal::bottom_right}) {
    Problem p = base(1, 1, 6, 4, 3);  // seq_q > seq_k: bottom_right rows 0-1 see no key
    p.causal = causal;
    SCOPED_TRACE(to_string(causal));
    expect_matches_finite_differences(p, 2);
  }
}

TEST(BackwardReference, FiniteDifferencesGqaAndKeyLengths) {
  Problem p = base(4, 2, 4, 6, 2);
  p.key_lengths = {0, 4};  // batch 0 sees nothing: all its gradients are 0
  p.scale = 0.7;
  expect_matches_finite_differences(p, 3);
}

TEST(BackwardReference, FiniteDifferencesWindowSoftcapAlibiBias) {
  Problem p = base(2, 1, 5, 6, 3);
  p.causal = Causal::bottom_right;
  p.window_left = 2;
  p.window_right = 0;
  p.softcap = 1.5;
  p.alibi_slopes = {0.5, 0.25};
  std::mt19937_64 rng(9);
  std::normal_distribution<double> normal(0.0, 0.5);
  p.bias.resize(size_t(p.batch) * p.heads * p.seq_q * p.seq_k);
  for (double& b : p.bias) b = normal(rng);
  p.bias[3] = -kInf;       // a masked key
  for (int j = 0; j < p.seq_k; ++j) p.bias[size_t(2) * p.seq_k + j] = -kInf;  // a row with every key masked
  expect_matches_finite_differences(p, 4);
}

// A loss that uses the LSE too (a merge of partial results, a logsumexp term), with every option that
// moves it: key lengths (batch 0 sees nothing), a window, softcap and ALiBi.
TEST(BackwardReference, FiniteDifferencesThroughTheLse) {
  Problem p = base(2, 1, 5, 6, 3);
  p.key_lengths = {0, 6};
  p.causal = Causal::bottom_right;
  p.window_left = 3;
  p.softcap = 2.0;
  p.alibi_slopes = {0.5, 0.25};
  expect_matches_finite_differences(p, 7, true);
}

// Sinks with everything that moves the softmax beside them: rows without keys (their LSE is the
// sink's), a masked row, a window, softcap, GQA and the LSE's own gradient.
TEST(BackwardReference, FiniteDifferencesWithSinks) {
  Problem p = base(4, 2, 5, 6, 3);
  p.key_lengths = {0, 6};
  p.causal = Causal::bottom_right;
  p.window_left = 2;
  p.softcap = 2.0;
  p.sinks = {0.3, -1.2, 2.5, -kInf};  // the last head has none: its gradient is 0
  expect_matches_finite_differences(p, 8, false);
  expect_matches_finite_differences(p, 9, true);
}

TEST(BackwardReference, ExactZerosWhereNothingIsSeen) {
  Problem p = base(1, 1, 4, 3, 2);
  p.causal = Causal::bottom_right;  // rows 0 and 1... row 0 sees no key (0 + 1 + 3 - 4 = 0)
  p.key_lengths = {3, 2};           // batch 1: key 2 is padding
  const Inputs in = random_inputs(p, 5);
  const Gradients g = attention_backward(p, in.q, in.k, in.v, in.dout);
  for (int b = 0; b < 2; ++b)
    for (int e = 0; e < p.head_dim; ++e) EXPECT_EQ(g.dq[(size_t(b) * p.seq_q + 0) * p.head_dim + e], 0.0);
  for (int e = 0; e < p.head_dim; ++e) {
    EXPECT_EQ(g.dk[(size_t(1) * p.seq_k + 2) * p.head_dim + e], 0.0);
    EXPECT_EQ(g.dv[(size_t(1) * p.seq_k + 2) * p.head_dim + e], 0.0);
  }
  for (double x : g.dq) EXPECT_TRUE(std::isfinite(x));
}

// D_i = sum_c dout_ic out_ic (what every path computes) equals sum_j P_ij dP_ij (the derivation's
// form): the row term of dS is the same either way.
TEST(BackwardReference, RowTermIdentity) {
  Problem p = base(1, 1, 3, 5, 4);
  const Inputs in = random_inputs(p, 6);
  const Result r = attention(p, in.q, in.k, in.v);
  const double scale = 1.0 / std::sqrt(double(p.head_dim));
  for (int b = 0; b < p.batch; ++b)
    for (int i = 0; i < p.seq_q; ++i) {
      const size_t row = size_t(b) * p.seq_q + i;
      double via_out = 0;
      for (int e = 0; e < p.head_dim; ++e) via_out += in.dout[row * p.head_dim + e] * r.out[row * p.head_dim + e];
      double via_p = 0;
      for (int j = 0; j < p.seq_k; ++j) {
        double dot = 0, dp = 0;
        for (int e = 0; e < p.head_dim; ++e) {
          dot += in.q[row * p.head_dim + e] * in.k[(size_t(b) * p.seq_k + j) * p.head_dim + e];
          dp += in.dout[row * p.head_dim + e] * in.v[(size_t(b) * p.seq_k + j) * p.head_dim + e];
        }
        via_p += std::exp(scale * dot - r.lse[row]) * dp;
      }
      EXPECT_NEAR(via_out, via_p, 1e-12 * (1 + std::abs(via_p)));
    }
}

}  // namespace
}  // namespace selfattn::reference
