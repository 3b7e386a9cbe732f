// attention_probabilities() and its varlen form: the softmax weights attention() forms, written out
// (FlashAttention's S_dmask), with dropout's signs. Each case against the double reference's
// weights (reference::attention_probabilities) signed by the library's keep mask
// (reference::dropout_keep_mask), so a wrong mask bit or a weight of the wrong key fails by a whole
// probability: fresh random inputs in each tensor's own layout, probs poisoned (NaN) before the
// call, odd and round sizes, every mask and modifier, sinks, key_start and q_offset, a workspace
// small enough to chunk the rows. Then that the signs are attention()'s own dropout (out rebuilt
// from them), the varlen slices (entries no sequence owns are 0), and the argument errors with
// nothing written.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "harness_tensors.h"
#include "score_mods_fixture.h"
#include "selfattn/selfattn.h"
#include "test_helpers.h"

namespace selfattn {
namespace {

using testing::AttentionCase;
using testing::Role;
using namespace testing::harness;

// The kernels compute P in fp32 from the inputs the reference takes exactly: the scores' and the
// exponential's rounding give a relative error of a few 1e-6 at these sizes (|s| < 100, head_dim
// <= 128); 1e-4 is 10x that, and a wrong key, mask bit or sign is off by the whole weight.
constexpr double kRelative = 1e-4;
constexpr double kAbsolute = 1e-30;  // fp32 denormals at the bottom of a row's range

// The expected probs of a problem: the reference's weights, negated where dropout drops a seen key.
std::vector<double> expected_probs(const reference::Problem& problem, const std::vector<double>& q,
                                   const std::vector<double>& k, double dropout_p, uint64_t seed, uint64_t offset,
                                   int first_batch = 0) {
  reference::Problem without_dropout = problem;
  without_dropout.dropout_p = 0;
  without_dropout.dropout_keep.clear();
  std::vector<double> probs = reference::attention_probabilities(without_dropout, q, k);
  if (dropout_p == 0) return probs;
  const std::vector<uint8_t> keep = reference::dropout_keep_mask(
      dropout_p, seed, offset, problem.batch, problem.heads, problem.seq_q, problem.seq_k, first_batch);
  for (int b = 0; b < problem.batch; ++b)
    for (int i = 0; i < problem.seq_q; ++i)
      for (int h = 0; h < problem.heads; ++h) {
        const size_t row = (size_t(b) * problem.heads + h) * problem.seq_q + i;
        const reference::KeyRange seen = reference::row_keys(problem, b, i).keys;
        for (int j = seen.begin; j < seen.end; ++j)
          if (!keep[row * problem.seq_k + j]) probs[row * problem.seq_k + j] = -probs[row * problem.seq_k + j];
      }
  return probs;
}

// Every element written (no NaN), with the expected sign bit, within the bound of the expected value.
::testing::AssertionResult matches(const std::string& name, const std::vector<float>& got,
                                   const std::vector<double>& expected) {
  if (got.size() != expected.size()) return ::testing::AssertionFailure() << name << ": sizes differ";
  for (size_t e = 0; e < got.size(); ++e) {
    const double want = expected[e], have = got[e];
    const bool sign_ok = std::signbit(have) == std::signbit(want);
    if (std::isnan(have) || !sign_ok || std::abs(have - want) > kRelative * std::abs(want) + kAbsolute) {
      return ::testing::AssertionFailure() << name << ": element " << e << " is " << have << ", expected " << want;
    }
  }
  return ::testing::AssertionSuccess();
}

struct DenseCall {
  Operand q, k, v;
  DeviceBuffer<int32_t> key_lengths, key_start, q_offset;
  testing::ScoreModsData mods;
  AttentionOptions options;
  reference::Problem problem;
};

DenseCall make_call(Context& ctx, const AttentionCase& c, std::mt19937_64& rng) {
  DenseCall call{make_operand(ctx, c, Role::q, c.heads, c.seq_q, rng, "test q"),
                 make_operand(ctx, c, Role::k, c.kv_heads, c.seq_k, rng, "test k", c.keys, true),
                 make_operand(ctx, c, Role::v, c.kv_heads, c.seq_k, rng, "test v", testing::Keys::random, true),
                 {}, {}, {}, {}, {}, {}};
  call.options.path = c.path;
  call.options.causal = c.causal;
  call.options.scale = c.scale;
  call.options.key_lengths = upload_ints(ctx, call.key_lengths, c.key_lengths, "test key_lengths");
  call.options.key_start = upload_ints(ctx, call.key_start, c.key_start, "test key_start");
  call.options.q_offset = upload_ints(ctx, call.q_offset, c.q_offset, "test q_offset");
  reference::Problem& p = call.problem;
  p.batch = c.batch, p.heads = c.heads, p.kv_heads = c.kv_heads, p.seq_q = c.seq_q, p.seq_k = c.seq_k;
  p.head_dim = c.head_dim, p.causal = c.causal, p.scale = c.scale ? double(*c.scale) : 0.0;
  p.key_lengths = c.key_lengths, p.key_start = c.key_start, p.q_offset = c.q_offset;
  if (c.mods.any()) {
    call.mods = testing::make_score_mods(ctx, c.mods, c.dtype, c.batch, c.heads, c.seq_q, c.seq_k, rng);
    call.mods.apply(c.mods, call.options);
    call.mods.apply(c.mods, p);
  }
  return call;
}

::testing::AssertionResult check_probabilities(Context& ctx, const AttentionCase& c) {
  std::mt19937_64 rng(testing::input_seed(c));
  DenseCall call = make_call(ctx, c, rng);
  const size_t count = size_t(c.batch) * c.heads * c.seq_q * c.seq_k;
  DeviceBuffer<float> probs(ctx, std::max<size_t>(count, 1), "test probs");
  probs.fill_bytes(0xFF);  // NaN: an element left unwritten cannot pass
  try {
    attention_probabilities(ctx, call.q.tensor.view, call.k.tensor.view, call.v.tensor.view,
                            TensorView::bhsd(probs.data(), DType::f32, c.batch, c.heads, c.seq_q, c.seq_k),
                            call.options);
    ctx.synchronize();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << c.name() << ": attention_probabilities threw: " << e.what();
  }
  std::vector<float> got = probs.to_host();
  got.resize(count);
  return matches(c.name(), got,
                 expected_probs(call.problem, call.q.logical, call.k.logical, c.mods.dropout_p, c.mods.dropout_seed,
                                c.mods.dropout_offset));
}

void expect_all(Context& ctx, const std::vector<AttentionCase>& cases) {
  for (const AttentionCase& c : cases) EXPECT_TRUE(check_probabilities(ctx, c));
}

class Probabilities : public ScoreMods {};

ScoreModsCase dropped(ScoreModsCase m, float p, uint64_t seed, uint64_t offset = 0) {
  m.dropout_p = p;
  m.dropout_seed = seed;
  m.dropout_offset = offset;
  return m;
}

TEST_P(Probabilities, ShapesAndCausalModes) {
  Context ctx;
  expect_all(ctx, {
      make(DType::f32, 1, 1, 1, 1, 1, 1, none),
      make(DType::f32, 1, 2, 1, 113, 203, 7, none),
      make(DType::f16, 2, 4, 2, 7, 113, 64, bottom_right, {113, 40}),
      make(DType::bf16, 1, 2, 2, 64, 64, 128, top_left, {}, Layout::bshd),
      make(DType::f32, 2, 3, 1, 33, 1000, 16, bottom_right, {0, 999}),
  });
}

TEST_P(Probabilities, ModifiersSinksAndOffsets) {
  Context ctx;
  ScoreModsCase all = every_modifier();
  all.sinks = true;
  AttentionCase offsets = make(DType::f16, 2, 2, 1, 7, 113, 32, bottom_right, {113, 90});
  offsets.key_start = {3, 50};
  offsets.q_offset = {0, 30};
  expect_all(ctx, {
      with(make(DType::f32, 2, 4, 2, 70, 113, 16, bottom_right, {113, 60}), all),
      with(make(DType::bf16, 1, 2, 1, 113, 203, 32, none), window(16, 8)),
      with(offsets, window(20, 2)),
  });
}

TEST_P(Probabilities, DropoutSigns) {
  Context ctx;
  ScoreModsCase all = every_modifier();
  all.sinks = true;
  expect_all(ctx, {
      with(make(DType::f32, 1, 2, 1, 113, 203, 7, none), dropped({}, 0.3f, 1234)),
      with(make(DType::f16, 2, 4, 2, 7, 113, 64, top_left), dropped({}, 0.17f, 5, 1u << 20)),
      with(make(DType::f32, 2, 2, 2, 70, 113, 16, bottom_right, {113, 60}), dropped(all, 0.5f, 9, 3)),
      with(make(DType::bf16, 1, 1, 1, 1, 7, 32, none), dropped(window(2, 1), 0.9f, 11)),
  });
}

// The rows in chunks (a small workspace): each chunk's P lands at its rows and heads.
TEST_P(Probabilities, ChunkedByWorkspaceLimit) {
  Context ctx;
  ctx.set_workspace_limit(10 * 1024);  // about 20 rows of 113 keys a chunk
  expect_all(ctx, {
      with(make(DType::f32, 1, 2, 1, 113, 113, 16, top_left), dropped({}, 0.3f, 31)),
      make(DType::f16, 2, 3, 3, 70, 113, 32, none),
  });
}

INSTANTIATE_TEST_SUITE_P(Naive, Probabilities, ::testing::Values(Path::naive, Path::automatic),
                         [](const auto& info) { return std::string(to_string(info.param)); });

// The signs are attention()'s own dropout: out rebuilt from them, sum over kept keys of P / (1 - p)
// v_j, equals attention()'s out on the naive path.
TEST(ProbabilitiesAgree, WithTheForwardsDropout) {
  Context ctx;
  AttentionCase c = testing::make_case(DType::f32, 2, 2, 1, 37, 70, 16, Causal::bottom_right);
  std::mt19937_64 rng(testing::input_seed(c));
  DenseCall call = make_call(ctx, c, rng);
  call.options.path = Path::naive;
  call.options.dropout_p = 0.25f;
  call.options.dropout_seed = 77;
  call.options.dropout_offset = 6;
  DeviceBuffer<float> probs(ctx, size_t(c.batch) * c.heads * c.seq_q * c.seq_k, "test probs");
  DeviceBuffer<float> out(ctx, size_t(c.batch) * c.heads * c.seq_q * c.head_dim, "test out");
  attention_probabilities(ctx, call.q.tensor.view, call.k.tensor.view, call.v.tensor.view,
                          TensorView::bhsd(probs.data(), DType::f32, c.batch, c.heads, c.seq_q, c.seq_k), call.options);
  attention(ctx, call.q.tensor.view, call.k.tensor.view, call.v.tensor.view,
            TensorView::bhsd(out.data(), DType::f32, c.batch, c.heads, c.seq_q, c.head_dim), call.options);
  const std::vector<float> p = probs.to_host(), o = out.to_host();
  int dropped = 0;
  for (int b = 0; b < c.batch; ++b)
    for (int h = 0; h < c.heads; ++h)
      for (int i = 0; i < c.seq_q; ++i)
        for (int e = 0; e < c.head_dim; ++e) {
          const size_t row = (size_t(b) * c.heads + h) * c.seq_q + i;
          double sum = 0, magnitude = 0;
          for (int j = 0; j < c.seq_k; ++j) {
            const float w = p[row * c.seq_k + j];
            if (std::signbit(w)) {
              ++dropped;
              continue;
            }
            const double term = w / (1 - 0.25) * call.v.logical[((size_t(b) * c.kv_heads + h / 2) * c.seq_k + j) * c.head_dim + e];
            sum += term;
            magnitude += std::abs(term);
          }
          const double got = o[row * c.head_dim + e];
          ASSERT_LE(std::abs(got - sum), 1e-5 * magnitude + 1e-30) << "row " << row << " element " << e;
        }
  EXPECT_GT(dropped, 0);
}

// Varlen: sequence b's weights in its [max_q, max_k] slice, its own mask (b the sequence), the
// entries no sequence owns 0; f32 packed [1, heads, total, head_dim], q bshd and k, v bhsd.
TEST(ProbabilitiesVarlen, EachSequenceInItsSlice) {
  Context ctx;
  const std::vector<int> len_q = {7, 0, 1, 33}, len_k = {113, 5, 0, 40};
  const int heads = 2, kv_heads = 1, d = 16, batch = int(len_q.size()), max_q = 33, max_k = 113;
  std::vector<int32_t> cu_q{0}, cu_k{0};
  for (int b = 0; b < batch; ++b) cu_q.push_back(cu_q.back() + len_q[b]), cu_k.push_back(cu_k.back() + len_k[b]);
  const int total_q = cu_q.back(), total_k = cu_k.back();
  std::mt19937_64 rng(testing::input_seed("ProbabilitiesVarlen"));
  std::normal_distribution<float> normal;
  std::vector<float> q(size_t(total_q) * heads * d), k(size_t(total_k) * kv_heads * d), v(k.size());
  for (float* data : {q.data(), k.data(), v.data()})
    for (size_t e = 0; e < (data == q.data() ? q.size() : k.size()); ++e) data[e] = normal(rng);
  DeviceBuffer<float> dq(ctx, q.size(), "q"), dk(ctx, k.size(), "k"), dv(ctx, v.size(), "v");
  dq.copy_from_host(q), dk.copy_from_host(k), dv.copy_from_host(v);
  DeviceBuffer<int32_t> dcu_q(ctx, cu_q.size(), "cu_q"), dcu_k(ctx, cu_k.size(), "cu_k");
  dcu_q.copy_from_host(cu_q), dcu_k.copy_from_host(cu_k);
  DeviceBuffer<float> probs(ctx, size_t(batch) * heads * max_q * max_k, "probs");
  probs.fill_bytes(0xFF);
  AttentionOptions options;
  options.causal = Causal::bottom_right;
  options.window_left = 30;
  options.softcap = 5.0f;
  options.dropout_p = 0.3f;
  options.dropout_seed = 4;
  const TensorView q_view = TensorView::bshd(dq.data(), DType::f32, 1, heads, total_q, d);
  attention_probabilities_varlen(ctx, q_view, TensorView::bhsd(dk.data(), DType::f32, 1, kv_heads, total_k, d),
                                 TensorView::bhsd(dv.data(), DType::f32, 1, kv_heads, total_k, d),
                                 TensorView::bhsd(probs.data(), DType::f32, batch, heads, max_q, max_k), dcu_q.data(),
                                 dcu_k.data(), batch, max_q, max_k, options);
  const std::vector<float> got = probs.to_host();
  for (int b = 0; b < batch; ++b) {
    reference::Problem p;
    p.batch = 1, p.heads = heads, p.kv_heads = kv_heads, p.seq_q = len_q[b], p.seq_k = len_k[b], p.head_dim = d;
    p.causal = options.causal, p.window_left = 30, p.softcap = 5.0;
    std::vector<double> sq(size_t(heads) * len_q[b] * d), sk(size_t(kv_heads) * len_k[b] * d);
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < len_q[b]; ++i)
        for (int e = 0; e < d; ++e) sq[(size_t(h) * len_q[b] + i) * d + e] = q[((cu_q[b] + i) * size_t(heads) + h) * d + e];
    for (int j = 0; j < len_k[b]; ++j)
      for (int e = 0; e < d; ++e) sk[size_t(j) * d + e] = k[(cu_k[b] + size_t(j)) * d + e];
    const std::vector<double> want = expected_probs(p, sq, sk, 0.3, 4, 0, b);
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < max_q; ++i)
        for (int j = 0; j < max_k; ++j) {
          const float have = got[((size_t(b) * heads + h) * max_q + i) * max_k + j];
          const bool owned = i < len_q[b] && j < len_k[b];
          const double expected = owned ? want[(size_t(h) * len_q[b] + i) * len_k[b] + j] : 0.0;
          ASSERT_TRUE(matches("sequence " + std::to_string(b), {have}, {expected}))
              << "head " << h << " row " << i << " key " << j;
        }
  }
}

// Argument errors: each refused naming the argument, probs untouched.
TEST(ProbabilitiesArguments, RefusedWithNothingWritten) {
  using host_test::throws_with;
  Context ctx;
  const int b = 1, h = 2, s_q = 7, s_k = 9, d = 8;
  DeviceBuffer<float> q(ctx, size_t(b) * h * s_q * d), k(ctx, size_t(b) * h * s_k * d), v(ctx, k.size());
  q.fill_bytes(0), k.fill_bytes(0), v.fill_bytes(0);
  DeviceBuffer<float> probs(ctx, size_t(b) * h * s_q * s_k + 64);
  DeviceBuffer<float> lse(ctx, size_t(b) * h * s_q);
  probs.fill_bytes(host_test::kPoison);
  const TensorView qv = TensorView::bhsd(q.data(), DType::f32, b, h, s_q, d);
  const TensorView kv = TensorView::bhsd(k.data(), DType::f32, b, h, s_k, d);
  const TensorView vv = TensorView::bhsd(v.data(), DType::f32, b, h, s_k, d);
  const TensorView good = TensorView::bhsd(probs.data(), DType::f32, b, h, s_q, s_k);
  const auto call = [&](const TensorView& p, const AttentionOptions& o = {}) {
    return [&, p, o] { attention_probabilities(ctx, qv, kv, vv, p, o); };
  };
  EXPECT_TRUE(throws_with<InvalidArgument>(call(TensorView::bhsd(probs.data(), DType::f32, b, h, s_q, s_k + 1)),
                                           {"attention_probabilities", "probs.shape[3]", "seq_k"}));
  EXPECT_TRUE(throws_with<InvalidArgument>(call(TensorView::bhsd(probs.data(), DType::f16, b, h, s_q, s_k)),
                                           {"probs.dtype expected f32"}));
  EXPECT_TRUE(throws_with<InvalidArgument>(call(TensorView::bshd(probs.data(), DType::f32, b, h, s_q, s_k)),
                                           {"probs expected contiguous"}));
  EXPECT_TRUE(throws_with<InvalidArgument>(call(TensorView::bhsd(k.data(), DType::f32, b, h, 1, 1)),
                                           {"probs.shape[2]"}));
  EXPECT_TRUE(throws_with<InvalidArgument>(call(TensorView::bhsd(k.data(), DType::f32, b, h, s_q, s_k)),
                                           {"probs", "overlap", "k"}));
  AttentionOptions with_lse;
  with_lse.lse = lse.data();
  EXPECT_TRUE(throws_with<InvalidArgument>(call(good, with_lse), {"options.lse expected null"}));
  AttentionOptions fused;
  fused.path = Path::fused;
  EXPECT_TRUE(throws_with<NotAvailable>(call(good, fused), {"path fused", "naive"}));
  AttentionOptions bad_window;
  bad_window.window_left = -5;
  EXPECT_TRUE(throws_with<InvalidArgument>(call(good, bad_window), {"window"}));
  EXPECT_TRUE(host_test::untouched(probs));
}

}  // namespace
}  // namespace selfattn
