#pragma once
// Split-KV decode attention (flash-decoding), SIMT with fp32 arithmetic for every dtype: a block
// takes up to kRows query rows of one (sequence, kv head) group - the heads_per_kv query heads
// that share the kv head, times seq_q new rows - and one of num_splits ranges of the sequence's
// keys. It streams the range through shared memory in tiles of kKeys keys read straight from the
// cache (pages resolved per key by kv_pages.cuh, clamped), and keeps an online softmax per row:
// warp w owns rows j * kWarps + w (so the 4 rows of a GQA-4 decode group keep every warp busy),
// lane n scores key n of the tile, and each lane accumulates head_dim_v / 32 columns of O. Q and K
// rows are head_dim long, V's and O's head_dim_v (each up to kMaxHeadDim).
//
// The split's keys are decode_split_keys() (only the tiles a sliding window leaves); each row masks
// its own visible_key_range() and takes modified_score() (score_mods.cuh) when softcap, ALiBi or a
// bias change the values.
//
// T is q's and out's element, Cache the cache's: T itself, or FP8 (an FP8 KV cache), dequantized while
// staging - stored x its kv head's scale in fp32 - so everything after staging is the same.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "../common/primitives.cuh"
#include "../common/score_mods.cuh"
#include "../common/simt_tile.cuh"
#include "decode_split_keys.cuh"
#include "kv_cache_params.h"
#include "kv_pages.cuh"
#include "new_rows.cuh"

SELFATTN_KERNELS_BEGIN

struct DecodeSplitKvTraits {
  static constexpr int kThreads = 128;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kRows = 16;  // query rows per block (a whole GQA group of 8 heads x 2 rows)
  static constexpr int kRowsPerWarp = kRows / kWarps;
  static constexpr int kKeys = 32;  // one key per lane
  static constexpr int kMaxHeadDim = 256;
  static constexpr int kColsPerLane = kMaxHeadDim / 32;
  // Shared memory: fp32 Q [kRows][d], K [kKeys][d + 1] (the +1 spreads lane n's row n over
  // banks), V [kKeys][dv], P [kRows][kKeys] (an even number of floats in all: 48 d + 32 dv + 544),
  // then the tile's K and V row offsets, int64 [kKeys] each.
  __host__ __device__ static constexpr size_t smem_floats(int head_dim, int head_dim_v) {
    return size_t(kRows) * head_dim + size_t(kKeys) * (head_dim + 1) + size_t(kKeys) * head_dim_v +
           size_t(kRows) * kKeys;
  }
  __host__ __device__ static constexpr size_t smem_bytes(int head_dim, int head_dim_v) {
    return smem_floats(head_dim, head_dim_v) * sizeof(float) + 2 * size_t(kKeys) * sizeof(int64_t);
  }
};

// Stages one tile's K and V rows as fp32 (rows without a page as zeros), from the row offsets
// resolved once per key (K's rows d long, V's dv): 16-byte loads when `vectors` (the host checked
// that every row starts on 16 bytes and both widths fill whole 16-byte chunks), else one element
// per load. k_scale and v_scale multiply FP8 values (real value = stored x scale); other elements
// are staged as they are.
template <class T>
__device__ inline void decode_stage_tile(const T* k_cache, const T* v_cache, const int64_t* k_rows,
                                         const int64_t* v_rows, int d, int dv, bool vectors, float k_scale,
                                         float v_scale, float* k_s, float* v_s) {
  // Stored value to fp32: exact for f16/bf16/fp32; FP8 times its scale, one fp32 rounding.
  const auto k_real = [&](T x) { return IsFp8<T>::value ? to_float(x) * k_scale : to_float(x); };
  const auto v_real = [&](T x) { return IsFp8<T>::value ? to_float(x) * v_scale : to_float(x); };
  constexpr int N = DecodeSplitKvTraits::kKeys, kThreads = DecodeSplitKvTraits::kThreads;
  if (vectors) {
    constexpr int V = 16 / int(sizeof(T));
    const int k_chunks = d / V, v_chunks = dv / V, chunks = k_chunks > v_chunks ? k_chunks : v_chunks;
    for (int i = threadIdx.x; i < N * chunks; i += kThreads) {
      const int n = i / chunks, chunk = i % chunks, e0 = chunk * V;
      const bool live = k_rows[n] >= 0;
      if (chunk < k_chunks) {
        T k_values[V];
        if (live) {
          const uint4 k_raw = load_vector(reinterpret_cast<const uint4*>(k_cache + k_rows[n] + e0));
          memcpy(static_cast<void*>(k_values), &k_raw, 16);
        }
        // K's rows are padded by one float (the dot products' column reads), so its 4-byte stores
        // go 2-way: a quarter of a lane's 16 words share the banks of another's.
        for (int t = 0; t < V; ++t) k_s[n * (d + 1) + e0 + t] = live ? k_real(k_values[t]) : 0.0f;
      }
      if (chunk < v_chunks) {
        T v_values[V];
        if (live) {
          const uint4 v_raw = load_vector(reinterpret_cast<const uint4*>(v_cache + v_rows[n] + e0));
          memcpy(static_cast<void*>(v_values), &v_raw, 16);
        }
        // V's unpadded rows take 16-byte stores (v_s, dv and e0 are multiples of 4 floats here), a
        // quarter-warp filling 128 contiguous bytes; 4-byte ones would go 4-way (each lane's words
        // 4 apart, 2 rows in the same banks).
        float v_floats[V];
        for (int t = 0; t < V; ++t) v_floats[t] = live ? v_real(v_values[t]) : 0.0f;
        for (int t = 0; t < V; t += 4)
          store_vector(reinterpret_cast<float4*>(v_s + n * dv + e0 + t),
                       make_float4(v_floats[t], v_floats[t + 1], v_floats[t + 2], v_floats[t + 3]));
      }
    }
    return;
  }
  for (int i = threadIdx.x; i < N * d; i += kThreads) {
    const int n = i / d, e = i % d;
    k_s[n * (d + 1) + e] = k_rows[n] >= 0 ? k_real(k_cache[k_rows[n] + e]) : 0.0f;
  }
  for (int i = threadIdx.x; i < N * dv; i += kThreads) {
    const int n = i / dv, e = i % dv;
    v_s[n * dv + e] = k_rows[n] >= 0 ? v_real(v_cache[v_rows[n] + e]) : 0.0f;
  }
}

template <class T, class Cache = T>
__global__ void __launch_bounds__(DecodeSplitKvTraits::kThreads) decode_split_kv_kernel(const DecodeSplitKvParams p) {
  using Traits = DecodeSplitKvTraits;
  constexpr int RW = Traits::kRowsPerWarp, N = Traits::kKeys, C = Traits::kColsPerLane;
  const int split = int(blockIdx.x) % p.num_splits, row_block = int(blockIdx.x) / p.num_splits;
  const int kv_head = blockIdx.y, b = blockIdx.z;
  // The sequence's query rows (a packed call's sequences differ; the grid covers the longest).
  const SequenceRows rows = sequence_rows(p.q_rows, b);
  const int seq_q = rows.count;
  const int d = p.head_dim, dv = p.cache.head_dim_v, group_rows = p.heads_per_kv * seq_q;
  const int row0 = row_block * Traits::kRows;
  if (row0 >= group_rows) return;  // the whole block: no row of this sequence is its
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;

  const SequenceKeys sequence = sequence_keys(seq_q, kv_length(p.cache, b), p.causal, p.key_start, p.q_offset, b);
  const KeyRange split_keys = decode_split_keys(p, sequence, seq_q, split, N);
  const int key_begin = split_keys.begin, key_end = split_keys.end;

  float* q_s = dynamic_smem<float>();
  float* k_s = q_s + Traits::kRows * d;
  float* v_s = k_s + N * (d + 1);
  float* p_s = v_s + N * dv;
  int64_t* k_rows = reinterpret_cast<int64_t*>(q_s + Traits::smem_floats(d, dv));
  int64_t* v_rows = k_rows + N;

  // Q rows of the group (row g: query head kv_head * heads_per_kv + g / seq_q, new row g % seq_q);
  // rows past the group are zero and never stored.
  const T* q = static_cast<const T*>(p.q);
  for (int i = threadIdx.x; i < Traits::kRows * d; i += Traits::kThreads) {
    const int g = row0 + i / d, e = i % d;
    float value = 0.0f;
    if (g < group_rows) {
      const int head = kv_head * p.heads_per_kv + g / seq_q;
      value = to_float(q[int64_t(rows.entry) * p.q_stride_batch + int64_t(head) * p.q_stride_head +
                         int64_t(rows.first + g % seq_q) * p.q_stride_row + e]);
    }
    q_s[i] = value;
  }

  // Row j of this warp: its keys, aligned position and head's modifiers (rows past the group see none).
  KeyRange visible[RW];
  int aligned[RW];
  HeadScoreMods head_mods[RW];
  float row_max[RW], row_sum[RW], acc[RW][C];
  SELFATTN_UNROLL
  for (int j = 0; j < RW; ++j) {
    const int g = row0 + j * Traits::kWarps + warp, i = g % seq_q;
    visible[j] = g < group_rows ? visible_key_range(i, sequence, p.causal, p.mods.window_left, p.mods.window_right)
                                : KeyRange{0, 0};
    aligned[j] = aligned_key(i, sequence);
    head_mods[j] = head_score_mods(p.mods, b, kv_head * p.heads_per_kv + (g < group_rows ? g / seq_q : 0));
    row_max[j] = -INFINITY;
    row_sum[j] = 0.0f;
    SELFATTN_UNROLL
    for (int c = 0; c < C; ++c) acc[j][c] = 0.0f;
  }

  const Cache* k_cache = static_cast<const Cache*>(p.cache.k);
  const Cache* v_cache = static_cast<const Cache*>(p.cache.v);
  const KvScales scales = kv_scales<Cache>(p.cache, kv_head);
  // No barrier opens an iteration: the previous tile's row offsets were last read while staging,
  // before the barrier that ends staging; its K and V are last read before the barrier after the
  // offsets below, which every thread passes before restaging; Q is written before that barrier too.
  for (int key0 = key_begin; key0 < key_end; key0 += N) {
    if (threadIdx.x < N) {  // each key's page once per tile
      const int key = key0 + int(threadIdx.x);
      // Keys before key_start are padding: never read (staged as zeros).
      const int page = key >= sequence.begin && key < key_end ? kv_page_of(p.cache, b, key) : -1;
      k_rows[threadIdx.x] = page >= 0 ? kv_k_offset(p.cache, page, kv_head, key) : -1;
      v_rows[threadIdx.x] = page >= 0 ? kv_v_offset(p.cache, page, kv_head, key) : -1;
    }
    __syncthreads();
    decode_stage_tile(k_cache, v_cache, k_rows, v_rows, d, dv, p.vector_loads, scales.k, scales.v, k_s, v_s);
    __syncthreads();

    SELFATTN_UNROLL
    for (int j = 0; j < RW; ++j) {
      const int r = j * Traits::kWarps + warp;
      const int key = key0 + lane;
      float score = -INFINITY;
      if (key < key_end && key >= visible[j].begin && key < visible[j].end) {
        float dot = 0.0f;
        for (int e = 0; e < d; ++e) dot = fmaf(q_s[r * d + e], k_s[lane * (d + 1) + e], dot);
        score = p.mods.changes_values
                    ? modified_score(p.mods, head_mods[j], dot * p.scale, (row0 + r) % seq_q, aligned[j], key) * kLog2e
                    : dot * p.scale_log2;
      }
      const float tile_max = warp_reduce_max<32>(score);
      if (tile_max == -INFINITY) continue;  // warp-uniform: no key of this tile for this row
      const float new_max = fmaxf(row_max[j], tile_max);
      const float rescale = exp2f(row_max[j] - new_max);  // 0 on the row's first keys
      const float weight = exp2f(score - new_max);        // 0 for masked keys
      row_sum[j] = row_sum[j] * rescale + warp_reduce_sum<32>(weight);
      row_max[j] = new_max;
      p_s[r * N + lane] = weight;
      __syncwarp();
      SELFATTN_UNROLL
      for (int c = 0; c < C; ++c) {
        const int col = lane + 32 * c;
        if (col < dv) {
          float o = acc[j][c] * rescale;
          for (int n = 0; n < N; ++n) o = fmaf(p_s[r * N + n], v_s[n * dv + col], o);
          acc[j][c] = o;
        }
      }
      __syncwarp();  // P of row r is read by every lane before the next tile rewrites it
    }
  }

  SELFATTN_UNROLL
  for (int j = 0; j < RW; ++j) {
    const int g = row0 + j * Traits::kWarps + warp;
    if (g >= group_rows) continue;
    const int head = kv_head * p.heads_per_kv + g / seq_q, i = g % seq_q;
    const int64_t row = flat_row(p.q_rows, rows, p.heads, head, i);
    // One split holds the whole row, whose softmax ends here with the head's sink; a split's part
    // leaves the sink to decode_combine, which takes it once.
    const float sink = p.num_splits == 1 ? head_mods[j].sink : -INFINITY;
    const SoftmaxRowEnd end = softmax_row_end</*Log2=*/true>(row_max[j], row_sum[j], sink);
    if (p.num_splits == 1) {
      T* out = static_cast<T*>(p.out) + int64_t(rows.entry) * p.out_stride_batch + int64_t(head) * p.out_stride_head +
               int64_t(rows.first + i) * p.out_stride_row;
      SELFATTN_UNROLL
      for (int c = 0; c < C; ++c)
        if (lane + 32 * c < dv) out[lane + 32 * c] = from_float<T>(acc[j][c] * end.inverse);
      if (lane == 0 && p.lse != nullptr) p.lse[row] = end.lse;
    } else {
      float* out = p.partial_out + (int64_t(split) * p.rows + row) * dv;
      SELFATTN_UNROLL
      for (int c = 0; c < C; ++c)
        if (lane + 32 * c < dv) out[lane + 32 * c] = acc[j][c] * end.inverse;
      if (lane == 0) p.partial_lse[int64_t(split) * p.rows + row] = end.lse;
    }
  }
}

SELFATTN_KERNELS_END
