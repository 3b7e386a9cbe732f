#pragma once
// Split-KV decode attention on tensor cores (f16/bf16; head_dim 64 or 128; every K/V and q row on
// 16 bytes). Same work split and results as decode_split_kv.cuh (the SIMT kernel, which takes
// everything else): a block holds up to 16 query rows of one (sequence, kv head) group and one of
// num_splits ranges of the sequence's keys (decode_split_keys: only the tiles a sliding window
// leaves), each row masking its own visible_key_range() and taking modified_score().
//
// Per tile of 64 keys the block stages K and V as 16-bit values (16-byte loads from rows resolved
// once per key, rows without a page as zeros); warp w takes keys [16 w, 16 w + 16) of the tile:
//   S[16 x 16] = Q K^T       mma m16n8k16, Q's A fragments held in registers for the whole range
//   online softmax per row   in the S accumulators (lanes 4g..4g+3 share rows g and g + 8)
//   O[16 x d] += P V         P repacked from the S accumulators into an A fragment, V by ldmatrix.trans
// Each warp keeps its own (max, sum, O) over its keys; at the end the four are merged through
// shared memory (reusing the K/V space) and written as out/lse (one split) or as the split's
// normalised fp32 partial (decode_combine merges the splits).
//
// Cache is the cache's element: T itself, or FP8 (an FP8 KV cache; every K/V row on 8 bytes): each
// 8-byte chunk of 8 values is dequantized while staging - stored x its kv head's scale in fp32,
// rounded once to T - into the same 16-bit tiles, so the mma loop is unchanged and reads half the
// bytes of a 16-bit cache from memory.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "../common/mma_tile.cuh"
#include "../common/primitives.cuh"
#include "../common/primitives_fragments.cuh"
#include "../common/score_mods.cuh"
#include "../common/simt_tile.cuh"
#include "decode_mma_rows.cuh"
#include "decode_split_keys.cuh"
#include "kv_cache_params.h"
#include "kv_pages.cuh"
#include "new_rows.cuh"

SELFATTN_KERNELS_BEGIN

template <int D>
struct DecodeSplitKvMmaTraits {
  static_assert(D % 16 == 0, "head_dim a multiple of 16");
  static constexpr int kThreads = 128;
  static constexpr int kWarps = 4;
  static constexpr int kRows = 16;
  static constexpr int kKeys = 16 * kWarps;  // per tile
  static constexpr int kLd = D + 8;          // 16-bit elements per staged row: 16-byte rows, ldmatrix rows spread over banks
  static constexpr size_t kQBytes = size_t(kRows) * kLd * 2;
  static constexpr size_t kKvBytes = 2 * size_t(kKeys) * kLd * 2;
  // After the key loop: the warps' O [kWarps][kRows][kMergeLd] and max, sum [kWarps][kRows], fp32.
  // O's rows padded by 8 floats: a half-warp's 8-byte stores of an accumulator pair (4 rows x 4
  // column pairs) then fill 32 distinct banks; unpadded, the 8 rows of D floats (a multiple of 32
  // words) share 4 banks, 8 wavefronts per store where 2 will do.
  static constexpr int kMergeLd = D + 8;
  static constexpr size_t kMergeBytes = (size_t(kWarps) * kRows * kMergeLd + 2 * size_t(kWarps) * kRows) * 4;
  static constexpr size_t kSharedBytes = kKvBytes > kMergeBytes ? kKvBytes : kMergeBytes;
  static constexpr size_t kSmemBytes = kQBytes + kSharedBytes + 2 * size_t(kKeys) * sizeof(int64_t);
};

// One staged chunk of 8 elements (16 bytes of T): a 16-byte load from a 16-bit cache, or an 8-byte
// load of 8 FP8 values dequantized (x scale in fp32, rounded to T).
template <class T, class Cache>
__device__ inline uint4 decode_mma_chunk(const Cache* row, float scale) {
  if constexpr (IsFp8<Cache>::value) {
    const uint2 raw = load_vector(reinterpret_cast<const uint2*>(row));
    Cache values[8];
    memcpy(static_cast<void*>(values), &raw, 8);
    uint32_t words[4];
    for (int i = 0; i < 4; ++i)
      words[i] = pack2<T>(to_float(values[2 * i]) * scale, to_float(values[2 * i + 1]) * scale);
    return make_uint4(words[0], words[1], words[2], words[3]);
  } else {
    (void)scale;
    return load_vector(reinterpret_cast<const uint4*>(row));
  }
}

template <class T, int D, class Cache = T>
__global__ void __launch_bounds__(128) decode_split_kv_mma_kernel(const DecodeSplitKvParams p) {
  using Traits = DecodeSplitKvMmaTraits<D>;
  constexpr int N = Traits::kKeys, LD = Traits::kLd, R = Traits::kRows, W = Traits::kWarps;
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  const int split = int(blockIdx.x) % p.num_splits, row_block = int(blockIdx.x) / p.num_splits;
  const int kv_head = blockIdx.y, b = blockIdx.z;
  // The sequence's query rows (a packed call's sequences differ; the grid covers the longest).
  const SequenceRows rows = sequence_rows(p.q_rows, b);
  const int seq_q = rows.count;
  const int group_rows = p.heads_per_kv * seq_q;
  const int row0 = row_block * R;
  if (row0 >= group_rows) return;  // the whole block: no row of this sequence is its
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  const int g = lane / 4, t = lane % 4;  // mma fragment coordinates: rows g and g + 8, columns 2t, 2t + 1

  const SequenceKeys sequence = sequence_keys(seq_q, kv_length(p.cache, b), p.causal, p.key_start, p.q_offset, b);
  const KeyRange split_keys = decode_split_keys(p, sequence, seq_q, split, N);
  const int key_begin = split_keys.begin, key_end = split_keys.end;

  unsigned char* smem = dynamic_smem<unsigned char>();
  T* q_s = reinterpret_cast<T*>(smem);
  T* k_s = reinterpret_cast<T*>(smem + Traits::kQBytes);
  T* v_s = k_s + N * LD;
  float* o_merge = reinterpret_cast<float*>(smem + Traits::kQBytes);
  float* max_merge = o_merge + W * R * Traits::kMergeLd;
  float* sum_merge = max_merge + W * R;
  int64_t* k_rows = reinterpret_cast<int64_t*>(smem + Traits::kQBytes + Traits::kSharedBytes);
  int64_t* v_rows = k_rows + N;

  // Q rows of the group, zeros past it.
  decode_mma_stage_q<D, LD, Traits::kThreads>(p, rows, q_s, kv_head, row0, group_rows, seq_q);
  __syncthreads();
  uint32_t q_frag[D / 16][4];
  for (int k0 = 0; k0 < D; k0 += 16) load_a(q_frag[k0 / 16], q_s, LD, 0, k0);

  // Rows g and g + 8: what scores their keys, and their online softmax.
  const DecodeMmaRows row_keys = decode_mma_rows(p, sequence, b, kv_head, row0, group_rows, seq_q);
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f}, acc[D / 8][4];
  for (int n = 0; n < D / 8; ++n)
    for (int i = 0; i < 4; ++i) acc[n][i] = 0.0f;

  const Cache* k_cache = static_cast<const Cache*>(p.cache.k);
  const Cache* v_cache = static_cast<const Cache*>(p.cache.v);
  const KvScales scales = kv_scales<Cache>(p.cache, kv_head);
  // No barrier opens an iteration: the previous tile's row offsets were last read while staging,
  // before the barrier that ends staging, and its K and V before the barrier after the offsets
  // below, which every thread (a warp that skipped its keys too) passes before restaging.
  for (int key0 = key_begin; key0 < key_end; key0 += N) {
    if (threadIdx.x < N) {
      const int key = key0 + int(threadIdx.x);
      // Keys before key_start are padding: never read (staged as zeros).
      const int page = key >= sequence.begin && key < key_end ? kv_page_of(p.cache, b, key) : -1;
      k_rows[threadIdx.x] = page >= 0 ? kv_k_offset(p.cache, page, kv_head, key) : -1;
      v_rows[threadIdx.x] = page >= 0 ? kv_v_offset(p.cache, page, kv_head, key) : -1;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < N * kChunks; i += Traits::kThreads) {
      const int n = i / kChunks, c = (i % kChunks) * 8;
      uint4 k_chunk = make_uint4(0, 0, 0, 0), v_chunk = make_uint4(0, 0, 0, 0);
      if (k_rows[n] >= 0) {
        k_chunk = decode_mma_chunk<T>(k_cache + k_rows[n] + c, scales.k);
        v_chunk = decode_mma_chunk<T>(v_cache + v_rows[n] + c, scales.v);
      }
      store_vector(reinterpret_cast<uint4*>(k_s + n * LD + c), k_chunk);
      store_vector(reinterpret_cast<uint4*>(v_s + n * LD + c), v_chunk);
    }
    __syncthreads();
    const int kb = warp * 16;  // this warp's keys of the tile
    if (key0 + kb >= key_end) continue;  // warp-uniform; the warp still reaches the next tile's barriers

    float s[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
    for (int k0 = 0; k0 < D; k0 += 16) {
      uint32_t kf[4];
      load_b_from_nk(kf, k_s, LD, kb, k0);
      const uint32_t low[2] = {kf[0], kf[1]}, high[2] = {kf[2], kf[3]};
      mma_m16n8k16<T>(s[0], q_frag[k0 / 16], low, s[0]);
      mma_m16n8k16<T>(s[1], q_frag[k0 / 16], high, s[1]);
    }
    // Accumulator i of n8 tile j: row g + 8 (i / 2), key kb + 8 j + 2 t + i % 2.
    float prob[2][4];
    for (int h = 0; h < 2; ++h) {
      float tile_max = -INFINITY;
      for (int j = 0; j < 2; ++j)
        for (int i = 2 * h; i < 2 * h + 2; ++i) {
          s[j][i] = decode_mma_score(p, row_keys, h, key0 + kb + 8 * j + 2 * t + i % 2, key_end, s[j][i]);
          tile_max = fmaxf(tile_max, s[j][i]);
        }
      tile_max = warp_reduce_max<4>(tile_max);
      const float new_max = fmaxf(row_max[h], tile_max);
      // Both -inf: the row has seen no key yet, and its sums and O are still 0.
      const float rescale = new_max == -INFINITY ? 1.0f : exp2f(row_max[h] - new_max);
      float tile_sum = 0.0f;
      for (int j = 0; j < 2; ++j)
        for (int i = 2 * h; i < 2 * h + 2; ++i) {
          prob[j][i] = s[j][i] == -INFINITY ? 0.0f : exp2f(s[j][i] - new_max);
          tile_sum += prob[j][i];
        }
      row_sum[h] = row_sum[h] * rescale + warp_reduce_sum<4>(tile_sum);
      row_max[h] = new_max;
      for (int n = 0; n < D / 8; ++n) {
        acc[n][2 * h] *= rescale;
        acc[n][2 * h + 1] *= rescale;
      }
    }
    // P as the A fragment of P V (k = the warp's 16 keys): a0 rows g, keys 0-7; a1 rows g + 8;
    // a2, a3 the same for keys 8-15 - exactly S's accumulators of tiles 0 and 1.
    const uint32_t p_frag[4] = {pack2<T>(prob[0][0], prob[0][1]), pack2<T>(prob[0][2], prob[0][3]),
                                pack2<T>(prob[1][0], prob[1][1]), pack2<T>(prob[1][2], prob[1][3])};
    for (int n0 = 0; n0 < D; n0 += 16) {
      uint32_t vf[4];
      load_b_from_kn(vf, v_s, LD, n0, kb);
      const uint32_t low[2] = {vf[0], vf[1]}, high[2] = {vf[2], vf[3]};
      mma_m16n8k16<T>(acc[n0 / 8], p_frag, low, acc[n0 / 8]);
      mma_m16n8k16<T>(acc[n0 / 8 + 1], p_frag, high, acc[n0 / 8 + 1]);
    }
  }

  // Merge the four warps' (max, sum, O) per row.
  __syncthreads();  // the K/V space becomes the merge space
  for (int n = 0; n < D / 8; ++n)
    for (int h = 0; h < 2; ++h) {  // accumulators 2h, 2h + 1: row g + 8 h, columns 2t, 2t + 1
      const FragmentCoord c = mma_m16n8k16_c(lane, 2 * h);
      store_vector(reinterpret_cast<float2*>(o_merge + (warp * R + c.row) * Traits::kMergeLd + n * 8 + c.col),
                   make_float2(acc[n][2 * h], acc[n][2 * h + 1]));
    }
  if (t == 0) {
    for (int h = 0; h < 2; ++h) {
      max_merge[warp * R + g + 8 * h] = row_max[h];
      sum_merge[warp * R + g + 8 * h] = row_sum[h];
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < R * D; i += Traits::kThreads) {
    const int r = i / D, col = i % D, row = row0 + r;
    if (row >= group_rows) continue;
    float top = -INFINITY;
    for (int w = 0; w < W; ++w) top = fmaxf(top, max_merge[w * R + r]);
    float sum = 0.0f, value = 0.0f;
    if (top != -INFINITY) {
      for (int w = 0; w < W; ++w) {
        if (max_merge[w * R + r] == -INFINITY) continue;  // a warp that saw no key of this row
        const float weight = exp2f(max_merge[w * R + r] - top);
        sum += sum_merge[w * R + r] * weight;
        value += o_merge[(w * R + r) * Traits::kMergeLd + col] * weight;
      }
    }
    const int head = kv_head * p.heads_per_kv + row / seq_q, query = row % seq_q;
    const int64_t flat = flat_row(p.q_rows, rows, p.heads, head, query);
    // One split holds the whole row, whose softmax ends here with the head's sink; a split's part
    // leaves the sink to decode_combine, which takes it once.
    const float sink = p.num_splits == 1 ? head_sink(p.mods, head) : -INFINITY;
    const SoftmaxRowEnd end = softmax_row_end</*Log2=*/true>(top, sum, sink);
    if (p.num_splits == 1) {
      T* out = static_cast<T*>(p.out) + int64_t(rows.entry) * p.out_stride_batch + int64_t(head) * p.out_stride_head +
               int64_t(rows.first + query) * p.out_stride_row;
      out[col] = from_float<T>(value * end.inverse);
      if (col == 0 && p.lse != nullptr) p.lse[flat] = end.lse;
    } else {
      p.partial_out[(int64_t(split) * p.rows + flat) * D + col] = value * end.inverse;
      if (col == 0) p.partial_lse[int64_t(split) * p.rows + flat] = end.lse;
    }
  }
}

SELFATTN_KERNELS_END
