#pragma once
// D_i = sum_c dO_ic O_ic, the row term of dS = P * (dP - D): the first kernel of every backward path
// (see BackwardDotParams). It equals sum_j P_ij dP_ij, the form the derivation gives, but costs one
// pass over O and dO instead of a pass over the keys. A gradient through the LSE enters here too, as
// D_i - dlse_i, so no path needs to know of it.
//
// One warp owns a row: lane l sums columns l, l + 32, ... in fp32, then the warp reduces; lane 0
// writes D. Rows are flat indices (b * heads + h) * rows + i, visited by a grid-stride loop so any
// number of rows fits any grid.
#include <cstdint>

#include "../common/compat.h"
#include "../common/primitives.cuh"
#include "../common/simt_tile.cuh"
#include "backward_params.h"

SELFATTN_KERNELS_BEGIN

struct BackwardDotTraits {
  static constexpr int kRowsPerBlock = 4;             // 4 warps: a small block keeps the tail short
  static constexpr int kThreads = 32 * kRowsPerBlock;
  static constexpr int kMaxBlocks = 65535 * 4;        // the grid-stride loop covers the rest
};

template <class T>
__global__ void __launch_bounds__(BackwardDotTraits::kThreads) backward_dot_kernel(const BackwardDotParams p) {
  const int lane = int(threadIdx.x % 32);
  const int64_t total = int64_t(p.batch) * p.heads * p.rows;
  const int64_t step = int64_t(gridDim.x) * BackwardDotTraits::kRowsPerBlock;
  // Uniform per warp: every lane of a warp takes the same rows, so the reduction sees a full warp.
  for (int64_t row = int64_t(blockIdx.x) * BackwardDotTraits::kRowsPerBlock + threadIdx.x / 32; row < total;
       row += step) {
    const int i = int(row % p.rows);
    const int64_t bh = row / p.rows;
    const int h = int(bh % p.heads);
    const int64_t b = bh / p.heads;
    const T* o = static_cast<const T*>(p.out) + b * p.out_stride_batch + h * p.out_stride_head + i * p.out_stride_row;
    const T* d_o =
        static_cast<const T*>(p.dout) + b * p.dout_stride_batch + h * p.dout_stride_head + i * p.dout_stride_row;
    float sum = 0.0f;
    for (int c = lane; c < p.head_dim; c += 32) sum += to_float(d_o[c]) * to_float(o[c]);
    sum = warp_reduce_sum<32>(sum);
    if (lane == 0) p.d[row] = p.dlse != nullptr ? sum - p.dlse[row] : sum;
  }
}

SELFATTN_KERNELS_END
