#pragma once
// A gradient accumulated in fp32 (dK/dV of the naive and cublas paths, dQ of the fused path's
// atomics) stored into the caller's view: its dtype, its strides, times a multiplier (see
// StoreGradientParams). Grid-stride over elements; consecutive threads take consecutive columns of
// a row, so both the reads and the writes are coalesced.
#include <cstdint>

#include "../common/compat.h"
#include "../common/simt_tile.cuh"
#include "backward_params.h"

SELFATTN_KERNELS_BEGIN

struct StoreGradientTraits {
  static constexpr int kThreads = 256;
  static constexpr int kMaxBlocks = 65535 * 4;  // the grid-stride loop covers the rest
};

template <class Out>
__global__ void __launch_bounds__(StoreGradientTraits::kThreads) store_gradient_kernel(const StoreGradientParams p) {
  const int64_t total = int64_t(p.batch) * p.heads * p.seq * p.head_dim;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += step) {
    const int c = int(e % p.head_dim);
    const int64_t row = e / p.head_dim;
    const int s = int(row % p.seq);
    const int64_t bh = row / p.seq;
    const int h = int(bh % p.heads);
    const int64_t b = bh / p.heads;
    Out* out = static_cast<Out*>(p.out) + b * p.out_stride_batch + h * p.out_stride_head + s * p.out_stride_row;
    out[c] = from_float<Out>(p.accumulator[e] * p.multiplier);
  }
}

SELFATTN_KERNELS_END
