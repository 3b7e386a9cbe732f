// The KV-cache calls on the sim (kv_cache.h): attention over contiguous and paged caches on every
// path, append_kv (across page boundaries, with rotary), merge_states and determinism across
// schedules. Bad arguments and wrong device metadata: test_kv_cache_arguments.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include <selfattn_sim/sim.h>

#include "kv_cache_check.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

using namespace kv_test;

const Path kPaths[] = {Path::naive, Path::cublas, Path::fused};

// Cache lengths 0, 1, page_size - 1, page_size, page_size + 1 with page sizes 1, 16 and 256, shuffled
// pages, both pool layouts, GQA 1/4/8, 1 and 7 new rows, head dims 64/128/256, every dtype.
TEST(KvCacheAttention, PagedEveryPath) {
  Context ctx;
  std::vector<AttendCase> cases;
  cases.push_back(attend(paged(DType::f32, 5, 1, 64, 16, 3, {0, 1, 15, 16, 17}), 4, 1));
  cases.push_back(attend(paged(DType::f16, 5, 1, 128, 16, 3, {17, 16, 15, 1, 0}, false), 8, 7));
  cases.push_back(attend(paged(DType::bf16, 4, 2, 64, 1, 20, {0, 1, 2, 19}), 2, 7));
  cases.push_back(attend(paged(DType::f16, 4, 2, 64, 256, 2, {255, 256, 257, 1}, false), 8, 1));
  cases.push_back(attend(paged(DType::bf16, 2, 1, 256, 16, 2, {9, 31}), 2, 3, Causal::none));
  for (const AttendCase& c : cases)
    for (Path path : kPaths) EXPECT_TRUE(check_attend(ctx, c, path));
}

TEST(KvCacheAttention, ContiguousAnyLayoutEveryPath) {
  Context ctx;
  std::vector<AttendCase> cases;
  cases.push_back(attend(contiguous(DType::f16, 3, 2, 128, 40, {0, 33, 40}, false), 4, 7, Causal::none));
  cases.push_back(attend(contiguous(DType::f32, 2, 1, 64, 20, {7, 20}, true), 2, 3));
  cases.push_back(attend(contiguous(DType::bf16, 2, 4, 64, 17, {1, 16}, false), 4, 1, Causal::bottom_right, false));
  for (const AttendCase& c : cases)
    for (Path path : kPaths) EXPECT_TRUE(check_attend(ctx, c, path));
}

// Pages shared between sequences (a common first page) and appearing in any order.
TEST(KvCacheAttention, SharedPrefixPages) {
  Context ctx;
  AttendCase c = attend(paged(DType::f16, 3, 2, 64, 16, 3, {16, 20, 40}), 4, 7);
  c.cache.shared_first_page = true;
  for (Path path : kPaths) EXPECT_TRUE(check_attend(ctx, c, path));
}

// Rotary on q (interleaved and half-split, full and partial rotary_dim).
TEST(KvCacheAttention, RotaryOnQuery) {
  Context ctx;
  AttendCase interleaved = attend(paged(DType::f16, 2, 1, 64, 16, 3, {5, 33}), 4, 3);
  interleaved.rotary = std::make_pair(64, true);
  AttendCase half_split = attend(paged(DType::f32, 2, 2, 64, 16, 2, {1, 17}), 2, 7);
  half_split.rotary = std::make_pair(32, false);
  EXPECT_TRUE(check_attend(ctx, interleaved, Path::fused));
  EXPECT_TRUE(check_attend(ctx, half_split, Path::naive));
}

// The split-KV kernel (the fused path): one split, 3, more splits than key tiles (empty ones),
// automatic; lengths 0 and ones that end inside a tile; query groups larger than one block's rows
// (8 heads x 7 rows per kv head).
TEST(KvCacheSplitKv, SplitCountsMergeExactly) {
  Context ctx;
  for (int splits : {1, 3, 64, 0}) {
    for (DType dtype : {DType::f16, DType::bf16, DType::f32}) {
      AttendCase c = attend(paged(dtype, 5, 1, 64, 16, 7, {0, 1, 33, 95, 112}), 8, 7);
      c.num_splits = splits;
      EXPECT_TRUE(check_attend(ctx, c, Path::fused));
    }
    AttendCase wide = attend(contiguous(DType::f16, 2, 2, 128, 70, {70, 9}, false), 4, 1, Causal::none);
    wide.num_splits = splits;
    EXPECT_TRUE(check_attend(ctx, wide, Path::fused));
    // Rows of 72 bytes (not whole 16-byte chunks): the per-element loads; 80 bytes: 16-byte loads.
    AttendCase scalar_rows = attend(paged(DType::f16, 2, 2, 36, 16, 3, {40, 17}), 4, 2);
    scalar_rows.num_splits = splits;
    EXPECT_TRUE(check_attend(ctx, scalar_rows, Path::fused));
    AttendCase chunk_rows = attend(paged(DType::bf16, 2, 1, 40, 16, 3, {5, 48}, false), 2, 3);
    chunk_rows.num_splits = splits;
    EXPECT_TRUE(check_attend(ctx, chunk_rows, Path::fused));
  }
}

// ---- masks and score modifiers (window, softcap, ALiBi, bias) over the cache, every path ----

testing::ScoreModsCase window_mods(int left, int right) {
  testing::ScoreModsCase m;
  m.window_left = left;
  m.window_right = right;
  return m;
}

// Each modifier alone, then all at once, on a paged f16 cache (GQA 2, 3 new rows), a contiguous
// f32 one and a paged bf16 one in the token-major pool layout; lengths 0, short, full. The bias has
// -inf columns and, with 3 rows and period 3, a fully masked last row (output 0, LSE -inf).
TEST(KvCacheScoreMods, EachAloneAndCombinedEveryPath) {
  Context ctx;
  std::vector<testing::ScoreModsCase> mods;
  mods.push_back(window_mods(9, -1));
  mods.push_back(window_mods(0, 0));        // width 0: the aligned position alone
  mods.push_back(window_mods(1000, 1000));  // wider than any sequence: no effect
  testing::ScoreModsCase softcap;
  softcap.softcap = 2.5f;
  mods.push_back(softcap);
  testing::ScoreModsCase alibi;
  alibi.alibi = testing::AlibiSlopes::heads;
  mods.push_back(alibi);
  testing::ScoreModsCase bias;
  bias.bias = testing::BiasLayout::full;
  bias.masked_key_period = 5;
  bias.masked_row_period = 3;
  mods.push_back(bias);
  testing::ScoreModsCase all = window_mods(20, 0);
  all.softcap = 8.0f;
  all.alibi = testing::AlibiSlopes::batch_heads;
  all.bias = testing::BiasLayout::heads;
  all.bias_in_input_dtype = true;
  all.masked_key_period = 7;
  mods.push_back(all);

  const std::vector<AttendCase> caches = {
      attend(paged(DType::f16, 3, 2, 64, 16, 4, {0, 37, 64}), 4, 3),
      attend(contiguous(DType::f32, 2, 1, 32, 45, {45, 12}, true), 2, 3, Causal::none),
      attend(paged(DType::bf16, 2, 2, 64, 16, 3, {48, 29}, false), 4, 3),
  };
  for (const testing::ScoreModsCase& m : mods)
    for (AttendCase c : caches) {
      c.mods = m;
      for (Path path : kPaths) EXPECT_TRUE(check_attend(ctx, c, path));
    }
}

// The split-KV kernels (SIMT for f32, tensor cores for f16/bf16) with 1 and 3 splits: a window
// narrower than one split (the other splits read nothing and merge as empty), a window over
// several tiles with causal none and keys right of the aligned position, a broadcast bias
// ([batch, 1, q, capacity], rows 7 and -inf columns) with ALiBi and softcap, GQA 4.
TEST(KvCacheScoreMods, SplitKvSkipsTilesOutsideTheWindow) {
  Context ctx;
  testing::ScoreModsCase narrow = window_mods(10, 0);
  testing::ScoreModsCase wide = window_mods(70, 3);
  wide.alibi = testing::AlibiSlopes::heads;
  testing::ScoreModsCase biased = window_mods(90, -1);
  biased.bias = testing::BiasLayout::batch;
  biased.masked_key_period = 4;
  biased.softcap = 4.0f;
  biased.alibi = testing::AlibiSlopes::batch_heads;
  for (int splits : {1, 3}) {
    for (DType dtype : {DType::f16, DType::bf16, DType::f32}) {
      for (const testing::ScoreModsCase& m : {narrow, wide, biased}) {
        AttendCase c = attend(paged(dtype, 2, 1, 64, 16, 13, {200, 113}), 4, 7, m.window_right > 0 ? Causal::none
                                                                                                      : Causal::bottom_right);
        c.num_splits = splits;
        c.mods = m;
        EXPECT_TRUE(check_attend(ctx, c, Path::fused));
      }
    }
  }
}

// Attention sinks over the cache, every path; on the fused path with 1 split (the block ends the
// row's softmax), 3 and more splits than key tiles (the combine takes the sink once, empty splits
// weigh nothing). Lengths of 0 give rows that are their sink alone (out 0, LSE the sink); three
// heads per kv head, the third without a sink; with a window, ALiBi and a bias beside them.
TEST(KvCacheScoreMods, Sinks) {
  Context ctx;
  testing::ScoreModsCase sinks;
  sinks.sinks = true;
  testing::ScoreModsCase with_others = window_mods(30, 0);
  with_others.sinks = true;
  with_others.alibi = testing::AlibiSlopes::heads;
  with_others.bias = testing::BiasLayout::full;
  with_others.masked_key_period = 5;
  for (const testing::ScoreModsCase& m : {sinks, with_others})
    for (DType dtype : {DType::f16, DType::bf16, DType::f32}) {
      AttendCase c = attend(paged(dtype, 3, 1, 64, 16, 5, {0, 37, 80}), 3, 2);
      c.mods = m;
      for (Path path : kPaths) EXPECT_TRUE(check_attend(ctx, c, path));
      for (int splits : {1, 3, 64}) {
        c.num_splits = splits;
        EXPECT_TRUE(check_attend(ctx, c, Path::fused));
      }
    }
}

// append_kv writes exactly the new tokens' rows (checked element by element against the reference,
// every other byte of the pool unchanged), across page boundaries, and attention then sees them.
::testing::AssertionResult check_append_then_attend(Context& ctx, const CacheSpec& spec, int heads, int seq_new,
                                                    std::optional<std::pair<int, bool>> rotary_spec, Path path) {
  AttendCase c = attend(spec, heads, seq_new);
  c.rotary = rotary_spec;
  const std::string name = "append " + c.name() + " new" + std::to_string(seq_new);
  std::mt19937_64 rng = rng_for(name);
  TestCache cache = make_cache(ctx, spec, rng);
  std::optional<TestRotary> rotary;
  if (rotary_spec) rotary = make_rotary(ctx, cache.image.capacity() + 3, rotary_spec->first, rotary_spec->second, rng);
  Tensor k_new = random_tensor(ctx, spec.dtype, spec.batch, spec.kv_heads, seq_new, spec.head_dim, rng);
  Tensor v_new = random_tensor(ctx, spec.dtype, spec.batch, spec.kv_heads, seq_new, spec.head_dim, rng);
  DeviceBuffer<int32_t> updated(ctx, size_t(spec.batch), "updated lengths");
  updated.fill_bytes(0xff);
  const std::vector<unsigned char> k_before = cache.k.to_host(), v_before = cache.v.to_host();

  AppendKvOptions options;
  options.updated_lengths = updated.data();
  if (rotary) options.rotary = rotary->view;
  append_kv(ctx, cache.view, k_new.view, v_new.view, options);
  ctx.synchronize();

  reference::KvCacheImage expected = cache.image;
  reference::append_kv(expected, k_new.values, v_new.values, seq_new, rotary ? &rotary->table : nullptr);
  // Which pool rows the append targets.
  std::vector<char> target(size_t(expected.num_pages) * expected.page_size, 0);
  for (int b = 0; b < spec.batch; ++b)
    for (int t = 0; t < seq_new; ++t) {
      const int page = expected.page_of(b, expected.length(b) + t);
      if (page >= 0) target[size_t(page) * expected.page_size + size_t((expected.length(b) + t) % expected.page_size)] = 1;
    }
  const size_t element = dtype_size(spec.dtype);
  for (int which = 0; which < 2; ++which) {
    const std::vector<unsigned char>& before = which == 0 ? k_before : v_before;
    const std::vector<unsigned char> after = (which == 0 ? cache.k : cache.v).to_host();
    const std::vector<double>& image = which == 0 ? expected.k : expected.v;
    std::vector<float> written;
    std::vector<double> wanted;
    for (int page = 0; page < expected.num_pages; ++page)
      for (int h = 0; h < expected.kv_heads; ++h)
        for (int row = 0; row < expected.page_size; ++row)
          for (int e = 0; e < expected.head_dim; ++e) {
            const size_t index = cache.device_index(page, h, row, e);
            if (target[size_t(page) * expected.page_size + size_t(row)]) {
              written.push_back(load_element(after.data(), spec.dtype, index));
              wanted.push_back(image[expected.offset(page, h, row) + size_t(e)]);
            } else if (std::memcmp(after.data() + index * element, before.data() + index * element, element) != 0) {
              return ::testing::AssertionFailure() << name << ": cache " << (which ? "v" : "k") << " page " << page
                                                   << " head " << h << " row " << row << " changed but is no new token's";
            }
          }
    // Without rotary the copy is exact; rotary computes in fp32 and rounds once to the dtype.
    testing::Expected judged = exact_copy(wanted);
    if (rotary && which == 0) {
      // x cos - y sin rounds in proportion to |x cos| + |y sin| <= sqrt(2) |(x, y)|, the norm of
      // its own pair (a rotation keeps it; the rotated value may be far smaller). Elements past
      // rotary_dim pass through and stay exact copies.
      const size_t d = size_t(expected.head_dim), rotary_dim = size_t(rotary->table.rotary_dim);
      const auto partner = [&](size_t e) {
        if (rotary->table.interleaved) return e ^ 1;
        return e < rotary_dim / 2 ? e + rotary_dim / 2 : e - rotary_dim / 2;
      };
      for (size_t row = 0; row < wanted.size() / d; ++row)
        for (size_t e = 0; e < rotary_dim; ++e) {
          const size_t i = row * d + e, j = row * d + partner(e);
          judged.allowed[i] = round_to(spec.dtype, float(wanted[i]));
          judged.scale[i] = std::sqrt(2 * (wanted[i] * wanted[i] + wanted[j] * wanted[j]));
          judged.floor[i] = testing::rounding_floor(spec.dtype, 4, judged.scale[i]);
        }
    }
    ::testing::AssertionResult result = judge_values(name + (which ? " v" : " k"), written, judged);
    if (!result) return result;
  }
  const std::vector<int32_t> new_lengths = updated.to_host();
  for (int b = 0; b < spec.batch; ++b) {
    const int wanted = std::min(expected.length(b) + seq_new, expected.capacity());
    if (new_lengths[size_t(b)] != wanted) {
      return ::testing::AssertionFailure() << name << ": updated_lengths[" << b << "] = " << new_lengths[size_t(b)]
                                           << ", expected " << wanted;
    }
  }
  // Attend with the updated lengths over what the device wrote (the reference fed the rounded cache).
  cache.image.k = download_pool(cache, cache.k);
  cache.image.v = download_pool(cache, cache.v);
  cache.image.lengths = new_lengths;
  cache.view.lengths = updated.data();
  return attend_and_check(ctx, c, cache, path, rng, rotary ? &*rotary : nullptr);
}

TEST(KvCacheAppend, AcrossPageBoundariesThenAttend) {
  Context ctx;
  // Lengths ending just before, on and after a page boundary; 7 new tokens cross it.
  EXPECT_TRUE(check_append_then_attend(ctx, paged(DType::f16, 4, 2, 64, 16, 3, {9, 15, 16, 0}), 4, 7, std::nullopt,
                                       Path::fused));
  EXPECT_TRUE(check_append_then_attend(ctx, paged(DType::bf16, 3, 1, 128, 16, 2, {0, 17, 31}, false), 8, 1,
                                       std::nullopt, Path::naive));
  // Page size 1: every token its own page.
  EXPECT_TRUE(check_append_then_attend(ctx, paged(DType::f32, 2, 2, 64, 1, 12, {0, 4}), 2, 7, std::nullopt,
                                       Path::cublas));
  // Contiguous, BSHD; the last sequence is full up to 3 slots: 4 of its 7 tokens are dropped.
  EXPECT_TRUE(check_append_then_attend(ctx, contiguous(DType::f16, 2, 2, 64, 23, {3, 20}, false), 2, 7, std::nullopt,
                                       Path::fused));
}

TEST(KvCacheAppend, RotaryOnKeysAndQueries) {
  Context ctx;
  EXPECT_TRUE(check_append_then_attend(ctx, paged(DType::f16, 2, 2, 64, 16, 2, {14, 3}), 4, 7,
                                       std::make_pair(64, true), Path::fused));
  EXPECT_TRUE(check_append_then_attend(ctx, paged(DType::f32, 2, 1, 64, 16, 2, {5, 16}), 2, 3,
                                       std::make_pair(48, false), Path::naive));
  EXPECT_TRUE(check_append_then_attend(ctx, contiguous(DType::bf16, 1, 1, 128, 20, {11}, true), 1, 1,
                                       std::make_pair(128, false), Path::cublas));
}

// Tokens with no element (no kv head, or head_dim 0) are still tokens: updated_lengths advances by
// seq_new, clamped to the capacity, and nothing else is written.
TEST(KvCacheAppend, TokensWithoutElementsStillAdvanceUpdatedLengths) {
  Context ctx;
  DeviceBuffer<int32_t> lengths(ctx, 2, "lengths"), updated(ctx, 2, "updated");
  lengths.copy_from_host(std::vector<int32_t>{5, 14});
  for (const auto& [kv_heads, head_dim] : {std::pair<int, int>{0, 64}, {2, 0}}) {
    updated.copy_from_host(std::vector<int32_t>{-99, -99});
    const TensorView cache_k = TensorView::bhsd(nullptr, DType::f16, 2, kv_heads, 16, head_dim);
    const TensorView k_new = TensorView::bhsd(nullptr, DType::f16, 2, kv_heads, 3, head_dim);
    AppendKvOptions options;
    options.updated_lengths = updated.data();
    append_kv(ctx, KvCache::contiguous(cache_k, cache_k, lengths.data()), k_new, k_new, options);
    EXPECT_EQ(updated.to_host(), (std::vector<int32_t>{8, 16})) << "kv_heads " << kv_heads << ", head_dim " << head_dim;
  }
}

// merge_states on two disjoint key sets: the two halves of a contiguous cache, attended separately
// on the device and merged, against the reference's merge of the reference halves. Sequence 1 has no
// key in part a (merged with a side of LSE -inf) and sequence 2 none at all (0 and -inf).
TEST(KvCacheMerge, DisjointKeySetsAgainstReference) {
  Context ctx;
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    for (bool in_place : {false, true}) {
      const int batch = 3, kv_heads = 2, heads = 4, d = 64, seq_q = 3, capacity = 40, split = 17;
      const std::string name = std::string("merge ") + to_string(dtype) + (in_place ? " in place" : "");
      std::mt19937_64 rng = rng_for(name);
      CacheSpec spec = contiguous(dtype, batch, kv_heads, d, capacity, {capacity, capacity, 0}, true);
      TestCache cache = make_cache(ctx, spec, rng);
      Tensor q = random_tensor(ctx, dtype, batch, heads, seq_q, d, rng);
      // Part a: rows [0, split) (lengths split, 0, 0); part b: rows [split, capacity) (a view that starts there).
      const std::vector<int32_t> lengths_a = {split, 0, 0}, lengths_b = {capacity - split, capacity - split, 0};
      DeviceBuffer<int32_t> a_lengths(ctx, 3, "lengths a"), b_lengths(ctx, 3, "lengths b");
      a_lengths.copy_from_host(lengths_a);
      b_lengths.copy_from_host(lengths_b);
      KvCache part_a = cache.view, part_b = cache.view;
      part_a.lengths = a_lengths.data();
      part_b.lengths = b_lengths.data();
      const size_t shift = size_t(split) * d * dtype_size(dtype);
      part_b.k.data = static_cast<unsigned char*>(cache.k.data()) + shift;
      part_b.v.data = static_cast<unsigned char*>(cache.v.data()) + shift;
      part_b.k.shape[2] = part_b.v.shape[2] = capacity - split;
      const size_t rows = size_t(batch) * heads * seq_q;
      DeviceBuffer<unsigned char> out_a = poisoned(ctx, dtype, rows * d), out_b = poisoned(ctx, dtype, rows * d);
      DeviceBuffer<float> lse_a(ctx, rows, "lse a"), lse_b(ctx, rows, "lse b");
      const TensorView view_a = TensorView::bhsd(out_a.data(), dtype, batch, heads, seq_q, d);
      const TensorView view_b = TensorView::bhsd(out_b.data(), dtype, batch, heads, seq_q, d);
      KvAttentionOptions options;
      options.causal = Causal::none;
      options.lse = lse_a.data();
      attention_with_kv_cache(ctx, q.view, part_a, view_a, options);
      options.lse = lse_b.data();
      attention_with_kv_cache(ctx, q.view, part_b, view_b, options);

      DeviceBuffer<unsigned char> merged = poisoned(ctx, dtype, rows * d);
      DeviceBuffer<float> merged_lse(ctx, rows, "merged lse");
      merged_lse.fill_bytes(0xff);
      const TensorView merged_view = in_place ? view_a : TensorView::bhsd(merged.data(), dtype, batch, heads, seq_q, d);
      float* merged_lse_ptr = in_place ? lse_a.data() : merged_lse.data();
      merge_states(ctx, view_a, lse_a.data(), view_b, lse_b.data(), merged_view, merged_lse_ptr);
      ctx.synchronize();

      reference::Problem problem;
      problem.batch = batch;
      problem.heads = heads;
      problem.kv_heads = kv_heads;
      problem.seq_q = seq_q;
      problem.head_dim = d;
      problem.causal = Causal::none;
      reference::KvCacheImage image_a = cache.image, image_b = cache.image;
      image_a.lengths = lengths_a;
      // Part b as its own contiguous cache: rows [split, capacity) of each sequence.
      image_b.page_size = capacity - split;
      image_b.lengths = lengths_b;
      image_b.k.clear();
      image_b.v.clear();
      for (int b = 0; b < batch; ++b)
        for (int h = 0; h < kv_heads; ++h)
          for (int t = split; t < capacity; ++t)
            for (int e = 0; e < d; ++e) {
              image_b.k.push_back(cache.image.k[cache.image.offset(b, h, t) + size_t(e)]);
              image_b.v.push_back(cache.image.v[cache.image.offset(b, h, t) + size_t(e)]);
            }
      const testing::AttentionExpected expected =
          expected_merge(expected_kv_attention(problem, q.values, image_a, dtype),
                         expected_kv_attention(problem, q.values, image_b, dtype), dtype);
      EXPECT_TRUE(judge_values(name + " out", download(in_place ? out_a : merged, dtype, rows * d), expected.out));
      const std::vector<float> lse = (in_place ? lse_a : merged_lse).to_host();
      EXPECT_TRUE(judge_values(name + " lse", lse, expected.lse));
    }
  }
}

// The same decode call (3 splits on the fused path) under two sim schedules: bitwise-equal out and lse (no atomics, fixed order).
std::vector<unsigned char> decode_once(Context& ctx, Path path, uint64_t schedule_seed) {
  std::mt19937_64 rng(77);
  const TestCache cache = make_cache(ctx, paged(DType::f16, 3, 2, 64, 16, 3, {1, 17, 40}), rng);
  Tensor q = random_tensor(ctx, DType::f16, 3, 4, 7, 64, rng);
  const size_t rows = 3 * 4 * 7;
  DeviceBuffer<unsigned char> out = poisoned(ctx, DType::f16, rows * 64);
  DeviceBuffer<float> lse(ctx, rows, "lse");
  sim::Options sim_options = sim::options();
  const sim::Options saved = sim_options;
  sim_options.seed = schedule_seed;
  sim::set_options(sim_options);
  KvAttentionOptions options;
  options.path = path;
  options.lse = lse.data();
  options.num_splits = path == Path::fused ? 3 : 0;  // partials and the combine too
  attention_with_kv_cache(ctx, q.view, cache.view, TensorView::bhsd(out.data(), DType::f16, 3, 4, 7, 64), options);
  ctx.synchronize();
  sim::set_options(saved);
  std::vector<unsigned char> bytes = out.to_host();
  const std::vector<float> lse_host = lse.to_host();
  const auto* lse_bytes = reinterpret_cast<const unsigned char*>(lse_host.data());
  bytes.insert(bytes.end(), lse_bytes, lse_bytes + lse_host.size() * sizeof(float));
  return bytes;
}

TEST(KvCacheDeterminism, BitwiseEqualUnderDifferentSchedules) {
  Context ctx;
  for (Path path : {Path::fused, Path::naive}) {
    const std::vector<unsigned char> first = decode_once(ctx, path, 11), second = decode_once(ctx, path, 12345);
    ASSERT_EQ(first.size(), second.size());
    EXPECT_EQ(std::memcmp(first.data(), second.data(), first.size()), 0) << to_string(path);
  }
}

}  // namespace
}  // namespace selfattn
