// The workspace limit (ContextOptions::workspace_limit; context.h says what it counts). A call throws
// WorkspaceTooSmall exactly when what it needs with a chunk of one query row exceeds the limit, and
// then has written nothing; under any larger limit it gives the reference's result. The needs below
// restate context.h's rule on their own, not the library's arithmetic.
// This program: the KV-cache calls, attention_with_kv_cache, append_kv and cu_seqlens_from_lengths
// (the other entry points: test_workspace_limit_entry_points.cpp; the shared Trial and its run:
// workspace_limit_trial.h).
#include <algorithm>
#include <cmath>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "kv_cache_check.h"  // the KV-cache judge (expected_kv_attention) and test caches
#include "attention_harness.h"
#include "selfattn/selfattn.h"
#include "workspace_limit_trial.h"

namespace selfattn::workspace_limit_test {
namespace {

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

// ---- the property: random limits, every path (check_random_trials) ----

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
}  // namespace selfattn::workspace_limit_test
