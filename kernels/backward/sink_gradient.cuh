#pragma once
// The gradient of each head's attention sink (see SinkGradientParams), after backward_dot has
// written D: a sink is a key whose value row is 0, so its score's gradient is P_sink (0 - D_i) per
// row, summed over the head's rows. One block per head sums its rows in a fixed order (per-thread
// strided partials, then a tree through shared memory): deterministic, and no atomics.
#include <cmath>
#include <cstdint>

#include "../common/compat.h"
#include "../common/primitives.cuh"
#include "backward_params.h"

SELFATTN_KERNELS_BEGIN

struct SinkGradientTraits {
  static constexpr int kThreads = 256;  // 8 warps stream the head's rows; one partial per warp
  static constexpr size_t kSmemBytes = (kThreads / 32) * sizeof(float);
};

__global__ void __launch_bounds__(SinkGradientTraits::kThreads) sink_gradient_kernel(const SinkGradientParams p) {
  const int head = int(blockIdx.x);
  const float sink = p.sinks[head];
  int rows = p.rows;
  if (p.rows_end != nullptr) rows = min(max(*p.rows_end, 0), p.rows);
  float sum = 0.0f;
  if (sink != -INFINITY) {  // no sink: no probability, gradient 0 (and no exp(-inf - -inf))
    for (int b = 0; b < p.batch; ++b) {
      const int64_t first = (int64_t(b) * p.heads + head) * p.rows;
      for (int i = int(threadIdx.x); i < rows; i += SinkGradientTraits::kThreads) {
        sum += expf(sink - p.lse[first + i]) * p.d[first + i];
      }
    }
  }
  float* partials = dynamic_smem<float>();
  sum = warp_reduce_sum<32>(sum);
  if (threadIdx.x % 32 == 0) partials[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int w = 0; w < SinkGradientTraits::kThreads / 32; ++w) total += partials[w];
    p.dsinks[head] = -total;
  }
}

SELFATTN_KERNELS_END
