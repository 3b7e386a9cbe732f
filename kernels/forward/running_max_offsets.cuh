#pragma once
// A varlen call's cu_seqlens made non-decreasing before the fused kernels read them (see
// RunningMaxOffsetsParams): out[i] = max(in[0], ..., in[i]). The fused kernels clamp each entry into
// the views (flash_fwd_sequence.cuh), and clamping keeps the order, so with these offsets no two
// sequences share a row: out-of-order metadata gives empty sequences, never two blocks writing the
// same rows of out, lse, dq, dk or dv. One pass per call, so no block reads more than its own two
// entries, however many sequences the call has.
#include <climits>
#include <cstdint>

#include "../common/compat.h"
#include "../common/primitives.cuh"
#include "flash_fwd_params.h"

SELFATTN_KERNELS_BEGIN

__device__ __forceinline__ int32_t max_int32(int32_t a, int32_t b) { return a > b ? a : b; }

// Grid: 2 blocks, block b scans array b (0: q offsets, 1: k offsets). Any block size, with one
// int32 of dynamic shared memory per thread. Thread t owns entries [t * per_thread, (t + 1) *
// per_thread): it takes their maximum, the block scans those maxima (Hillis-Steele in shared
// memory), and the thread rewrites its run starting from the maximum of the runs before it.
__global__ void running_max_offsets_kernel(const RunningMaxOffsetsParams p) {
  const int threads = int(blockDim.x);
  // Selected, not indexed by blockIdx.x: a run-time index into the parameter arrays would copy them
  // to the stack.
  const int32_t* in = blockIdx.x == 0 ? p.in[0] : p.in[1];
  int32_t* out = blockIdx.x == 0 ? p.out[0] : p.out[1];
  const int t = int(threadIdx.x);
  const int per_thread = (p.count + threads - 1) / threads;
  const int begin = min(t * per_thread, p.count);
  const int end = min(begin + per_thread, p.count);

  int32_t run_max = INT_MIN;
  for (int i = begin; i < end; ++i) run_max = max_int32(run_max, in[i]);

  // maxima[t]: the maximum of the runs of threads 0..t once the scan is done.
  int32_t* maxima = dynamic_smem<int32_t>();
  maxima[t] = run_max;
  __syncthreads();
  for (int offset = 1; offset < threads; offset *= 2) {
    const int32_t earlier = t >= offset ? maxima[t - offset] : INT_MIN;
    __syncthreads();  // every thread has read this round's values before any is overwritten
    maxima[t] = max_int32(maxima[t], earlier);
    __syncthreads();  // every write of this round lands before the next round reads
  }

  int32_t running = t > 0 ? maxima[t - 1] : INT_MIN;
  for (int i = begin; i < end; ++i) {
    running = max_int32(running, in[i]);
    out[i] = running;
  }
}

SELFATTN_KERNELS_END
