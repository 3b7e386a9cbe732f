#pragma once
// FP8 attention inputs for the kernels that take 16- or 32-bit ones (AttentionOptions::q_descale):
// q, k or v, e4m3 or e5m2 with any strides, into a contiguous [batch, heads, seq, head_dim] buffer
// of T (the path's element, out's dtype), each value stored x descale in fp32, rounded once to T.
// Every path but the Hopper FP8 kernel then runs on the buffers as on any 16- or 32-bit call.
#include <cstdint>

#include "../common/simt_tile.cuh"
#include "../params.h"

SELFATTN_KERNELS_BEGIN

// The descale row of packed row `row`: the last sequence s with cu_seqlens[s] <= row, searched as
// if the offsets were ordered. Offsets out of order give some s in [0, sequences): a wrong descale
// for rows no sequence owns (their results are never written), never a read outside the array.
__device__ inline int dequantize_sequence_of(const int32_t* cu_seqlens, int sequences, int row) {
  int low = 0, high = sequences - 1;
  while (low < high) {
    const int mid = (low + high + 1) / 2;
    if (cu_seqlens[mid] <= row) {
      low = mid;
    } else {
      high = mid - 1;
    }
  }
  return low;
}

// grid (ceil(seq / kRowsPerBlock), heads, batch).
template <class T, class F>
__global__ void __launch_bounds__(DequantizeFp8Traits::kThreads) dequantize_fp8_kernel(const DequantizeFp8Params p) {
  const int b = blockIdx.z, head = blockIdx.y;
  const int first_row = blockIdx.x * DequantizeFp8Traits::kRowsPerBlock;
  const int d = p.head_dim;
  const F* in = static_cast<const F*>(p.in) + b * p.in_stride_batch + head * p.in_stride_head;
  T* out = static_cast<T*>(p.out) + (int64_t(b) * p.heads + head) * p.seq * d;
  const int kv_head = head / p.heads_per_descale;
  for (int i = threadIdx.x; i < DequantizeFp8Traits::kRowsPerBlock * d; i += blockDim.x) {
    const int row = first_row + i / d, e = i % d;
    if (row >= p.seq) break;
    float descale = 1.0f;
    if (p.descale != nullptr) {
      const int descale_batch = p.cu_seqlens != nullptr ? dequantize_sequence_of(p.cu_seqlens, p.sequences, row) : b;
      descale = p.descale[int64_t(descale_batch) * p.kv_heads + kv_head];
    }
    out[int64_t(row) * d + e] = from_float<T>(to_float(in[row * p.in_stride_row + e]) * descale);
  }
}

SELFATTN_KERNELS_END
