#pragma once
// dV += P^T dO and dK += dS^T Q for one chunk of the naive backward (see GradKvParams): C = A^T B with
// A = the chunk's fp32 score rows [row][key] and B = query-head rows [row][head_dim] (dO or Q), the
// reduction running over the chunk's rows of every head of the chunk that shares the block's kv
// head. The block adds its sum into the fp32 accumulator once at the end (read, add, write): it
// owns those elements within the launch, and launches on one stream run in order.
// Grid: x = head_dim tiles, y = key tiles, z = kv pairs of the chunk.
//
// grad_kv_tiled_simt_kernel<T>: any dtype and head_dim; scores stay fp32, fp32 FMAs.
// grad_kv_tiled_mma_kernel<T>:  f16/bf16 on tensor cores; the scores (P or dS) are rounded to T when
//                               staged, as FlashAttention's backward does (mma takes A and B of one type).
// Both skip a slice of rows that sees none of the block's keys (causal, key lengths, window): those
// rows' scores are 0 there.
#include <cstdint>

#include "../common/attention_heads.cuh"
#include "../common/compat.h"
#include "../common/primitives.cuh"
#include "../common/mma_tile.cuh"
#include "../common/simt_tile.cuh"
#include "naive_backward_params.h"

SELFATTN_KERNELS_BEGIN

// The chunk's heads [begin, end) that share flat kv pair `kv` (GQA: bh / heads_per_kv == kv).
struct GroupHeads {
  int begin, end;
};
__device__ inline GroupHeads group_heads(const GradKvParams& p, int kv) {
  const int first = kv * p.heads_per_kv, last = first + p.heads_per_kv;
  return {first > p.bh_begin ? first : p.bh_begin, last < p.bh_begin + p.bh_count ? last : p.bh_begin + p.bh_count};
}

// Whether rows [row0, row0 + slice) of batch `batch` see any key of [key0, key0 + tile_keys).
__device__ inline bool slice_sees(const GradKvParams& p, int batch, int row0, int slice, int key0, int tile_keys) {
  const KeyRange seen = tile_visible_keys(p, batch, row0, slice);
  return key0 < seen.end && key0 + tile_keys > seen.begin;
}

template <class T>
__global__ void __launch_bounds__(SimtTileTraits::kThreads) grad_kv_tiled_simt_kernel(const GradKvParams p) {
  using Tile = SimtTileTraits;
  float* a_tile = dynamic_smem<float>();               // [row][key]: A^T staged K-major (rows are K)
  float* b_tile = a_tile + Tile::kTileK * Tile::kLd;   // [row][column]

  const int kv = p.bh_begin / p.heads_per_kv + int(blockIdx.z);
  const int key0 = int(blockIdx.y) * Tile::kTileM;
  const int col0 = int(blockIdx.x) * Tile::kTileN;
  const GroupHeads group = group_heads(p, kv);

  float acc[Tile::kPerThread][Tile::kPerThread] = {};
  for (int bh = group.begin; bh < group.end; ++bh) {
    const HeadOf at = head_of(bh, p.heads, p.heads_per_kv);
    const float* scores = p.scores + int64_t(bh - p.bh_begin) * p.scores_bh_stride;
    const T* rows = head_rows<T>(p.rows_of, at.batch, at.head) + int64_t(p.row_begin) * p.rows_of.stride_seq;
    for (int r0 = 0; r0 < p.rows; r0 += Tile::kTileK) {
      // Uniform over the block (block indices and r0 only), so the barriers below stay matched.
      if (!slice_sees(p, at.batch, r0, Tile::kTileK, key0, Tile::kTileM)) continue;
      stage_n_contiguous(a_tile, scores, p.scores_row_stride, r0, p.rows, key0, p.seq_k);
      stage_n_contiguous(b_tile, rows, p.rows_of.stride_seq, r0, p.rows, col0, p.head_dim);
      __syncthreads();
      simt_tile_multiply(a_tile, b_tile, acc);
      __syncthreads();  // the next slice overwrites what this one read
    }
  }

  // Thread (ty, tx) owns keys key0 + ty + 16 i and columns col0 + tx + 16 j (simt_tile.cuh).
  float* out = p.accumulator + int64_t(kv) * p.acc_kv_stride;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  for (int i = 0; i < Tile::kPerThread; ++i) {
    const int key = key0 + ty + 16 * i;
    if (key >= p.seq_k) continue;
    for (int j = 0; j < Tile::kPerThread; ++j) {
      const int col = col0 + tx + 16 * j;
      if (col < p.head_dim) out[int64_t(key) * p.head_dim + col] += acc[i][j];
    }
  }
}

// Stages src rows [row0, row0 + TileCols) x columns [col0, col0 + TileRows) transposed, as
// tile[column - col0][row - row0] (row stride ld) in T; zeros outside [0, row_count) x [0, col_count).
// Consecutive threads read consecutive columns of one source row (coalesced global reads).
template <int TileRows, int TileCols, class T>
__device__ inline void stage_transposed(T* tile, int ld, const float* src, int64_t src_ld, int row0, int row_count,
                                        int col0, int col_count) {
  for (int e = threadIdx.x; e < TileRows * TileCols; e += int(blockDim.x)) {
    const int r = e % TileRows, c = e / TileRows;
    const int row = row0 + c, col = col0 + r;
    const float value = (row < row_count && col < col_count) ? src[int64_t(row) * src_ld + col] : 0.0f;
    tile[r * ld + c] = from_float<T>(value);
  }
}

template <class T>
__global__ void __launch_bounds__(MmaTileTraits::kThreads) grad_kv_tiled_mma_kernel(const GradKvParams p) {
  using Tile = MmaTileTraits;
  T* a_tile = dynamic_smem<T>();                       // [kTileM keys][kLdRowsK]: A = scores^T, rows of the slice
  T* b_tile = a_tile + Tile::kTileM * Tile::kLdRowsK;  // [kSliceK rows][kLdRowsN]: B = dO or Q, head_dim columns

  const int kv = p.bh_begin / p.heads_per_kv + int(blockIdx.z);
  const int key0 = int(blockIdx.y) * Tile::kTileM;
  const int col0 = int(blockIdx.x) * Tile::kTileN;
  const int warp_row0 = int(threadIdx.x / 32) * 16;  // the warp's 16 keys of the tile
  const GroupHeads group = group_heads(p, kv);

  float acc[Tile::kWarpTilesN][4] = {};
  for (int bh = group.begin; bh < group.end; ++bh) {
    const HeadOf at = head_of(bh, p.heads, p.heads_per_kv);
    const float* scores = p.scores + int64_t(bh - p.bh_begin) * p.scores_bh_stride;
    const T* rows = head_rows<T>(p.rows_of, at.batch, at.head) + int64_t(p.row_begin) * p.rows_of.stride_seq;
    for (int r0 = 0; r0 < p.rows; r0 += Tile::kSliceK) {
      // Uniform over the block (block indices and r0 only), so the barriers below stay matched.
      if (!slice_sees(p, at.batch, r0, Tile::kSliceK, key0, Tile::kTileM)) continue;
      stage_transposed<Tile::kTileM, Tile::kSliceK>(a_tile, Tile::kLdRowsK, scores, p.scores_row_stride, r0, p.rows,
                                                    key0, p.seq_k);
      stage_rows<Tile::kSliceK, Tile::kTileN>(b_tile, Tile::kLdRowsN, rows + int64_t(r0) * p.rows_of.stride_seq,
                                              p.rows_of.stride_seq, 0, p.rows - r0, col0, p.head_dim);
      __syncthreads();
      warp_mma_slice<T, /*BFromKn=*/true>(a_tile, b_tile, warp_row0, acc);
      __syncthreads();  // the next slice overwrites what this one read
    }
  }

  float* out = p.accumulator + int64_t(kv) * p.acc_kv_stride;
  for (int tile = 0; tile < Tile::kWarpTilesN; ++tile)
    for (int i = 0; i < 4; ++i) {
      const FragmentCoord c = accumulator_coord(tile, i);  // each element owned by one lane of one warp
      const int key = key0 + warp_row0 + c.row, col = col0 + c.col;
      if (key < p.seq_k && col < p.head_dim) out[int64_t(key) * p.head_dim + col] += acc[tile][i];
    }
}

SELFATTN_KERNELS_END
