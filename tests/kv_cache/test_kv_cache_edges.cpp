// The edges of each KV-cache kernel's division of the work, on the sim, with sizes derived from the
// kernels' own traits (kernels/decode/*.cuh) rather than chosen: just below, at and above each
// edge. The split-KV decode kernels (SIMT: f32 and other head dims; tensor cores: f16/bf16 with
// head_dim 64/128) divide keys into tiles and splits and query rows into blocks; decode_combine
// strides head_dim over its threads and, past its grid's cap, rows over its blocks; rotary_rows
// and kv_gather take rows in fixed groups per block. Every tensor has its own layout
// (kv_cache_check.h).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/decode/decode_combine.cuh"
#include "kernels/decode/decode_split_kv.cuh"
#include "kernels/decode/decode_split_kv_mma.cuh"
#include "kernels/decode/kv_gather.cuh"
#include "kernels/decode/rotary_rows.cuh"
#include "kv_cache_check.h"
#include "runtime/context_state.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

using namespace kv_test;

constexpr int kSimtKeys = kernels::DecodeSplitKvTraits::kKeys;          // keys per tile, SIMT kernel
constexpr int kMmaKeys = kernels::DecodeSplitKvMmaTraits<64>::kKeys;    // keys per tile, tensor cores
constexpr int kDecodeRows = kernels::DecodeSplitKvTraits::kRows;        // query rows per block
static_assert(kernels::DecodeSplitKvMmaTraits<64>::kRows == kDecodeRows, "both decode kernels block rows alike");
static_assert(kMmaKeys % kSimtKeys == 0, "a sweep over one tensor-core tile covers every SIMT tile position too");

// A cache whose pages hold `lengths`, 16-row pages, as few per sequence as the longest needs.
CacheSpec cache_for(DType dtype, int kv_heads, int head_dim, const std::vector<int32_t>& lengths) {
  int longest = 1;
  for (int32_t length : lengths) longest = std::max(longest, int(length));
  return paged(dtype, int(lengths.size()), kv_heads, head_dim, 16, (longest + 15) / 16, lengths);
}

// f32 takes the SIMT kernel, f16 with head_dim 64 the tensor-core one (its rows are on 16 bytes in
// every default layout).
struct DecodeKernelCase {
  DType dtype;
  int tile_keys;
};
const DecodeKernelCase kDecodeKernels[] = {{DType::f32, kSimtKeys}, {DType::f16, kMmaKeys}};

// A sliding window whose first key - the first key a split reads (decode_split_keys rounds it down
// to its tile) - and whose last key fall at every position within a key tile: one sequence per
// position, lengths 2 tiles + j for j in [0, tile), two query rows each (their own edges one apart).
TEST(KvCacheEdges, WindowEdgeAtEveryPositionOfATile) {
  Context ctx;
  testing::ScoreModsCase window;
  window.window_left = 10;
  window.window_right = -1;
  for (const DecodeKernelCase& kernel : kDecodeKernels) {
    std::vector<int32_t> lengths;
    for (int j = 0; j < kernel.tile_keys; ++j) lengths.push_back(2 * kernel.tile_keys + j);
    // 3 splits over the window's one or two tiles: a split holding the edge tile, empty ones after.
    AttendCase c = attend(cache_for(kernel.dtype, 1, 64, lengths), 1, 2);
    c.mods = window;
    c.num_splits = 3;
    EXPECT_TRUE(check_attend(ctx, c, Path::fused));
  }
}

// Splits of whole key tiles: lengths one key below, at and above 3 and 6 tiles, so that with 3 and
// 4 splits a split ends exactly at the last key, one short of it, or holds a single key of a tile.
TEST(KvCacheEdges, LengthsAroundSplitAndTileEdges) {
  Context ctx;
  for (const DecodeKernelCase& kernel : kDecodeKernels) {
    const int t = kernel.tile_keys;
    for (int splits : {3, 4}) {
      AttendCase c = attend(cache_for(kernel.dtype, 1, 64, {3 * t - 1, 3 * t, 3 * t + 1, 6 * t - 1, 6 * t + 1}), 2, 1);
      c.num_splits = splits;
      EXPECT_TRUE(check_attend(ctx, c, Path::fused));
    }
  }
}

// Query rows of one kv head's group (heads per kv head x new rows) one below, at and one above a
// block's rows, and past two blocks: rows beyond the first block, and in the SIMT kernel beyond each
// warp's first share (warp w owns rows w, w + kWarps, ...).
TEST(KvCacheEdges, GroupRowsAroundEachBlock) {
  Context ctx;
  struct Group {
    int heads_per_kv, seq_q;
  };
  const Group groups[] = {{1, kDecodeRows - 1}, {2, kDecodeRows / 2}, {1, kDecodeRows + 1}, {3, 2 * kDecodeRows / 3 + 1}};
  for (const DecodeKernelCase& kernel : kDecodeKernels)
    for (const Group& group : groups) {
      AttendCase c = attend(cache_for(kernel.dtype, 2, 64, {kernel.tile_keys + 5, 2 * kDecodeRows + 3}),
                            2 * group.heads_per_kv, group.seq_q);
      c.num_splits = 2;
      EXPECT_TRUE(check_attend(ctx, c, Path::fused));
    }
}

// The host takes the tensor-core kernel only when q, K and V rows all start on 16 bytes, and
// 16-byte loads of K and V only when both do: each of them in turn off 16 bytes (a row pad of one
// element), the other two on them. The sim refuses a misaligned 16-byte load, as the GPU faults.
TEST(KvCacheEdges, OneTensorOffSixteenBytes) {
  Context ctx;
  for (int off : {0, 1, 2}) {
    AttendCase c = attend(cache_for(DType::f16, 2, 64, {kMmaKeys + 3, 9}), 4, 3);
    (off == 0 ? c.q_layout : off == 1 ? c.cache.k_layout : c.cache.v_layout).row_pad = 1;
    c.num_splits = 2;
    EXPECT_TRUE(check_attend(ctx, c, Path::fused));
  }
}

// decode_combine: a block per row, its threads striding over head_dim - head dims just above one
// pass and two full passes of DecodeCombineTraits::kThreads (the SIMT kernel's largest).
TEST(KvCacheEdges, CombineHeadDimBeyondOnePassOfThreads) {
  Context ctx;
  constexpr int kCombineThreads = kernels::DecodeCombineTraits::kThreads;
  static_assert(2 * kCombineThreads <= kernels::DecodeSplitKvTraits::kMaxHeadDim, "the split-KV kernel takes it");
  for (int head_dim : {kCombineThreads + 8, 2 * kCombineThreads}) {
    AttendCase c = attend(cache_for(DType::f16, 1, head_dim, {3 * kSimtKeys + 7, 40}), 2, 2);
    c.num_splits = 3;
    EXPECT_TRUE(check_attend(ctx, c, Path::fused));
  }
}

// decode_combine weighs the splits kThreads at a time (one weight a thread, in shared memory):
// split counts one below, at and one above a chunk and past two, most of the splits empty (the
// cache holds fewer tiles than splits), so chunk boundaries fall among empty and full splits.
TEST(KvCacheEdges, CombineSplitsAroundEachChunkOfWeights) {
  Context ctx;
  constexpr int kCombineThreads = kernels::DecodeCombineTraits::kThreads;
  for (int splits : {kCombineThreads - 1, kCombineThreads, kCombineThreads + 1, 2 * kCombineThreads + 1}) {
    AttendCase c = attend(cache_for(DType::f16, 2, 64, {3 * kSimtKeys + 7, 40}), 2, 1);
    c.num_splits = splits;
    EXPECT_TRUE(check_attend(ctx, c, Path::fused)) << splits << " splits";
  }
}

// decode_combine takes one block per row up to a grid cap (ContextState::decode_combine_max_blocks:
// 2^20 blocks, more rows than the sim can run), and each block then strides over the rows past
// the grid, rewriting its shared weights for every row behind the barrier that opens each chunk
// of them. With the cap lowered to 1 and 5 blocks for 2 sequences x 4 heads x 3 rows = 24 rows, a
// block serves all 24 rows, or 4 to 5 in turn: the racecheck sees a row's weights written while
// another thread still reads the previous row's, and every row's out, lse and sink are judged.
// Both split-KV kernels with 3 splits (one chunk), and one chunk and a split (kThreads + 1).
TEST(KvCacheEdges, CombineBlockServesSeveralRows) {
  Context ctx;
  constexpr int kCombineThreads = kernels::DecodeCombineTraits::kThreads;
  for (int64_t blocks : {1, 5}) {
    ctx.state().decode_combine_max_blocks = blocks;
    for (const DecodeKernelCase& kernel : kDecodeKernels) {
      AttendCase c = attend(cache_for(kernel.dtype, 2, 64, {3 * kernel.tile_keys + 7, 40}), 4, 3);
      c.num_splits = 3;
      c.mods.sinks = blocks == 5;
      EXPECT_TRUE(check_attend(ctx, c, Path::fused)) << blocks << " combine blocks";
    }
    AttendCase c = attend(cache_for(DType::f16, 1, 64, {3 * kSimtKeys + 7, 40}), 2, 2);
    c.num_splits = kCombineThreads + 1;
    EXPECT_TRUE(check_attend(ctx, c, Path::fused)) << blocks << " combine blocks, " << c.num_splits << " splits";
  }
}

// rotary_rows rotates q in groups of RotaryRowsTraits::kRowsPerBlock rows per block: new rows one
// below, at and above a group, the longest sequence's last row at the tables' last row
// (check_attend's tables end there).
TEST(KvCacheEdges, RotaryRowsAroundEachBlock) {
  Context ctx;
  constexpr int kRows = kernels::RotaryRowsTraits::kRowsPerBlock;
  for (int seq_q : {kRows - 1, kRows, kRows + 1}) {
    AttendCase c = attend(cache_for(DType::bf16, 2, 64, {seq_q + 20, 2 * seq_q + 1}), 4, seq_q);
    c.rotary = std::make_pair(48, seq_q % 2 == 0);
    for (Path path : {Path::fused, Path::naive}) EXPECT_TRUE(check_attend(ctx, c, path));
  }
}

// kv_gather copies KvGatherTraits::kRowsPerBlock rows per block up to the capacity: capacities one
// below, at and above a group (contiguous caches, whose capacity is the page), and paged with pages
// of group + 1 rows, the last sequence ending inside its last page.
TEST(KvCacheEdges, GatherCapacityAroundEachBlock) {
  Context ctx;
  constexpr int kRows = kernels::KvGatherTraits::kRowsPerBlock;
  for (int capacity : {kRows - 1, kRows, kRows + 1}) {
    AttendCase c = attend(contiguous(DType::f16, 2, 1, 64, capacity, {capacity, capacity - 1}, capacity % 2 == 0), 2, 1);
    EXPECT_TRUE(check_attend(ctx, c, Path::naive));
  }
  AttendCase c = attend(paged(DType::f32, 3, 2, 32, kRows + 1, 3, {3 * (kRows + 1), 2 * (kRows + 1) + 1, kRows}), 2, 2);
  for (Path path : {Path::naive, Path::cublas}) EXPECT_TRUE(check_attend(ctx, c, path));
}

// A cache with no slot at all (capacity 0): every row is 0 and its LSE -inf, or its head's sink
// logit, on every path, dense and packed (kv_cache.cpp writes them as attention() writes a call
// without keys; no kernel reads the cache).
TEST(KvCacheEdges, NoCacheSlot) {
  Context ctx;
  constexpr int kBatch = 2, kHeads = 4, kKvHeads = 2, kSeqQ = 3, kDim = 16;
  constexpr int kRows = kBatch * kHeads * kSeqQ;
  DeviceBuffer<float> q(ctx, kRows * kDim), out(ctx, kRows * kDim), lse(ctx, kRows), sinks(ctx, kHeads);
  q.copy_from_host(std::vector<float>(q.size(), 0.5f));
  const std::vector<float> sink_logits = {0.5f, -INFINITY, 1.25f, -INFINITY};
  sinks.copy_from_host(sink_logits);
  DeviceBuffer<int32_t> lengths(ctx, kBatch), cu_seqlens(ctx, kBatch + 1);
  lengths.copy_from_host(std::vector<int32_t>(kBatch, 0));
  // Packed: sequence 0 has 1 row, sequence 1 has 5 (kRows / kHeads = 6 rows in all).
  cu_seqlens.copy_from_host(std::vector<int32_t>{0, 1, kBatch * kSeqQ});
  KvCache cache;
  cache.k = cache.v = TensorView::bhsd(nullptr, DType::f32, kBatch, kKvHeads, 0, kDim);
  cache.batch = kBatch;
  cache.lengths = lengths.data();
  for (bool packed : {false, true}) {
    const TensorView q_view = packed ? TensorView::bshd(q.data(), DType::f32, 1, kHeads, kBatch * kSeqQ, kDim)
                                     : TensorView::bhsd(q.data(), DType::f32, kBatch, kHeads, kSeqQ, kDim);
    TensorView out_view = q_view;
    out_view.data = out.data();
    for (Path path : {Path::automatic, Path::naive, Path::cublas, Path::fused})
      for (bool with_sinks : {false, true}) {
        out.fill_bytes(0xFF);
        lse.fill_bytes(0xFF);
        KvAttentionOptions options;
        options.path = path;
        options.lse = lse.data();
        options.sinks = with_sinks ? sinks.data() : nullptr;
        if (packed) {
          attention_with_kv_cache_varlen(ctx, q_view, cu_seqlens.data(), 5, cache, out_view, options);
        } else {
          attention_with_kv_cache(ctx, q_view, cache, out_view, options);
        }
        const std::string what = std::string(packed ? "packed " : "dense ") + to_string(path) +
                                 (with_sinks ? " with sinks" : "");
        for (float x : out.to_host()) ASSERT_EQ(x, 0.0f) << what;
        // lse: [batch, heads, seq_q], or [heads, total_q] packed; the head is the row's.
        const std::vector<float> lse_host = lse.to_host();
        for (int row = 0; row < kRows; ++row) {
          const int head = packed ? row / (kBatch * kSeqQ) : row / kSeqQ % kHeads;
          const float expected = with_sinks ? sink_logits[size_t(head)] : -INFINITY;
          ASSERT_EQ(lse_host[size_t(row)], expected) << what << ", lse row " << row;
        }
      }
  }
}

}  // namespace
}  // namespace selfattn
