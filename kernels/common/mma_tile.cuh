#pragma once
// The tensor-core tile engine shared by qk_tiled and pv_tiled (their f16/bf16 variant):
// C[64 x 64] (fp32) += A[64 x K] B[K x 64] per 128-thread block, K staged through shared memory in
// slices of 32 as the 16-bit input type, each warp owning 16 rows x 64 columns = eight m16n8k16
// accumulator tiles (32 floats per thread). Fragments come from shared memory by ldmatrix:
//   A: row-major [row][k] (Q, or P converted to T)       - ldmatrix x4
//   B: either the rows of B^T, [n][k] (K for Q K^T)      - ldmatrix x4
//      or B itself, [k][n] (V for P V)                   - ldmatrix x4 .trans
// Both give each lane the (k = 2t, 2t+1 | 2t+8, 2t+9; n = g) pairs of the mma B fragment.
// Elements past the matrix edges are staged as zeros, so any K (head_dim, seq_k) and any ragged
// M/N work; the padding contributes nothing to the sums.
#include <cstdint>

#include "compat.h"
#include "primitives.cuh"
#include "simt_tile.cuh"

SELFATTN_KERNELS_BEGIN

struct MmaTileTraits {
  static constexpr int kTileM = 64;      // rows per block: 4 warps x one m16 tile
  static constexpr int kTileN = 64;      // columns per block: 8 n8 tiles per warp, 32 accumulators/thread
  static constexpr int kSliceK = 32;     // K staged per step: two k16 mma steps per barrier pair
  static constexpr int kThreads = 128;   // 4 warps
  static constexpr int kWarpTilesN = kTileN / 8;
  static constexpr int kPad = 8;         // 16 bytes: consecutive ldmatrix rows start in different banks
  static constexpr int kLdRowsK = kSliceK + kPad;  // [row][k] tiles (A, and B^T)
  static constexpr int kLdRowsN = kTileN + kPad;   // [k][n] tiles (B as stored, e.g. V)
  static constexpr size_t kSmemBytesNk = size_t(kTileM + kTileN) * kLdRowsK * 2;          // A + B^T
  static constexpr size_t kSmemBytesKn = (size_t(kTileM) * kLdRowsK + size_t(kSliceK) * kLdRowsN) * 2;  // A + B
};

// Copies src rows [first, first + TileRows) x columns [c0, c0 + TileCols) into tile[row][col]
// (row stride ld) as T; outside [0, count) x [0, c_end) the tile gets zeros. The tile shape is a
// template argument so the index arithmetic folds to shifts.
template <int TileRows, int TileCols, class T, class Src>
__device__ inline void stage_rows(T* tile, int ld, const Src* src, int64_t src_ld, int first, int count, int c0,
                                  int c_end) {
  for (int e = threadIdx.x; e < TileRows * TileCols; e += int(blockDim.x)) {
    const int r = e / TileCols, c = e % TileCols;
    const int row = first + r, col = c0 + c;
    const float value = (row < count && col < c_end) ? to_float(src[int64_t(row) * src_ld + col]) : 0.0f;
    tile[r * ld + c] = from_float<T>(value);
  }
}

// The A fragment of rows [row0, row0 + 16) x k [k0, k0 + 16) of a [row][k] tile: matrices
// (rows 0-7 | 8-15) x (k 0-7 | 8-15) in register order a0..a3 of the mma A fragment.
template <class T>
__device__ inline void load_a(uint32_t (&a)[4], const T* tile, int ld, int row0, int k0) {
  const int lane = int(lane_id());
  ldmatrix<4>(a, tile + (row0 + lane % 8 + 8 * ((lane / 8) % 2)) * ld + k0 + 8 * (lane / 16));
}

// B fragments of two n8 tiles [n0, n0 + 16) for k [k0, k0 + 16): b[0..1] for n0, b[2..3] for n0 + 8.
template <class T>
__device__ inline void load_b_from_nk(uint32_t (&b)[4], const T* tile, int ld, int n0, int k0) {
  const int lane = int(lane_id());
  ldmatrix<4>(b, tile + (n0 + lane % 8 + 8 * (lane / 16)) * ld + k0 + 8 * ((lane / 8) % 2));
}
template <class T>
__device__ inline void load_b_from_kn(uint32_t (&b)[4], const T* tile, int ld, int n0, int k0) {
  const int lane = int(lane_id());
  ldmatrix_trans<4>(b, tile + (k0 + lane % 8 + 8 * ((lane / 8) % 2)) * ld + n0 + 8 * (lane / 16));
}

// acc += A[row0 .. +16][slice] B[slice][0 .. 64) for one staged K slice. BFromKn: B stored [k][n].
template <class T, bool BFromKn>
__device__ inline void warp_mma_slice(const T* a_tile, const T* b_tile, int row0,
                                      float (&acc)[MmaTileTraits::kWarpTilesN][4]) {
  using Tile = MmaTileTraits;
  for (int k0 = 0; k0 < Tile::kSliceK; k0 += 16) {
    uint32_t a[4];
    load_a(a, a_tile, Tile::kLdRowsK, row0, k0);
    for (int n0 = 0; n0 < Tile::kTileN; n0 += 16) {
      uint32_t b[4];
      if constexpr (BFromKn) load_b_from_kn(b, b_tile, Tile::kLdRowsN, n0, k0);
      else load_b_from_nk(b, b_tile, Tile::kLdRowsK, n0, k0);
      const uint32_t b_low[2] = {b[0], b[1]}, b_high[2] = {b[2], b[3]};
      mma_m16n8k16<T>(acc[n0 / 8], a, b_low, acc[n0 / 8]);
      mma_m16n8k16<T>(acc[n0 / 8 + 1], a, b_high, acc[n0 / 8 + 1]);
    }
  }
}

// Where accumulator element i of n8 tile `tile` sits in the warp's 16 x 64 block (mma C layout).
__device__ inline FragmentCoord accumulator_coord(int tile, int i) {
  const FragmentCoord c = mma_m16n8k16_c(int(lane_id()), i);
  return {c.row, tile * 8 + c.col};
}

SELFATTN_KERNELS_END
