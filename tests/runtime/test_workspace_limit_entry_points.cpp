// The workspace limit (ContextOptions::workspace_limit; context.h says what it counts). A call throws
// WorkspaceTooSmall exactly when what it needs with a chunk of one query row exceeds the limit, and
// then has written nothing; under any larger limit it gives the reference's result. The needs below
// restate context.h's rule on their own, not the library's arithmetic.
// This program: attention(), attention_varlen() and self_attention() (the KV-cache calls:
// test_workspace_limit_kv_cache.cpp; the shared Trial and its run: workspace_limit_trial.h).
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "attention_expected.h"
#include "attention_harness.h"
#include "self_attention_reference.h"
#include "selfattn/selfattn.h"
#include "workspace_limit_trial.h"

namespace selfattn::workspace_limit_test {
namespace {

// ---- the three entry points ----

struct AttentionSpec {
  DType dtype = DType::f32;
  Path path = Path::naive;
  int batch = 1, heads = 1, kv_heads = 1, seq_q = 1, seq_k = 1, head_dim = 1;
  Causal causal = Causal::none;
  std::vector<int32_t> key_lengths;  // empty or [batch]
};

// attention() on contiguous BHSD tensors, with LSE.
Trial attention_trial(Context& ctx, const AttentionSpec& s, std::mt19937& rng) {
  Trial t;
  t.name = "attention " + label(s.dtype, s.path) + " b" + std::to_string(s.batch) + " h" + std::to_string(s.heads) +
           "/" + std::to_string(s.kv_heads) + " q" + std::to_string(s.seq_q) + " k" + std::to_string(s.seq_k) + " d" +
           std::to_string(s.head_dim) + " " + to_string(s.causal) + (s.key_lengths.empty() ? "" : " key_lengths");
  t.function = "attention";
  const size_t row = score_row_bytes(s.path, s.dtype, s.seq_k);
  t.need = row;
  t.whole = row * size_t(s.batch) * s.heads * s.seq_q;

  reference::Problem problem;
  problem.batch = s.batch, problem.heads = s.heads, problem.kv_heads = s.kv_heads;
  problem.seq_q = s.seq_q, problem.seq_k = s.seq_k, problem.head_dim = s.head_dim, problem.causal = s.causal;
  problem.key_lengths = s.key_lengths;
  const std::vector<double> q = random_values(size_t(s.batch) * s.heads * s.seq_q * s.head_dim, s.dtype, rng);
  const std::vector<double> k = random_values(size_t(s.batch) * s.kv_heads * s.seq_k * s.head_dim, s.dtype, rng);
  const std::vector<double> v = random_values(k.size(), s.dtype, rng);
  t.inputs.push_back(upload(ctx, q, s.dtype));
  t.inputs.push_back(upload(ctx, k, s.dtype));
  t.inputs.push_back(upload(ctx, v, s.dtype));
  t.inputs.push_back(upload_int32(ctx, s.key_lengths));
  testing::AttentionArithmetic arithmetic;
  arithmetic.dtype = s.dtype;
  {
    AttentionOptions options;
    options.causal = s.causal;
    const TensorView q_view = TensorView::bhsd(t.inputs[0].data(), s.dtype, s.batch, s.heads, s.seq_q, s.head_dim);
    const TensorView k_view = TensorView::bhsd(t.inputs[1].data(), s.dtype, s.batch, s.kv_heads, s.seq_k, s.head_dim);
    const TensorView v_view = TensorView::bhsd(t.inputs[2].data(), s.dtype, s.batch, s.kv_heads, s.seq_k, s.head_dim);
    arithmetic.p_rounded = testing::rounds_probabilities(ctx, s.path, q_view, k_view, v_view, q_view, options);
  }
  const testing::AttentionExpected expected = testing::expected_attention(problem, q, k, v, arithmetic);
  t.outputs.emplace_back(ctx, q.size() * dtype_size(s.dtype));
  t.outputs.emplace_back(ctx, expected.lse.size() * sizeof(float));

  t.call = [s](Context& c, const Trial& t) {
    AttentionOptions options;
    options.path = s.path;
    options.causal = s.causal;
    options.lse = reinterpret_cast<float*>(t.outputs[1].data());
    if (!s.key_lengths.empty()) options.key_lengths = reinterpret_cast<const int32_t*>(t.inputs[3].data());
    attention(c, TensorView::bhsd(t.inputs[0].data(), s.dtype, s.batch, s.heads, s.seq_q, s.head_dim),
              TensorView::bhsd(t.inputs[1].data(), s.dtype, s.batch, s.kv_heads, s.seq_k, s.head_dim),
              TensorView::bhsd(t.inputs[2].data(), s.dtype, s.batch, s.kv_heads, s.seq_k, s.head_dim),
              TensorView::bhsd(t.outputs[0].data(), s.dtype, s.batch, s.heads, s.seq_q, s.head_dim), options);
  };
  t.judge = [s, expected](const std::vector<std::vector<unsigned char>>& out) {
    return matches(out[0], s.dtype, expected.out, out[1], expected.lse);
  };
  return t;
}

struct VarlenSpec {
  DType dtype = DType::f32;
  Path path = Path::naive;
  int heads = 1, kv_heads = 1, head_dim = 1;
  std::vector<int> seq_q, seq_k;  // per sequence
  Causal causal = Causal::none;
};

// attention_varlen() on [1, heads, total, head_dim] BHSD tensors, with LSE [heads, total_q];
// max_seqlen_q/k are the longest lengths.
Trial varlen_trial(Context& ctx, const VarlenSpec& s, std::mt19937& rng) {
  Trial t;
  const int batch = int(s.seq_q.size());
  std::vector<int32_t> cu_q{0}, cu_k{0};
  t.name = "attention_varlen " + label(s.dtype, s.path) + " h" + std::to_string(s.heads) + "/" +
           std::to_string(s.kv_heads) + " d" + std::to_string(s.head_dim) + " " + to_string(s.causal) + " q/k";
  for (int b = 0; b < batch; ++b) {
    cu_q.push_back(cu_q.back() + s.seq_q[b]);
    cu_k.push_back(cu_k.back() + s.seq_k[b]);
    t.name += " " + std::to_string(s.seq_q[b]) + "/" + std::to_string(s.seq_k[b]);
    // A sequence without queries needs nothing; the longest key row of the others sets the need.
    if (s.seq_q[b] == 0) continue;
    const size_t row = score_row_bytes(s.path, s.dtype, s.seq_k[b]);
    t.need = std::max(t.need, row);
    t.whole = std::max(t.whole, row * size_t(s.heads) * s.seq_q[b]);
  }
  const int total_q = cu_q.back(), total_k = cu_k.back();
  const int max_q = *std::max_element(s.seq_q.begin(), s.seq_q.end());
  const int max_k = *std::max_element(s.seq_k.begin(), s.seq_k.end());
  // The fused path keeps the running maximum of both offsets arrays, each rounded up to 256.
  if (s.path == Path::fused) t.need = t.whole = 2 * round_up(4 * size_t(batch + 1), 256);
  if (max_k == 0) t.need = t.whole = 0;  // no keys at all: no path runs

  const int d = s.head_dim;
  const std::vector<double> q = random_values(size_t(s.heads) * total_q * d, s.dtype, rng);
  const std::vector<double> k = random_values(size_t(s.kv_heads) * total_k * d, s.dtype, rng);
  const std::vector<double> v = random_values(k.size(), s.dtype, rng);
  // The expectation of each sequence alone, placed where the packed out and lse hold it.
  testing::AttentionArithmetic arithmetic;
  arithmetic.dtype = s.dtype;
  {
    // Which kernel a path picks depends on the dtype, head_dim and alignment, not on the lengths.
    std::vector<unsigned char> probe(256 * 3);
    const TensorView q_view = TensorView::bhsd(probe.data(), s.dtype, 1, s.heads, 1, d);
    const TensorView kv_view = TensorView::bhsd(probe.data() + 256, s.dtype, 1, s.kv_heads, 1, d);
    arithmetic.p_rounded = testing::rounds_probabilities(ctx, s.path, q_view, kv_view, kv_view, q_view, {});
  }
  testing::AttentionExpected expected;
  expected.out.row_length = d;
  for (testing::Expected* e : {&expected.out, &expected.lse}) {
    const size_t n = e == &expected.out ? q.size() : size_t(s.heads) * total_q;
    for (auto member : {&testing::Expected::exact, &testing::Expected::allowed, &testing::Expected::scale,
                        &testing::Expected::floor}) {
      (e->*member).assign(n, 0.0);
    }
  }
  for (int b = 0; b < batch; ++b) {
    auto slice = [&](const std::vector<double>& x, int heads, int total, int first, int len) {
      std::vector<double> part(size_t(heads) * len * d);
      for (int h = 0; h < heads; ++h) {
        const auto rows = x.begin() + (ptrdiff_t(h) * total + first) * d;
        std::copy(rows, rows + ptrdiff_t(len) * d, part.begin() + ptrdiff_t(h) * len * d);
      }
      return part;
    };
    reference::Problem problem;
    problem.heads = s.heads, problem.kv_heads = s.kv_heads, problem.head_dim = d, problem.causal = s.causal;
    problem.seq_q = s.seq_q[b], problem.seq_k = s.seq_k[b];
    const testing::AttentionExpected part = testing::expected_attention(
        problem, slice(q, s.heads, total_q, cu_q[b], s.seq_q[b]), slice(k, s.kv_heads, total_k, cu_k[b], s.seq_k[b]),
        slice(v, s.kv_heads, total_k, cu_k[b], s.seq_k[b]), arithmetic);
    for (int h = 0; h < s.heads; ++h) {
      const size_t from = size_t(h) * s.seq_q[b], to = size_t(h) * total_q + cu_q[b];
      place_rows(part.out, from, expected.out, to, size_t(s.seq_q[b]));
      place_rows(part.lse, from, expected.lse, to, size_t(s.seq_q[b]));
    }
  }

  t.function = "attention_varlen";
  t.inputs.push_back(upload(ctx, q, s.dtype));
  t.inputs.push_back(upload(ctx, k, s.dtype));
  t.inputs.push_back(upload(ctx, v, s.dtype));
  t.inputs.push_back(upload_int32(ctx, cu_q));
  t.inputs.push_back(upload_int32(ctx, cu_k));
  t.outputs.emplace_back(ctx, q.size() * dtype_size(s.dtype));
  t.outputs.emplace_back(ctx, expected.lse.size() * sizeof(float));
  t.call = [s, batch, total_q, total_k, max_q, max_k](Context& c, const Trial& t) {
    AttentionOptions options;
    options.path = s.path;
    options.causal = s.causal;
    options.lse = reinterpret_cast<float*>(t.outputs[1].data());
    attention_varlen(c, TensorView::bhsd(t.inputs[0].data(), s.dtype, 1, s.heads, total_q, s.head_dim),
                     TensorView::bhsd(t.inputs[1].data(), s.dtype, 1, s.kv_heads, total_k, s.head_dim),
                     TensorView::bhsd(t.inputs[2].data(), s.dtype, 1, s.kv_heads, total_k, s.head_dim),
                     TensorView::bhsd(t.outputs[0].data(), s.dtype, 1, s.heads, total_q, s.head_dim),
                     reinterpret_cast<const int32_t*>(t.inputs[3].data()),
                     reinterpret_cast<const int32_t*>(t.inputs[4].data()), batch, max_q, max_k, options);
  };
  t.judge = [s, expected](const std::vector<std::vector<unsigned char>>& out) {
    return matches(out[0], s.dtype, expected.out, out[1], expected.lse);
  };
  return t;
}

// self_attention() with LSE, out [batch, heads, seq, head_dim] (or [batch, 1, seq, d_out] with W^O).
Trial self_attention_trial(Context& ctx, const host_test::SelfAttentionCase& c, Path path, std::mt19937& rng) {
  Trial t;
  t.name = "self_attention " + c.name() + " " + to_string(path);
  t.function = "self_attention";
  // Q, K, V and (with W^O) the attention output, each rounded up to 256 bytes, then the scores.
  const size_t element = dtype_size(c.dtype), tokens = size_t(c.batch) * c.seq;
  const size_t q_bytes = round_up(tokens * c.heads * c.head_dim * element, 256);
  const size_t kv_bytes = round_up(tokens * c.kv_heads * c.head_dim * element, 256);
  const size_t projections = q_bytes + 2 * kv_bytes + (c.d_out > 0 ? q_bytes : 0);
  const size_t row = score_row_bytes(path, c.dtype, c.seq);
  t.need = projections + row;
  t.whole = projections + row * tokens * c.heads;

  const host_test::SelfAttentionProblem p = host_test::make_self_attention_problem(c, rng);
  for (const std::vector<double>* values : {&p.x, &p.wq, &p.wk, &p.wv, &p.wo}) {
    t.inputs.push_back(upload(ctx, *values, c.dtype));
  }
  t.outputs.emplace_back(ctx, p.out.size() * element);
  t.outputs.emplace_back(ctx, p.lse.size() * sizeof(float));
  t.call = [c, path](Context& context, const Trial& t) {
    AttentionOptions options;
    options.path = path;
    options.causal = c.causal;
    options.lse = reinterpret_cast<float*>(t.outputs[1].data());
    auto matrix = [&](int index, int rows, int cols) {
      return MatrixView::row_major(t.inputs[size_t(index)].data(), c.dtype, rows, cols);
    };
    const MatrixView wo = matrix(4, c.heads * c.head_dim, c.d_out);
    void* out_data = t.outputs[0].data();
    const TensorView out = c.d_out > 0 ? TensorView::bhsd(out_data, c.dtype, c.batch, 1, c.seq, c.d_out)
                                       : TensorView::bhsd(out_data, c.dtype, c.batch, c.heads, c.seq, c.head_dim);
    self_attention(context, TensorView::bhsd(t.inputs[0].data(), c.dtype, c.batch, 1, c.seq, c.d_model),
                   matrix(1, c.d_model, c.heads * c.head_dim), matrix(2, c.d_model, c.kv_heads * c.head_dim),
                   matrix(3, c.d_model, c.kv_heads * c.head_dim), c.heads, out, options, c.d_out > 0 ? &wo : nullptr);
  };
  t.judge = [c, p](const std::vector<std::vector<unsigned char>>& out) {
    return matches(out[0], c.dtype, p.out, out[1], p.lse);
  };
  return t;
}

// ---- the reproductions ----

// Sequence 0 fits the limit, sequence 1 (196 keys: 784 bytes a row) does not: the call must throw
// before sequence 0 is written, naming attention_varlen.
TEST(WorkspaceLimit, VarlenThatCannotFitWritesNothing) {
  Context ctx(Backend::sim);
  std::mt19937 rng(16);
  for (Path path : {Path::naive, Path::cublas}) {
    VarlenSpec spec;
    spec.path = path;
    spec.heads = 4, spec.kv_heads = 2, spec.head_dim = 64;
    spec.seq_q = {10, 10};
    spec.seq_k = {4, 196};
    Trial trial = varlen_trial(ctx, spec, rng);
    EXPECT_EQ(trial.need, 784u);
    EXPECT_TRUE(run_under_limit(ctx, trial, 300));
    EXPECT_TRUE(run_under_limit(ctx, trial, 784));
  }
}

// One row of 70 keys needs 288 bytes (fp32 S; cublas f16/bf16 432 with P): a limit of 450 runs,
// and the boundary is exact (one byte less throws).
TEST(WorkspaceLimit, OneRowThatFitsRunsToTheByte) {
  Context ctx(Backend::sim);
  std::mt19937 rng(16);
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    for (Path path : {Path::naive, Path::cublas}) {
      AttentionSpec spec;
      spec.dtype = dtype, spec.path = path;
      spec.heads = 2, spec.kv_heads = 1, spec.seq_q = 9, spec.seq_k = 70, spec.head_dim = 32;
      Trial trial = attention_trial(ctx, spec, rng);
      EXPECT_EQ(trial.need, path == Path::cublas && dtype != DType::f32 ? 432u : 288u);
      for (size_t limit : {size_t(450), trial.need, trial.need - 1}) EXPECT_TRUE(run_under_limit(ctx, trial, limit));
    }
  }
}

// ---- the property: random limits, every path (check_random_trials) ----

TEST_P(WorkspaceLimitProperty, Attention) {
  check_random_trials(GetParam(), 7919u, [path = GetParam()](Context& ctx, std::mt19937& rng) {
    AttentionSpec s;
    s.dtype = random_dtype(rng);
    s.path = path;
    s.batch = between(rng, 1, 2);
    s.kv_heads = between(rng, 1, 2);
    s.heads = s.kv_heads * between(rng, 1, 3);
    s.seq_q = pick(rng, {1, 7, 20, 33});
    s.seq_k = pick(rng, {1, 9, 40, 70});
    s.head_dim = pick(rng, {1, 7, 16, 32});
    s.causal = random_causal(rng);
    if (between(rng, 0, 1)) {
      for (int b = 0; b < s.batch; ++b) s.key_lengths.push_back(between(rng, 0, s.seq_k));
    }
    return attention_trial(ctx, s, rng);
  });
}

TEST_P(WorkspaceLimitProperty, AttentionVarlen) {
  check_random_trials(GetParam(), 104729u, [path = GetParam()](Context& ctx, std::mt19937& rng) {
    VarlenSpec s;
    s.dtype = random_dtype(rng);
    s.path = path;
    s.kv_heads = between(rng, 1, 2);
    s.heads = s.kv_heads * between(rng, 1, 2);
    s.head_dim = pick(rng, {1, 7, 16, 32});
    s.causal = random_causal(rng);
    const int batch = between(rng, 1, 3);
    for (int b = 0; b < batch; ++b) {
      s.seq_q.push_back(between(rng, b == 0 ? 1 : 0, 12));  // sequences without queries or keys among them
      s.seq_k.push_back(pick(rng, {0, 1, 5, 31, 60}));
    }
    return varlen_trial(ctx, s, rng);
  });
}

TEST_P(WorkspaceLimitProperty, SelfAttention) {
  check_random_trials(GetParam(), 1299709u, [path = GetParam()](Context& ctx, std::mt19937& rng) {
    host_test::SelfAttentionCase c;
    c.dtype = random_dtype(rng);
    c.batch = between(rng, 1, 2);
    c.seq = pick(rng, {1, 7, 20});
    c.d_model = pick(rng, {1, 5, 12});
    c.kv_heads = between(rng, 1, 2);
    c.heads = c.kv_heads * between(rng, 1, 2);
    c.head_dim = pick(rng, {1, 4, 8});
    c.d_out = pick(rng, {0, 0, 3, 9});
    c.causal = random_causal(rng);
    return self_attention_trial(ctx, c, path, rng);
  });
}

INSTANTIATE_TEST_SUITE_P(EveryPath, WorkspaceLimitProperty, ::testing::Values(Path::naive, Path::cublas, Path::fused),
                         [](const ::testing::TestParamInfo<Path>& info) { return std::string(to_string(info.param)); });

}  // namespace
}  // namespace selfattn::workspace_limit_test
