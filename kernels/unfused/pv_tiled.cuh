#pragma once
// O = P V per (batch, head) of a chunk: P fp32 from the workspace (see PvParams), V and O in the
// call's dtype and strides. Grid: x = head_dim tiles, y = query-row tiles, z = (batch, head) pairs.
//
// pv_tiled_simt_kernel<T>: any dtype and head_dim; P stays fp32 and the sums are fp32 FMAs, so the
// only rounding beyond fp32 is the final store of O in T.
// pv_tiled_mma_kernel<T>:  f16/bf16 on tensor cores; P is rounded to T when staged (mma takes A and
//                          B of one type), as flash attention does. Measured on the sweep this adds
//                          about as much error as storing O in T, well inside the f16/bf16 tolerance.
// Out, O's element type, is T for the forward; the naive backward runs these as dQ = dS K (P := dS,
// V := K) with Out = float when dq is fp32 for f16/bf16 inputs.
#include <cstdint>

#include "../common/attention_heads.cuh"
#include "../common/compat.h"
#include "../common/primitives.cuh"
#include "../common/mma_tile.cuh"
#include "naive_params.h"
#include "../common/simt_tile.cuh"

SELFATTN_KERNELS_BEGIN

template <class T, class Out = T>
__global__ void __launch_bounds__(SimtTileTraits::kThreads) pv_tiled_simt_kernel(const PvParams p) {
  using Tile = SimtTileTraits;
  float* a_tile = dynamic_smem<float>();
  float* b_tile = a_tile + Tile::kTileK * Tile::kLd;

  const HeadOf at = head_of(p.bh_begin + int(blockIdx.z), p.heads, p.heads_per_kv);
  const float* probs = p.p + int64_t(blockIdx.z) * p.p_bh_stride;
  const T* v = head_rows<T>(p.v, at.batch, at.kv_head);
  const int row0 = int(blockIdx.y) * Tile::kTileM;
  const int col0 = int(blockIdx.x) * Tile::kTileN;

  float acc[Tile::kPerThread][Tile::kPerThread] = {};
  // Keys outside the tile's visible range have P = 0: they add nothing.
  const KeyRange seen = tile_visible_keys(p, at.batch, row0, Tile::kTileM);
  const int key_end = seen.end;
  for (int j0 = seen.begin; j0 < key_end; j0 += Tile::kTileK) {
    stage_k_contiguous(a_tile, probs, p.p_row_stride, row0, p.rows, j0, key_end);
    stage_n_contiguous(b_tile, v, p.v.stride_seq, j0, key_end, col0, p.head_dim);
    __syncthreads();
    simt_tile_multiply(a_tile, b_tile, acc);
    __syncthreads();  // the next slice overwrites what this one read
  }

  Out* out = static_cast<Out*>(p.out) + at.batch * p.out_stride_batch + at.head * p.out_stride_head +
           int64_t(p.row_begin) * p.out_stride_seq;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  for (int i = 0; i < Tile::kPerThread; ++i) {
    const int row = row0 + ty + 16 * i;
    if (row >= p.rows) continue;
    for (int j = 0; j < Tile::kPerThread; ++j) {
      const int col = col0 + tx + 16 * j;
      if (col < p.head_dim) out[int64_t(row) * p.out_stride_seq + col] = from_float<Out>(acc[i][j]);
    }
  }
}

template <class T, class Out = T>
__global__ void __launch_bounds__(MmaTileTraits::kThreads) pv_tiled_mma_kernel(const PvParams p) {
  using Tile = MmaTileTraits;
  T* p_tile = dynamic_smem<T>();                       // [kTileM][kLdRowsK]: P rows, keys of the slice
  T* v_tile = p_tile + Tile::kTileM * Tile::kLdRowsK;  // [kSliceK][kLdRowsN]: V rows, head_dim columns

  const HeadOf at = head_of(p.bh_begin + int(blockIdx.z), p.heads, p.heads_per_kv);
  const float* probs = p.p + int64_t(blockIdx.z) * p.p_bh_stride;
  const T* v = head_rows<T>(p.v, at.batch, at.kv_head);
  const int row0 = int(blockIdx.y) * Tile::kTileM;
  const int col0 = int(blockIdx.x) * Tile::kTileN;
  const int warp_row0 = int(threadIdx.x / 32) * 16;

  float acc[Tile::kWarpTilesN][4] = {};
  const KeyRange seen = tile_visible_keys(p, at.batch, row0, Tile::kTileM);  // P = 0 outside it
  const int key_end = seen.end;
  for (int j0 = seen.begin; j0 < key_end; j0 += Tile::kSliceK) {
    stage_rows<Tile::kTileM, Tile::kSliceK>(p_tile, Tile::kLdRowsK, probs, p.p_row_stride, row0, p.rows, j0, key_end);
    stage_rows<Tile::kSliceK, Tile::kTileN>(v_tile, Tile::kLdRowsN, v + int64_t(j0) * p.v.stride_seq, p.v.stride_seq, 0,
                                            key_end - j0, col0, p.head_dim);
    __syncthreads();
    warp_mma_slice<T, /*BFromKn=*/true>(p_tile, v_tile, warp_row0, acc);
    __syncthreads();  // the next slice overwrites what this one read
  }

  Out* out = static_cast<Out*>(p.out) + at.batch * p.out_stride_batch + at.head * p.out_stride_head +
           int64_t(p.row_begin) * p.out_stride_seq;
  for (int tile = 0; tile < Tile::kWarpTilesN; ++tile)
    for (int i = 0; i < 4; ++i) {
      const FragmentCoord c = accumulator_coord(tile, i);
      const int row = row0 + warp_row0 + c.row, col = col0 + c.col;
      if (row < p.rows && col < p.head_dim) out[int64_t(row) * p.out_stride_seq + col] = from_float<Out>(acc[tile][i]);
    }
}

SELFATTN_KERNELS_END
