#pragma once
// Parameters of the kernels every backward path shares (kernels/backward/): the preprocessing of
// D = rowsum(dO * O) and the store of an fp32 gradient accumulator. Plain data, the same for nvcc
// and the host compiler. Strides are in elements; head_dim's stride is 1.
//
// The backward's row layout (D, and the forward's LSE it sits beside): [batch, heads, rows]
// contiguous, rows = seq_q; a varlen call is batch 1 with rows = total_q (its views are
// [1, heads, total_q, head_dim]).
#include <cstddef>
#include <cstdint>

#include "../launch.h"
#include "../params.h"

namespace selfattn::kernels {

// d[(b * heads + h) * rows + i] = sum_c dout[b, h, i, c] * out[b, h, i, c] in fp32, minus
// dlse[(b * heads + h) * rows + i] when dlse is set (the LSE's upstream gradient, same layout).
// One warp per row; grid.x blocks of BackwardDotTraits::kRowsPerBlock rows, a grid-stride loop over
// the batch * heads * rows rows.
struct BackwardDotParams {
  const void* out;
  const void* dout;
  int64_t out_stride_batch, out_stride_head, out_stride_row;
  int64_t dout_stride_batch, dout_stride_head, dout_stride_row;
  float* d;
  const float* dlse;  // null: no gradient through the LSE
  int batch, heads, rows, head_dim;
};

// out[b, h, s, c] = multiplier * accumulator[((b * heads + h) * seq + s) * head_dim + c], stored in
// out's element type (the kernel's template argument) at out's strides. Grid-stride over elements.
struct StoreGradientParams {
  const float* accumulator;
  void* out;
  int64_t out_stride_batch, out_stride_head, out_stride_row;
  int batch, heads, seq, head_dim;
  float multiplier;
};

// dsinks[h] = -sum over b and i < rows_end of exp(sinks[h] - lse[r]) * d[r], r = (b * heads + h) *
// rows + i: the gradient of head h's sink logit (a key with value 0 whose probability in row r is
// exp(sink - lse_r); d is D - dlse, so a gradient through the LSE is in it). 0 for a head whose
// sink is -inf. rows_end: device int32 (a varlen call's cu_seqlens_q[batch], the end of its last
// sequence, clamped to [0, rows]) or null for all rows. One block per head (grid.x = heads).
struct SinkGradientParams {
  const float* lse;
  const float* d;
  const float* sinks;
  float* dsinks;
  const int32_t* rows_end;
  int batch, heads, rows;
};

// What the registry hands the host for one of these kernels.
struct BackwardKernel {
  KernelRef kernel;
  int threads = 0;
  int rows_per_block = 0;  // backward_dot: rows per block; store_gradient: elements per thread step
  size_t smem_bytes = 0;
};

}  // namespace selfattn::kernels
