#pragma once
// Merges two partial attention results (O, LSE) over disjoint key sets into the result over their
// union (selfattn::merge_states). One thread per row, reading the whole row before writing it, so
// out may be out_a itself (in-place merge).
#include <cmath>
#include <cstdint>

#include "../common/simt_tile.cuh"
#include "kv_cache_params.h"

SELFATTN_KERNELS_BEGIN

struct MergeStatesTraits {
  static constexpr int kThreads = 128;
};

template <class T>
__global__ void __launch_bounds__(MergeStatesTraits::kThreads) merge_states_kernel(const MergeStatesParams p) {
  const int64_t row = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= p.rows) return;
  const int s = int(row % p.seq);
  const int64_t bh = row / p.seq;
  const int h = int(bh % p.heads);
  const int64_t b = bh / p.heads;
  const T* a = static_cast<const T*>(p.out_a) + b * p.a_stride_batch + int64_t(h) * p.a_stride_head + int64_t(s) * p.a_stride_row;
  const T* o_b = static_cast<const T*>(p.out_b) + b * p.b_stride_batch + int64_t(h) * p.b_stride_head + int64_t(s) * p.b_stride_row;
  T* out = static_cast<T*>(p.out) + b * p.o_stride_batch + int64_t(h) * p.o_stride_head + int64_t(s) * p.o_stride_row;
  const float lse_a = p.lse_a[row], lse_b = p.lse_b[row];
  const float m = fmaxf(lse_a, lse_b);
  if (m == -INFINITY || m != m) {
    // No key on either side (or a NaN input, which stays visible as NaN).
    for (int e = 0; e < p.head_dim; ++e) out[e] = from_float<T>(m != m ? m : 0.0f);
    if (p.lse_out != nullptr) p.lse_out[row] = m;
    return;
  }
  const float w_a = expf(lse_a - m), w_b = expf(lse_b - m);
  const float sum = w_a + w_b;
  const float f_a = w_a / sum, f_b = w_b / sum;
  // A side without keys contributes nothing, whatever its O holds.
  const bool use_a = lse_a != -INFINITY, use_b = lse_b != -INFINITY;
  for (int e = 0; e < p.head_dim; ++e) {
    const float value = (use_a ? f_a * to_float(a[e]) : 0.0f) + (use_b ? f_b * to_float(o_b[e]) : 0.0f);
    out[e] = from_float<T>(value);
  }
  if (p.lse_out != nullptr) p.lse_out[row] = m + logf(sum);
}

SELFATTN_KERNELS_END
