// The workspace limit (ContextOptions::workspace_limit; context.h says what it counts). A call throws
// WorkspaceTooSmall exactly when what it needs with a chunk of one query row exceeds the limit, and
// then has written nothing; under any larger limit it gives the reference's result. The needs below
// restate context.h's rule on their own, not the library's arithmetic.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../paths/kv_cache_check.h"  // the KV-cache judge (expected_kv_attention) and test caches
#include "attention_expected.h"
#include "attention_harness.h"
#include "self_attention_reference.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

using host_test::upload;
using testing::load_element;
using testing::round_to;

constexpr unsigned char kUnwritten = 0xFF;  // NaN in every dtype: an element left unwritten shows

size_t round_up(size_t n, size_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// Workspace bytes one query row with `seq_k` keys needs on `path` (context.h).
size_t score_row_bytes(Path path, DType dtype, int seq_k) {
  if (path == Path::fused) return 0;
  size_t bytes = 4 * round_up(size_t(seq_k), 4);  // fp32 S, P over it
  if (path == Path::cublas && dtype != DType::f32) bytes += 2 * round_up(size_t(seq_k), 8);  // P in dtype
  return std::max<size_t>(bytes, 16);
}

// One call with its memory and its judge, run under many limits.
struct Trial {
  std::string name;
  const char* function = "";  // the entry point the messages must name
  size_t need = 0;            // bytes with a chunk of one query row
  size_t whole = 0;           // bytes with the whole problem in one chunk
  std::vector<DeviceBuffer<unsigned char>> inputs, outputs;
  // Output i starts each run as initial_outputs[i] where given (a cache append_kv writes into),
  // else poisoned.
  std::vector<std::vector<unsigned char>> initial_outputs;
  std::function<void(Context&, const Trial&)> call;  // the Trial passes itself: its buffers
  // After a success: outputs (as downloaded) against the reference.
  std::function<::testing::AssertionResult(const std::vector<std::vector<unsigned char>>&)> judge;
};

std::vector<std::vector<unsigned char>> contents(const std::vector<DeviceBuffer<unsigned char>>& buffers) {
  std::vector<std::vector<unsigned char>> bytes;
  for (const auto& buffer : buffers) bytes.push_back(buffer.to_host());
  return bytes;
}

// Where two snapshots differ first ("buffer 1 byte 40"), or "" when they are equal.
std::string first_difference(const std::vector<std::vector<unsigned char>>& a,
                             const std::vector<std::vector<unsigned char>>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t j = 0; j < a[i].size(); ++j)
      if (a[i][j] != b[i][j]) return "buffer " + std::to_string(i) + " byte " + std::to_string(j);
  return "";
}

::testing::AssertionResult run_under_limit(Context& ctx, Trial& trial, size_t limit) {
  for (size_t i = 0; i < trial.outputs.size(); ++i) {
    if (i < trial.initial_outputs.size() && !trial.initial_outputs[i].empty()) {
      trial.outputs[i].copy_from_host(trial.initial_outputs[i]);
    } else {
      trial.outputs[i].fill_bytes(kUnwritten);
    }
  }
  ctx.set_workspace_limit(limit);
  const auto inputs_before = contents(trial.inputs), outputs_before = contents(trial.outputs);
  const std::string where = trial.name + " under limit " + std::to_string(limit) + " (one row needs " +
                            std::to_string(trial.need) + ")";
  try {
    trial.call(ctx, trial);
    ctx.synchronize();
  } catch (const WorkspaceTooSmall& e) {
    const std::string message = e.what();
    if (limit >= trial.need) return ::testing::AssertionFailure() << where << ": threw " << message;
    const std::string written = first_difference(outputs_before, contents(trial.outputs));
    if (!written.empty()) return ::testing::AssertionFailure() << where << ": threw, but wrote output " << written;
    const std::string changed = first_difference(inputs_before, contents(trial.inputs));
    if (!changed.empty()) return ::testing::AssertionFailure() << where << ": threw, but changed input " << changed;
    if (message.rfind(std::string(trial.function) + ": ", 0) != 0 ||
        message.find(" " + std::to_string(limit) + " bytes") == std::string::npos)
      return ::testing::AssertionFailure() << where << ": the message should start with " << trial.function
                                           << " and name the limit: " << message;
    return ::testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << where << ": threw " << e.what();
  }
  if (limit < trial.need) return ::testing::AssertionFailure() << where << ": ran although one row does not fit";
  if (ctx.workspace_bytes() > limit)
    return ::testing::AssertionFailure() << where << ": the workspace holds " << ctx.workspace_bytes() << " bytes";
  const std::string changed = first_difference(inputs_before, contents(trial.inputs));
  if (!changed.empty()) return ::testing::AssertionFailure() << where << ": input " << changed << " changed";
  ::testing::AssertionResult verdict = trial.judge(contents(trial.outputs));
  if (!verdict) verdict << " (" << where << ")";
  return verdict;
}

// ---- judging ----

// out (elements of dtype) and lse (fp32), in the order of the expectations, by the shared rule
// (judge.h).
::testing::AssertionResult matches(const std::vector<unsigned char>& out, DType dtype, const testing::Expected& out_expected,
                                   const std::vector<unsigned char>& lse, const testing::Expected& lse_expected) {
  std::vector<double> out_values(out_expected.size()), lse_values(lse_expected.size());
  for (size_t i = 0; i < out_values.size(); ++i) out_values[i] = load_element(out.data(), dtype, i);
  for (size_t i = 0; i < lse_values.size(); ++i) lse_values[i] = load_element(lse.data(), DType::f32, i);
  ::testing::AssertionResult verdict = testing::judge("out", out_values, out_expected);
  return verdict ? testing::judge("lse", lse_values, lse_expected) : verdict;
}

// Copies `rows` rows of `from` starting at row `from_row` to row `to_row` of `to` (same row length).
void place_rows(const testing::Expected& from, size_t from_row, testing::Expected& to, size_t to_row, size_t rows) {
  const size_t n = size_t(from.row_length);
  for (auto member : {&testing::Expected::exact, &testing::Expected::allowed, &testing::Expected::scale,
                      &testing::Expected::floor}) {
    std::copy_n((from.*member).begin() + ptrdiff_t(from_row * n), rows * n, (to.*member).begin() + ptrdiff_t(to_row * n));
  }
}

std::vector<double> random_values(size_t n, DType dtype, std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(-1, 1);
  std::vector<double> values(n);
  for (double& x : values) x = round_to(dtype, uniform(rng));
  return values;
}

// The bytes of `values` in a device buffer (int32 metadata, fp32 tables).
template <class T>
DeviceBuffer<unsigned char> upload_raw(Context& ctx, const std::vector<T>& values) {
  DeviceBuffer<unsigned char> buffer(ctx, values.size() * sizeof(T));
  if (!values.empty()) buffer.copy_from_host(reinterpret_cast<const unsigned char*>(values.data()), buffer.size());
  return buffer;
}
DeviceBuffer<unsigned char> upload_int32(Context& ctx, const std::vector<int32_t>& values) { return upload_raw(ctx, values); }

std::vector<int32_t> int32_values(const std::vector<unsigned char>& bytes) {
  std::vector<int32_t> values(bytes.size() / sizeof(int32_t));
  if (!values.empty()) std::memcpy(values.data(), bytes.data(), values.size() * sizeof(int32_t));
  return values;
}

std::string label(DType dtype, Path path) { return std::string(to_string(dtype)) + " " + to_string(path); }

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

// ---- the KV-cache calls (kv_cache.h) ----

// Moves a test cache's K and V into `kv` and uploads its lengths and block table into `metadata`,
// so that every byte the call may read or write is in the Trial's buffers; returns the view of them.
KvCache move_cache_into(Context& ctx, kv_test::TestCache& cache, std::vector<DeviceBuffer<unsigned char>>& kv,
                        std::vector<DeviceBuffer<unsigned char>>& metadata) {
  KvCache view = cache.view;  // the device pointers of k and v survive the move
  kv.push_back(std::move(cache.k));
  kv.push_back(std::move(cache.v));
  metadata.push_back(upload_int32(ctx, cache.image.lengths));
  view.lengths = reinterpret_cast<const int32_t*>(metadata.back().data());
  if (view.paged()) {
    metadata.push_back(upload_int32(ctx, cache.image.block_table));
    view.block_table = reinterpret_cast<const int32_t*>(metadata.back().data());
  }
  return view;
}

// attention_with_kv_cache with LSE. Its workspace (kv_cache.h), each piece rounded up to 256 bytes:
// the rotated q with rotary; then on fused, with more than one split, the partial out and LSE
// (nothing else: need and whole are the same); on naive/cublas, the gathered K and V, then the
// scores of attention() over `capacity` keys.
Trial kv_attention_trial(Context& ctx, const kv_test::AttendCase& c, Path path, std::mt19937& rng) {
  Trial t;
  t.name = "attention_with_kv_cache " + c.name() + " " + to_string(path);
  t.function = "attention_with_kv_cache";
  const DType dtype = c.cache.dtype;
  const int batch = c.cache.batch, d = c.cache.head_dim;
  std::mt19937_64 cache_rng(rng());
  kv_test::TestCache cache = kv_test::make_cache(ctx, c.cache, cache_rng);
  const reference::KvCacheImage image = cache.image;
  const size_t rows = size_t(batch) * c.heads * c.seq_q, element = dtype_size(dtype);
  const size_t q_bytes = c.rotary ? round_up(rows * d * element, 256) : 0;
  if (path == Path::fused) {
    const size_t splits = size_t(c.num_splits);
    t.need = t.whole = q_bytes + (splits > 1 ? round_up(splits * rows * d * 4, 256) + round_up(splits * rows * 4, 256) : 0);
  } else {
    const size_t kv_bytes = round_up(size_t(batch) * c.cache.kv_heads * size_t(image.capacity()) * d * element, 256);
    const size_t row = score_row_bytes(path, dtype, image.capacity());
    t.need = q_bytes + 2 * kv_bytes + row;
    t.whole = q_bytes + 2 * kv_bytes + row * rows;
  }

  std::optional<kv_test::TestRotary> rotary;
  if (c.rotary) rotary = kv_test::make_rotary(ctx, image.capacity() + 3, c.rotary->first, c.rotary->second, cache_rng);
  const std::vector<double> q = random_values(rows * d, dtype, rng);
  const testing::AttentionExpected expected =
      kv_test::expected_kv_attention(kv_test::problem_of(c), q, image, dtype, rotary ? &rotary->table : nullptr);

  t.inputs.push_back(upload(ctx, q, dtype));
  const KvCache view = move_cache_into(ctx, cache, t.inputs, t.inputs);
  std::optional<Rotary> rotary_view;
  if (rotary) {
    // The tables in the Trial's buffers too (the doubles are the uploaded floats exactly).
    t.inputs.push_back(upload_raw(ctx, std::vector<float>(rotary->table.cos.begin(), rotary->table.cos.end())));
    t.inputs.push_back(upload_raw(ctx, std::vector<float>(rotary->table.sin.begin(), rotary->table.sin.end())));
    rotary_view = rotary->view;
    rotary_view->cos = reinterpret_cast<const float*>(t.inputs[t.inputs.size() - 2].data());
    rotary_view->sin = reinterpret_cast<const float*>(t.inputs.back().data());
  }
  t.outputs.emplace_back(ctx, rows * d * element);
  t.outputs.emplace_back(ctx, rows * sizeof(float));
  t.call = [c, path, view, rotary_view, dtype, batch, d](Context& context, const Trial& t) {
    KvAttentionOptions options;
    options.path = path;
    options.causal = c.causal;
    options.num_splits = c.num_splits;
    options.rotary = rotary_view;
    options.lse = reinterpret_cast<float*>(t.outputs[1].data());
    attention_with_kv_cache(context, TensorView::bhsd(t.inputs[0].data(), dtype, batch, c.heads, c.seq_q, d), view,
                            TensorView::bhsd(t.outputs[0].data(), dtype, batch, c.heads, c.seq_q, d), options);
  };
  t.judge = [dtype, expected](const std::vector<std::vector<unsigned char>>& out) {
    return matches(out[0], dtype, expected.out, out[1], expected.lse);
  };
  return t;
}

// The pool bytes `initial` with the values of `image` (a KvCacheImage's k, which 0, or v, 1) stored
// where they are not NaN, in that pool's own layout: what the device holds once the image's tokens
// are written (NaN rows stay poisoned).
std::vector<unsigned char> pool_bytes(const kv_test::TestCache& cache, int which, const std::vector<double>& image,
                                      std::vector<unsigned char> initial) {
  const reference::KvCacheImage& im = cache.image;
  for (int page = 0; page < im.num_pages; ++page)
    for (int h = 0; h < im.kv_heads; ++h)
      for (int row = 0; row < im.page_size; ++row)
        for (int e = 0; e < im.head_dim; ++e) {
          const double x = image[((size_t(page) * im.kv_heads + h) * im.page_size + size_t(row)) * im.head_dim + size_t(e)];
          if (!std::isnan(x)) testing::store_element(initial.data(), cache.spec.dtype, cache.device_index(which, page, h, row, e), float(x));
        }
  return initial;
}

// append_kv of seq_new tokens with updated_lengths. It uses no workspace (kv_cache.h), so it runs
// under every limit; a copy is judged byte for byte (the tokens are rounded to the dtype already).
Trial append_kv_trial(Context& ctx, const kv_test::CacheSpec& spec, int seq_new, std::mt19937& rng) {
  Trial t;
  t.name = "append_kv " + spec.name() + " new " + std::to_string(seq_new);
  t.function = "append_kv";
  std::mt19937_64 cache_rng(rng());
  kv_test::TestCache cache = kv_test::make_cache(ctx, spec, cache_rng);
  const std::vector<double> k_new = random_values(size_t(spec.batch) * spec.kv_heads * seq_new * spec.head_dim, spec.dtype, rng);
  const std::vector<double> v_new = random_values(k_new.size(), spec.dtype, rng);
  reference::KvCacheImage appended = cache.image;
  reference::append_kv(appended, k_new, v_new, seq_new);
  const std::vector<unsigned char> k_before = cache.k.to_host(), v_before = cache.v.to_host();
  const std::vector<unsigned char> k_after = pool_bytes(cache, 0, appended.k, k_before);
  const std::vector<unsigned char> v_after = pool_bytes(cache, 1, appended.v, v_before);
  std::vector<int32_t> lengths_after(size_t(spec.batch));
  for (int b = 0; b < spec.batch; ++b)
    lengths_after[size_t(b)] = std::min(cache.image.length(b) + seq_new, cache.image.capacity());

  t.inputs.push_back(upload(ctx, k_new, spec.dtype));
  t.inputs.push_back(upload(ctx, v_new, spec.dtype));
  const KvCache view = move_cache_into(ctx, cache, t.outputs, t.inputs);
  t.initial_outputs = {k_before, v_before};
  t.outputs.emplace_back(ctx, size_t(spec.batch) * sizeof(int32_t));  // updated_lengths, poisoned
  t.call = [spec, seq_new, view](Context& context, const Trial& t) {
    AppendKvOptions options;
    options.updated_lengths = reinterpret_cast<int32_t*>(t.outputs[2].data());
    const auto new_tokens = [&](size_t input) {
      return TensorView::bhsd(t.inputs[input].data(), spec.dtype, spec.batch, spec.kv_heads, seq_new, spec.head_dim);
    };
    append_kv(context, view, new_tokens(0), new_tokens(1), options);
  };
  t.judge = [k_after, v_after, lengths_after](const std::vector<std::vector<unsigned char>>& out) {
    const std::string differs = first_difference({k_after, v_after}, {out[0], out[1]});
    if (!differs.empty()) return ::testing::AssertionFailure() << "cache " << differs << " is not the appended cache";
    if (int32_values(out[2]) != lengths_after) return ::testing::AssertionFailure() << "updated_lengths differ";
    return ::testing::AssertionSuccess();
  };
  return t;
}

// cu_seqlens_from_lengths. Its workspace is the device scan's scratch (kv_cache.h): none on the sim.
Trial cu_seqlens_trial(Context& ctx, const std::vector<int32_t>& lengths) {
  Trial t;
  t.name = "cu_seqlens_from_lengths batch " + std::to_string(lengths.size());
  t.function = "cu_seqlens_from_lengths";
  std::vector<int32_t> cu_seqlens{0};
  for (int32_t n : lengths) cu_seqlens.push_back(cu_seqlens.back() + n);
  t.inputs.push_back(upload_int32(ctx, lengths));
  t.outputs.emplace_back(ctx, cu_seqlens.size() * sizeof(int32_t));
  const int batch = int(lengths.size());
  t.call = [batch](Context& context, const Trial& t) {
    cu_seqlens_from_lengths(context, reinterpret_cast<const int32_t*>(t.inputs[0].data()), batch,
                            reinterpret_cast<int32_t*>(t.outputs[0].data()));
  };
  t.judge = [cu_seqlens](const std::vector<std::vector<unsigned char>>& out) {
    if (int32_values(out[0]) == cu_seqlens) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "cu_seqlens differ from the prefix sums";
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

// ---- the property: random limits, every path and entry point ----

// Limits from below one row to above the whole problem, the boundary among them.
std::vector<size_t> limits_for(const Trial& trial, std::mt19937& rng) {
  std::vector<size_t> limits{trial.need};
  if (trial.need > 0) limits.push_back(trial.need - 1);
  std::uniform_int_distribution<size_t> around(trial.need / 2, trial.whole + trial.whole / 4 + 1);
  limits.push_back(around(rng));
  limits.push_back(around(rng));
  return limits;
}

uint32_t run_seed() {
  const char* seed = std::getenv("SELFATTN_SIM_SEED");
  return seed ? uint32_t(std::strtoul(seed, nullptr, 10)) : 1u;
}

template <class T>
T pick(std::mt19937& rng, std::initializer_list<T> values) {
  return *(values.begin() + std::uniform_int_distribution<size_t>(0, values.size() - 1)(rng));
}
int between(std::mt19937& rng, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }

constexpr int kTrialsPerPath = 4;

DType random_dtype(std::mt19937& rng) { return pick(rng, {DType::f32, DType::f16, DType::bf16}); }
Causal random_causal(std::mt19937& rng) { return pick(rng, {Causal::none, Causal::top_left, Causal::bottom_right}); }

// kTrialsPerPath random trials (make_trial), each under limits_for(), all on one context: what
// earlier calls left in the workspace must not matter.
void check_random_trials(Path path, uint32_t salt, const std::function<Trial(Context&, std::mt19937&)>& make_trial) {
  Context ctx(Backend::sim);
  std::mt19937 rng(run_seed() * salt + unsigned(path));
  for (int i = 0; i < kTrialsPerPath; ++i) {
    Trial trial = make_trial(ctx, rng);
    for (size_t limit : limits_for(trial, rng)) EXPECT_TRUE(run_under_limit(ctx, trial, limit));
  }
}

class WorkspaceLimitProperty : public ::testing::TestWithParam<Path> {};

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

// A random cache (kv_cache_check.h's CacheSpec): paged (page sizes 1, 7, 16, shuffled pages) or
// contiguous, lengths from 0 to the capacity.
kv_test::CacheSpec random_cache(std::mt19937& rng, bool may_share_pages) {
  kv_test::CacheSpec cache;
  cache.dtype = random_dtype(rng);
  cache.batch = between(rng, 1, 3);
  cache.kv_heads = between(rng, 1, 2);
  cache.head_dim = pick(rng, {8, 36, 64});
  // K in either order, V in the other (each pool its own padded layout, kv_cache_check.h).
  cache.k_layout.head_major = between(rng, 0, 1) == 1;
  cache.v_layout.head_major = !cache.k_layout.head_major;
  cache.paged = between(rng, 0, 2) != 0;
  if (cache.paged) {
    cache.page_size = pick(rng, {1, 7, 16});
    cache.max_pages_per_seq = between(rng, 1, 40 / cache.page_size + 1);
    cache.shared_first_page = may_share_pages && between(rng, 0, 3) == 0;
  } else {
    cache.page_size = pick(rng, {1, 9, 40});  // the capacity
  }
  const int capacity = cache.page_size * cache.max_pages_per_seq;
  for (int b = 0; b < cache.batch; ++b) cache.lengths.push_back(between(rng, 0, capacity));
  return cache;
}

TEST_P(WorkspaceLimitProperty, AttentionWithKvCache) {
  check_random_trials(GetParam(), 15485863u, [path = GetParam()](Context& ctx, std::mt19937& rng) {
    const kv_test::CacheSpec cache = random_cache(rng, true);
    kv_test::AttendCase c = kv_test::attend(cache, cache.kv_heads * pick(rng, {1, 2, 4}), pick(rng, {1, 2, 7}),
                                            pick(rng, {Causal::bottom_right, Causal::none}));
    if (between(rng, 0, 1)) c.rotary = std::make_pair(pick(rng, {2, cache.head_dim}), between(rng, 0, 1) == 1);
    if (path == Path::fused) c.num_splits = pick(rng, {1, 2, 3, 9});  // 9: more splits than key tiles
    return kv_attention_trial(ctx, c, path, rng);
  });
}

// append_kv and cu_seqlens_from_lengths take no path; they run under the same limits.
TEST(WorkspaceLimitKvCache, AppendKv) {
  check_random_trials(Path::automatic, 32452843u, [](Context& ctx, std::mt19937& rng) {
    return append_kv_trial(ctx, random_cache(rng, false), pick(rng, {1, 2, 7}), rng);
  });
}

TEST(WorkspaceLimitKvCache, CuSeqlensFromLengths) {
  check_random_trials(Path::automatic, 49979687u, [](Context& ctx, std::mt19937& rng) {
    std::vector<int32_t> lengths(size_t(between(rng, 1, 5)));
    for (int32_t& n : lengths) n = between(rng, 0, 300);
    return cu_seqlens_trial(ctx, lengths);
  });
}

INSTANTIATE_TEST_SUITE_P(EveryPath, WorkspaceLimitProperty, ::testing::Values(Path::naive, Path::cublas, Path::fused),
                         [](const ::testing::TestParamInfo<Path>& info) { return std::string(to_string(info.param)); });

}  // namespace
}  // namespace selfattn
