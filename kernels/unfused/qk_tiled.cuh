#pragma once
// S = Q K^T per (batch, head) of a chunk, unscaled, fp32, into the workspace (see QkParams); key
// tiles that no row of the block's row tile sees (causal, key lengths, window) are skipped, never read.
// Grid: x = key tiles, y = query-row tiles, z = (batch, head) pairs of the chunk.
//
// qk_tiled_simt_kernel<T>: any dtype, any head_dim >= 1 (K slices zero-padded), fp32 FMA.
// qk_tiled_mma_kernel<T>:  f16/bf16 on tensor cores (mma.m16n8k16, fp32 accumulate); head_dim is
//                          staged in zero-padded slices of 32, so any head_dim works (the registry
//                          picks it from head_dim 16 on, where the padding wastes at most a third).
#include <cstdint>

#include "../common/compat.h"
#include "../common/primitives.cuh"
#include "../common/mma_tile.cuh"
#include "../common/attention_heads.cuh"
#include "naive_params.h"
#include "../common/simt_tile.cuh"

SELFATTN_KERNELS_BEGIN

template <class T>
__global__ void __launch_bounds__(SimtTileTraits::kThreads) qk_tiled_simt_kernel(const QkParams p) {
  using Tile = SimtTileTraits;
  float* a_tile = dynamic_smem<float>();
  float* b_tile = a_tile + Tile::kTileK * Tile::kLd;

  const HeadOf at = head_of(p.bh_begin + int(blockIdx.z), p.heads, p.heads_per_kv);
  const T* q = head_rows<T>(p.q, at.batch, at.head) + int64_t(p.row_begin) * p.q.stride_seq;
  const T* k = head_rows<T>(p.k, at.batch, at.kv_head);
  const int row0 = int(blockIdx.y) * Tile::kTileM;
  const int key0 = int(blockIdx.x) * Tile::kTileN;
  const KeyRange seen = tile_visible_keys(p, at.batch, row0, Tile::kTileM);
  if (key0 >= seen.end || key0 + Tile::kTileN <= seen.begin) return;  // no row here sees these keys

  float acc[Tile::kPerThread][Tile::kPerThread] = {};
  for (int d0 = 0; d0 < p.head_dim; d0 += Tile::kTileK) {
    stage_k_contiguous(a_tile, q, p.q.stride_seq, row0, p.rows, d0, p.head_dim);
    stage_k_contiguous(b_tile, k, p.k.stride_seq, key0, p.seq_k, d0, p.head_dim);
    __syncthreads();
    simt_tile_multiply(a_tile, b_tile, acc);
    __syncthreads();  // the next slice overwrites what this one read
  }

  float* s = p.s + int64_t(blockIdx.z) * p.s_bh_stride;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  for (int i = 0; i < Tile::kPerThread; ++i) {
    const int row = row0 + ty + 16 * i;
    if (row >= p.rows) continue;
    for (int j = 0; j < Tile::kPerThread; ++j) {
      const int key = key0 + tx + 16 * j;
      if (key < p.seq_k) s[int64_t(row) * p.s_row_stride + key] = acc[i][j];
    }
  }
}

template <class T>
__global__ void __launch_bounds__(MmaTileTraits::kThreads) qk_tiled_mma_kernel(const QkParams p) {
  using Tile = MmaTileTraits;
  T* q_tile = dynamic_smem<T>();                       // [kTileM][kLdRowsK]
  T* k_tile = q_tile + Tile::kTileM * Tile::kLdRowsK;  // [kTileN][kLdRowsK]: the rows of B^T

  const HeadOf at = head_of(p.bh_begin + int(blockIdx.z), p.heads, p.heads_per_kv);
  const T* q = head_rows<T>(p.q, at.batch, at.head) + int64_t(p.row_begin) * p.q.stride_seq;
  const T* k = head_rows<T>(p.k, at.batch, at.kv_head);
  const int row0 = int(blockIdx.y) * Tile::kTileM;
  const int key0 = int(blockIdx.x) * Tile::kTileN;
  const KeyRange seen = tile_visible_keys(p, at.batch, row0, Tile::kTileM);
  if (key0 >= seen.end || key0 + Tile::kTileN <= seen.begin) return;  // no row here sees these keys
  const int warp_row0 = int(threadIdx.x / 32) * 16;

  float acc[Tile::kWarpTilesN][4] = {};
  for (int d0 = 0; d0 < p.head_dim; d0 += Tile::kSliceK) {
    stage_rows<Tile::kTileM, Tile::kSliceK>(q_tile, Tile::kLdRowsK, q, p.q.stride_seq, row0, p.rows, d0, p.head_dim);
    stage_rows<Tile::kTileN, Tile::kSliceK>(k_tile, Tile::kLdRowsK, k, p.k.stride_seq, key0, p.seq_k, d0, p.head_dim);
    __syncthreads();
    warp_mma_slice<T, /*BFromKn=*/false>(q_tile, k_tile, warp_row0, acc);
    __syncthreads();  // the next slice overwrites what this one read
  }

  float* s = p.s + int64_t(blockIdx.z) * p.s_bh_stride;
  for (int tile = 0; tile < Tile::kWarpTilesN; ++tile)
    for (int i = 0; i < 4; ++i) {
      const FragmentCoord c = accumulator_coord(tile, i);
      const int row = row0 + warp_row0 + c.row, key = key0 + c.col;
      if (row < p.rows && key < p.seq_k) s[int64_t(row) * p.s_row_stride + key] = acc[tile][i];
    }
}

SELFATTN_KERNELS_END
