#pragma once
// Split-KV decode over a latent cache on tensor cores (DeepSeek's absorbed MLA; f16/bf16 q): K's
// rows are [c_kv (DV) | k_rope (DQK - DV)] and V is their first DV columns (kv_cache.h), so each key
// tile is staged once and read by both products. One kv head (MQA) serves every query head: the
// group's heads x new rows are the tile's rows, 16 per block, and one of num_splits ranges of the
// sequence's keys (decode_split_keys: only the tiles a window leaves), each row masking its own
// visible_key_range() and taking modified_score(), as decode_split_kv.cuh.
//
// Per tile of 32 keys the block stages K (16-bit; an FP8 cache dequantized while staging, stored x
// scale rounded once to T) and, in four warps:
//   S = Q K^T      warp w: keys [16 (w / 2), +16) over depth half w % 2 ([DQK/2 (w % 2), +DQK/2)),
//                  mma m16n8k16, the warp's half of Q held in registers for the whole key range,
//                  K from shared memory; the partial S to shared memory
//   softmax        every warp sums the two depth halves of all 32 keys of its rows g, g + 8 and
//                  keeps the same (max, sum) per row: the four warps agree without a merge
//   O += P V       warp w: columns [DV/4 w, +DV/4) of O for all 16 rows, V from K's tile by
//                  ldmatrix.trans, P repacked from the softmax into A fragments
// The key tile is what reads memory: DQK values per key, once for both products (a separate V
// would add DV more). At the end each warp writes its columns (out, or a split's normalised fp32
// partial for decode_combine) and warp 0 the LSE.
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
#include "decode_split_kv_mma.cuh"
#include "kv_cache_params.h"
#include "kv_pages.cuh"
#include "new_rows.cuh"

SELFATTN_KERNELS_BEGIN

template <int DQK, int DV>
struct DecodeLatentMmaTraits {
  static constexpr int kThreads = 128;
  static constexpr int kWarps = 4;
  static constexpr int kRows = 16;            // query rows (heads x new rows) per block: one mma row tile
  static constexpr int kKeys = 32;            // per tile: two key halves of 16, each split over two depth halves
  static constexpr int kDepthHalf = DQK / 2;  // a warp's share of the Q K^T depth
  static constexpr int kColumns = DV / kWarps;  // a warp's columns of O
  static_assert(kDepthHalf % 16 == 0 && kColumns % 16 == 0, "mma k16 depth steps and n16 column pairs");
  static_assert(DV <= DQK, "V is K's leading columns");
  // 16-bit elements per staged row: 16-byte rows, and an odd number of 16-byte units so that
  // ldmatrix's 8 rows fall in different banks.
  static constexpr int kLd = DQK + 8;
  static constexpr size_t kQBytes = size_t(kRows) * kLd * 2;
  static constexpr size_t kKBytes = size_t(kKeys) * kLd * 2;
  // The partial S of both depth halves, fp32 [2][kRows][kSLd]: rows padded by 8 floats so that a
  // half-warp's 8-byte accesses (rows g 0-3 x key pairs 2t) fill 32 distinct banks; unpadded, the
  // 32-float rows put every g in the same banks (4-way).
  static constexpr int kSLd = kKeys + 8;
  static constexpr size_t kSBytes = size_t(2) * kRows * kSLd * 4;
  static constexpr size_t kSmemBytes = kQBytes + kKBytes + kSBytes + size_t(kKeys) * sizeof(int64_t);
};

template <class T, int DQK, int DV, class Cache = T>
__global__ void __launch_bounds__(128) decode_latent_mma_kernel(const DecodeSplitKvParams p) {
  using Traits = DecodeLatentMmaTraits<DQK, DV>;
  constexpr int N = Traits::kKeys, LD = Traits::kLd, R = Traits::kRows, CW = Traits::kColumns, SLD = Traits::kSLd;
  constexpr int kChunks = DQK / 8;  // 8-element chunks per row (16 bytes of T)
  const int split = int(blockIdx.x) % p.num_splits, row_block = int(blockIdx.x) / p.num_splits;
  const int kv_head = blockIdx.y, b = blockIdx.z;
  const SequenceRows rows = sequence_rows(p.q_rows, b);
  const int seq_q = rows.count;
  const int group_rows = p.heads_per_kv * seq_q;
  const int row0 = row_block * R;
  if (row0 >= group_rows) return;  // the whole block: no row of this sequence is its
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  const int g = lane / 4, t = lane % 4;  // mma fragment coordinates: rows g and g + 8, columns 2t, 2t + 1
  const int key_half = warp / 2, depth0 = (warp % 2) * Traits::kDepthHalf, column0 = warp * CW;

  const SequenceKeys sequence = sequence_keys(seq_q, kv_length(p.cache, b), p.causal, p.key_start, p.q_offset, b);
  const KeyRange split_keys = decode_split_keys(p, sequence, seq_q, split, N);
  const int key_begin = split_keys.begin, key_end = split_keys.end;

  unsigned char* smem = dynamic_smem<unsigned char>();
  T* q_s = reinterpret_cast<T*>(smem);
  T* k_s = reinterpret_cast<T*>(smem + Traits::kQBytes);
  float* s_s = reinterpret_cast<float*>(smem + Traits::kQBytes + Traits::kKBytes);  // [depth half][row][SLD]
  int64_t* k_rows = reinterpret_cast<int64_t*>(smem + Traits::kQBytes + Traits::kKBytes + Traits::kSBytes);

  // Q rows of the group (row r: head kv_head * heads_per_kv + r / seq_q, new row r % seq_q), zeros past it.
  decode_mma_stage_q<DQK, LD, Traits::kThreads>(p, rows, q_s, kv_head, row0, group_rows, seq_q);
  __syncthreads();
  // This warp's depth half of Q as A fragments, held for the whole key range (72 registers at
  // 576): Q K^T then reads only K from shared memory.
  constexpr int kDepthSteps = Traits::kDepthHalf / 16;
  uint32_t q_frag[kDepthSteps][4];
  SELFATTN_UNROLL
  for (int step = 0; step < kDepthSteps; ++step) load_a(q_frag[step], q_s, LD, 0, depth0 + 16 * step);

  // Rows g and g + 8: what scores their keys, and their online softmax.
  const DecodeMmaRows row_keys = decode_mma_rows(p, sequence, b, kv_head, row0, group_rows, seq_q);
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f}, acc[CW / 8][4];
  SELFATTN_UNROLL
  for (int n = 0; n < CW / 8; ++n)
    for (int i = 0; i < 4; ++i) acc[n][i] = 0.0f;

  const Cache* k_cache = static_cast<const Cache*>(p.cache.k);
  const float k_scale = kv_scales<Cache>(p.cache, kv_head).k;  // V's too: V is K's values
  // Barriers per tile: (1) the row offsets are written; (2) K is staged (Q too, on the first
  // tile); (3) the partial S is written. No barrier opens an iteration: the previous tile's
  // offsets were last read before (2), its K and partial S before the next tile's (1), which every
  // thread passes after its P V.
  for (int key0 = key_begin; key0 < key_end; key0 += N) {
    if (threadIdx.x < N) {
      const int key = key0 + int(threadIdx.x);
      // Keys before key_start are padding: never read (staged as zeros).
      const int page = key >= sequence.begin && key < key_end ? kv_page_of(p.cache, b, key) : -1;
      k_rows[threadIdx.x] = page >= 0 ? kv_k_offset(p.cache, page, kv_head, key) : -1;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < N * kChunks; i += Traits::kThreads) {
      const int n = i / kChunks, c = (i % kChunks) * 8;
      const uint4 chunk = k_rows[n] >= 0 ? decode_mma_chunk<T>(k_cache + k_rows[n] + c, k_scale) : make_uint4(0, 0, 0, 0);
      store_vector(reinterpret_cast<uint4*>(k_s + n * LD + c), chunk);
    }
    __syncthreads();

    // This warp's partial S: rows 0-15 x keys [16 key_half, +16) over its depth half.
    float s[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
    SELFATTN_UNROLL
    for (int step = 0; step < kDepthSteps; ++step) {
      uint32_t kf[4];
      load_b_from_nk(kf, k_s, LD, 16 * key_half, depth0 + 16 * step);
      const uint32_t low[2] = {kf[0], kf[1]}, high[2] = {kf[2], kf[3]};
      mma_m16n8k16<T>(s[0], q_frag[step], low, s[0]);
      mma_m16n8k16<T>(s[1], q_frag[step], high, s[1]);
    }
    // Accumulator i of n8 tile j: row g + 8 (i / 2), key 16 key_half + 8 j + 2 t + i % 2.
    float* s_half = s_s + (warp % 2) * R * SLD;
    for (int j = 0; j < 2; ++j)
      for (int h = 0; h < 2; ++h)
        store_vector(reinterpret_cast<float2*>(s_half + (g + 8 * h) * SLD + 16 * key_half + 8 * j + 2 * t),
                     make_float2(s[j][2 * h], s[j][2 * h + 1]));
    __syncthreads();

    // Every warp: the softmax of rows g, g + 8 over the tile's 32 keys, which lane (g, t) holds as
    // the A fragments of P V: key step ks, register pair i: keys 16 ks + 8 (i / 2) + 2 t, + 1
    // (a0, a2 row g; a1, a3 row g + 8).
    float prob[2][2][4];  // [key step][row h][key 8 (i / 2) + 2t + (i % 2) within the step, i = 0..3]
    SELFATTN_UNROLL
    for (int h = 0; h < 2; ++h) {
      const int r = g + 8 * h;
      float score[2][4], tile_max = -INFINITY;
      SELFATTN_UNROLL
      for (int ks = 0; ks < 2; ++ks) {
        SELFATTN_UNROLL
        for (int pair = 0; pair < 2; ++pair) {
          // Keys n, n + 1 of both depth halves, as 8-byte loads.
          const int n = 16 * ks + 8 * pair + 2 * t;
          const float2 low = load_vector(reinterpret_cast<const float2*>(s_s + r * SLD + n));
          const float2 high = load_vector(reinterpret_cast<const float2*>(s_s + R * SLD + r * SLD + n));
          const float dots[2] = {low.x + high.x, low.y + high.y};
          SELFATTN_UNROLL
          for (int odd = 0; odd < 2; ++odd) {
            const int i = 2 * pair + odd;
            score[ks][i] = decode_mma_score(p, row_keys, h, key0 + n + odd, key_end, dots[odd]);
            tile_max = fmaxf(tile_max, score[ks][i]);
          }
        }
      }
      tile_max = warp_reduce_max<4>(tile_max);
      const float new_max = fmaxf(row_max[h], tile_max);
      // Both -inf: the row has seen no key yet, and its sums and O are still 0.
      const float rescale = new_max == -INFINITY ? 1.0f : exp2f(row_max[h] - new_max);
      float tile_sum = 0.0f;
      SELFATTN_UNROLL
      for (int ks = 0; ks < 2; ++ks) {
        SELFATTN_UNROLL
        for (int i = 0; i < 4; ++i) {
          prob[ks][h][i] = score[ks][i] == -INFINITY ? 0.0f : exp2f(score[ks][i] - new_max);
          tile_sum += prob[ks][h][i];
        }
      }
      row_sum[h] = row_sum[h] * rescale + warp_reduce_sum<4>(tile_sum);
      row_max[h] = new_max;
      SELFATTN_UNROLL
      for (int n = 0; n < CW / 8; ++n) {
        acc[n][2 * h] *= rescale;
        acc[n][2 * h + 1] *= rescale;
      }
    }
    SELFATTN_UNROLL
    for (int ks = 0; ks < 2; ++ks) {
      // a0: row g, keys 2t, 2t + 1 of the step; a1: row g + 8; a2, a3: the same 8 keys on.
      const uint32_t p_frag[4] = {pack2<T>(prob[ks][0][0], prob[ks][0][1]), pack2<T>(prob[ks][1][0], prob[ks][1][1]),
                                  pack2<T>(prob[ks][0][2], prob[ks][0][3]), pack2<T>(prob[ks][1][2], prob[ks][1][3])};
      SELFATTN_UNROLL
      for (int n0 = 0; n0 < CW; n0 += 16) {
        uint32_t vf[4];
        load_b_from_kn(vf, k_s, LD, column0 + n0, 16 * ks);  // V: K's leading columns
        const uint32_t low[2] = {vf[0], vf[1]}, high[2] = {vf[2], vf[3]};
        mma_m16n8k16<T>(acc[n0 / 8], p_frag, low, acc[n0 / 8]);
        mma_m16n8k16<T>(acc[n0 / 8 + 1], p_frag, high, acc[n0 / 8 + 1]);
      }
    }
  }

  // Each warp's columns of rows g, g + 8 (accumulator i of n8 tile n: row g + 8 (i / 2), column
  // column0 + 8 n + 2 t + i % 2); the (max, sum) of a row is the same in every warp.
  SELFATTN_UNROLL
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + g + 8 * h;
    if (row >= group_rows) continue;
    const int head = kv_head * p.heads_per_kv + row / seq_q, query = row % seq_q;
    const int64_t flat = flat_row(p.q_rows, rows, p.heads, head, query);
    // One split holds the whole row, whose softmax ends here with the head's sink; a split's part
    // leaves the sink to decode_combine, which takes it once.
    const float sink = p.num_splits == 1 ? head_sink(p.mods, head) : -INFINITY;
    const SoftmaxRowEnd end = softmax_row_end</*Log2=*/true>(row_max[h], row_sum[h], sink);
    if (p.num_splits == 1) {
      T* out = static_cast<T*>(p.out) + int64_t(rows.entry) * p.out_stride_batch + int64_t(head) * p.out_stride_head +
               int64_t(rows.first + query) * p.out_stride_row;
      SELFATTN_UNROLL
      for (int n = 0; n < CW / 8; ++n) {
        const int col = column0 + 8 * n + 2 * t;
        out[col] = from_float<T>(acc[n][2 * h] * end.inverse);
        out[col + 1] = from_float<T>(acc[n][2 * h + 1] * end.inverse);
      }
      if (warp == 0 && t == 0 && p.lse != nullptr) p.lse[flat] = end.lse;
    } else {
      float* out = p.partial_out + (int64_t(split) * p.rows + flat) * DV;
      SELFATTN_UNROLL
      for (int n = 0; n < CW / 8; ++n) {
        const int col = column0 + 8 * n + 2 * t;
        store_vector(reinterpret_cast<float2*>(out + col),
                     make_float2(acc[n][2 * h] * end.inverse, acc[n][2 * h + 1] * end.inverse));
      }
      if (warp == 0 && t == 0) p.partial_lse[int64_t(split) * p.rows + flat] = end.lse;
    }
  }
}

SELFATTN_KERNELS_END
