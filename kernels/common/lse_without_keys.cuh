#pragma once
// The LSE of a call without keys (see LseWithoutKeysParams): every row's softmax holds only its
// head's sink, so its LSE is the sink's logit (softmax_row_end of a row without keys), or -inf
// without sinks. Written on the device, so such a call needs no host copy and stays graph-safe.
#include <cmath>
#include <cstdint>

#include "compat.h"
#include "../params.h"

SELFATTN_KERNELS_BEGIN

// Any block size, any grid: a grid-stride loop over the rows.
__global__ void lse_without_keys_kernel(const LseWithoutKeysParams p) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t row = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; row < p.rows; row += stride) {
    p.lse[row] = p.sinks != nullptr ? p.sinks[(row / p.rows_per_head) % p.heads] : -INFINITY;
  }
}

SELFATTN_KERNELS_END
