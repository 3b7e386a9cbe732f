#pragma once
// The smallest kernel: writes value + index to every element. It proves the launch path of each
// backend end to end (runtime -> KernelRef -> launch) and is the template for the others.
#include <cstdint>

#include "compat.h"
#include "../launch.h"
#include "../params.h"

SELFATTN_KERNELS_BEGIN

__global__ void fill_kernel(const FillParams p) {
  // Grid-stride loop: any count with any grid.
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.count; i += stride) {
    p.data[i] = p.value + float(i);
  }
}

SELFATTN_KERNELS_END
