// Attention over contiguous and paged caches (kv_cache.h), every path, and determinism across
// schedules; GPU-sized caches on the cuda backend (KvCacheOnGpu). append_kv:
// test_kv_cache_append.cpp; merge_states: test_kv_cache_merge.cpp; the decode kernels'
// work-division edges: test_kv_cache_edges.cpp; bad arguments and wrong device metadata:
// validation/test_kv_cache_arguments.cpp. Every tensor of a call has its own layout
// (kv_cache_check.h's defaults).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include <selfattn_sim/sim.h>

#include "gpu_sized.h"
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

// Left padding (key_start: NaN rows before it, never read) and query rows placed by q_offset
// (a static cache: lengths cover every slot, the rows at the positions they hold), alone and
// together, every path; paged and contiguous; starts inside a page, on a page boundary and at the
// length; with a window, ALiBi and a bias on the split-KV kernels with 1 and 3 splits.
TEST(KvCacheAttention, LeftPaddingAndQueryOffsetEveryPath) {
  Context ctx;
  std::vector<AttendCase> cases;
  CacheSpec left_padded = paged(DType::f16, 3, 2, 64, 16, 5, {70, 37, 16});
  left_padded.key_start = {20, 0, 16};
  cases.push_back(attend(left_padded, 4, 3));
  AttendCase placed = attend(left_padded, 4, 3);
  placed.q_offset = {40, 30, 0};
  cases.push_back(placed);
  CacheSpec contiguous_padded = contiguous(DType::f32, 2, 1, 32, 45, {45, 12}, true);
  contiguous_padded.key_start = {44, 3};
  AttendCase none_placed = attend(contiguous_padded, 2, 2, Causal::none);
  none_placed.q_offset = {0, 5};
  cases.push_back(none_placed);
  AttendCase static_cache = attend(paged(DType::bf16, 2, 1, 128, 16, 4, {64, 64}, false), 2, 5);
  static_cache.q_offset = {10, 59};
  cases.push_back(static_cache);
  for (const AttendCase& c : cases)
    for (Path path : kPaths) EXPECT_TRUE(check_attend(ctx, c, path));

  testing::ScoreModsCase mods;
  mods.window_left = 30;
  mods.alibi = testing::AlibiSlopes::heads;
  mods.bias = testing::BiasLayout::full;
  mods.masked_key_period = 6;
  for (DType dtype : {DType::f16, DType::f32})
    for (int splits : {1, 3}) {
      CacheSpec spec = paged(dtype, 2, 1, 64, 16, 13, {200, 113});
      spec.key_start = {37, 100};
      AttendCase c = attend(spec, 4, 7);
      c.q_offset = {150, 6};
      c.mods = mods;
      c.num_splits = splits;
      EXPECT_TRUE(check_attend(ctx, c, Path::fused));
    }
}

// Pages shared between sequences (a common first page) and appearing in any order.
// A batch index on a contiguous cache (KvCache::batch_index): two sequences read one row, a row
// outside the cache reads as no token, every path.
TEST(KvCacheAttention, BatchIndexEveryPath) {
  Context ctx;
  CacheSpec spec = contiguous(DType::bf16, 4, 2, 64, 33, {33, 10, 0, 21}, true);
  spec.batch_index = {2, 2, 0, 5};
  spec.cache_rows = 3;
  for (Path path : kPaths) EXPECT_TRUE(check_attend(ctx, attend(spec, 4, 3), path));
  // validate_metadata names a row outside the cache.
  std::mt19937_64 rng = rng_for("batch index metadata");
  TestCache cache = make_cache(ctx, spec, rng);
  Tensor q = random_tensor(ctx, DType::bf16, 4, 4, 3, 64, rng, kQueryLayout);
  Output out = poisoned_output(ctx, DType::bf16, 4, 4, 3, 64, kOutLayout);
  KvAttentionOptions options;
  options.validate_metadata = true;
  try {
    attention_with_kv_cache(ctx, q.view, cache.view, out.view, options);
    ADD_FAILURE() << "a batch index outside the cache passed validate_metadata";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("cache.batch_index[3] expected a row in [0, 3) (cache.k.shape[0]), got 5 "
                                         "(validate_metadata; without it the kernels read no token from it and "
                                         "write none to it)"),
              std::string::npos)
        << e.what();
  }
}

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
// -inf columns and, with 3 rows and period 3, a fully masked last row (output 0, LSE -inf); once
// more as a boolean mask.
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
  testing::ScoreModsCase mask = bias;  // the same masked columns and row as booleans
  mask.bias_bool = true;
  mods.push_back(mask);
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

// The same decode call (3 splits on the fused path) under two sim schedules: bitwise-equal out and lse (no atomics, fixed order).
std::vector<unsigned char> decode_once(Context& ctx, Path path, uint64_t schedule_seed) {
  std::mt19937_64 rng(77);
  const TestCache cache = make_cache(ctx, paged(DType::f16, 3, 2, 64, 16, 3, {1, 17, 40}), rng);
  Tensor q = random_tensor(ctx, DType::f16, 3, 4, 7, 64, rng, kQueryLayout);
  const size_t rows = 3 * 4 * 7;
  const Output out = poisoned_output(ctx, DType::f16, 3, 4, 7, 64, kOutLayout);
  DeviceBuffer<float> lse(ctx, rows, "lse");
  sim::Options sim_options = sim::options();
  const sim::Options saved = sim_options;
  sim_options.seed = schedule_seed;
  sim::set_options(sim_options);
  KvAttentionOptions options;
  options.path = path;
  options.lse = lse.data();
  options.num_splits = path == Path::fused ? 3 : 0;  // partials and the combine too
  attention_with_kv_cache(ctx, q.view, cache.view, out.view, options);
  ctx.synchronize();
  sim::set_options(saved);
  std::vector<unsigned char> bytes = out.device.to_host();
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

// GPU-sized (support/gpu_sized.h): caches of thousands of tokens, many splits, every path, and CUB's
// scan behind cu_seqlens_from_lengths (kernels the cuda backend alone runs).
using KvCacheOnGpu = testing::GpuSized<>;

TEST_F(KvCacheOnGpu, PagedAndContiguousEveryPath) {
  const std::vector<AttendCase> cases = {
      attend(paged(DType::f32, 5, 1, 64, 16, 3, {0, 1, 15, 16, 17}), 4, 1),
      attend(paged(DType::f16, 5, 1, 128, 16, 3, {17, 16, 15, 1, 0}, false), 8, 7),
      attend(paged(DType::bf16, 4, 2, 64, 1, 20, {0, 1, 2, 19}), 2, 7),
      attend(paged(DType::f16, 4, 2, 64, 256, 2, {255, 256, 257, 1}, false), 8, 1),
      attend(paged(DType::bf16, 2, 1, 256, 16, 2, {9, 31}), 2, 3, Causal::none),
      attend(contiguous(DType::f16, 3, 2, 128, 40, {0, 33, 40}, false), 4, 7, Causal::none),
  };
  for (const AttendCase& c : cases)
    for (Path path : {Path::naive, Path::cublas, Path::fused}) EXPECT_TRUE(check_attend(ctx, c, path));
}

// Decode-sized caches: 1 and 4 new rows, GQA 4 and 8, d 128, splits automatic and forced.
TEST_F(KvCacheOnGpu, LargerDecodeSplitCounts) {
  for (int splits : {0, 1, 7, 200}) {
    for (DType dtype : {DType::bf16, DType::f16}) {
      AttendCase c = attend(paged(dtype, 6, 2, 128, 16, 200, {0, 1, 1000, 3199, 3200, 2047}, false), 8, 1);
      c.num_splits = splits;
      EXPECT_TRUE(check_attend(ctx, c, Path::fused));
      AttendCase spec = attend(paged(dtype, 3, 1, 128, 64, 40, {2500, 63, 64}), 8, 4);
      spec.num_splits = splits;
      EXPECT_TRUE(check_attend(ctx, spec, Path::fused));
    }
  }
}

// Masks and score modifiers over decode-sized caches: a window of 256 over 3200 tokens (the
// split-KV kernel reads only its tiles), softcap, ALiBi and a bias with -inf columns, alone and
// together, every path, splits automatic and forced.
TEST_F(KvCacheOnGpu, ScoreModsEveryPath) {
  testing::ScoreModsCase window;
  window.window_left = 256;
  window.window_right = 0;
  testing::ScoreModsCase all = window;
  all.softcap = 30.0f;
  all.alibi = testing::AlibiSlopes::batch_heads;
  all.bias = testing::BiasLayout::heads;
  all.masked_key_period = 9;
  for (const testing::ScoreModsCase& mods : {window, all}) {
    for (int splits : {0, 7}) {
      AttendCase c = attend(paged(DType::bf16, 3, 2, 128, 16, 200, {3200, 255, 1000}, false), 8, 4);
      c.num_splits = splits;
      c.mods = mods;
      for (Path path : {Path::naive, Path::cublas, Path::fused}) EXPECT_TRUE(check_attend(ctx, c, path));
      AttendCase f32 = attend(contiguous(DType::f32, 2, 1, 64, 700, {700, 300}, true), 4, 3, Causal::none);
      f32.num_splits = splits;
      f32.mods = mods;
      EXPECT_TRUE(check_attend(ctx, f32, Path::fused));
    }
  }
}

// CUB's device scan behind cu_seqlens_from_lengths.
TEST_F(KvCacheOnGpu, CuSeqlensFromLengths) {
  std::vector<int32_t> lengths(1000), expected(1001, 0);
  for (size_t i = 0; i < lengths.size(); ++i) {
    lengths[i] = int32_t(i * 7 % 13);
    expected[i + 1] = expected[i] + lengths[i];
  }
  DeviceBuffer<int32_t> device_lengths(ctx, lengths.size(), "lengths"), cu(ctx, expected.size(), "cu_seqlens");
  device_lengths.copy_from_host(lengths);
  cu.fill_bytes(0xff);
  cu_seqlens_from_lengths(ctx, device_lengths.data(), int(lengths.size()), cu.data());
  EXPECT_EQ(cu.to_host(), expected);
}

}  // namespace
}  // namespace selfattn
