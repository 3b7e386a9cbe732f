#pragma once
// Rotary position embedding of whole rows into a separate tensor: row s of sequence b (dense or
// packed rows, new_rows.cuh) is rotated at position lengths[b] - count_b + s (new query rows: their
// place at the end of the cache; the standalone rotary_embedding(), lengths null: at s), or where
// the caller's positions put it (rotary_position()). Used to rotate q on its way into attention over a
// cache; the cache's K is rotated by kv_append.
#include <cstdint>

#include "../common/simt_tile.cuh"
#include "new_rows.cuh"
#include "rotary.cuh"

SELFATTN_KERNELS_BEGIN

struct RotaryRowsTraits {
  static constexpr int kThreads = 128;
  static constexpr int kRowsPerBlock = 4;
};

template <class T>
__global__ void __launch_bounds__(RotaryRowsTraits::kThreads) rotary_rows_kernel(const RotaryRowsParams p) {
  const int b = blockIdx.z, head = blockIdx.y;
  const int first_row = blockIdx.x * RotaryRowsTraits::kRowsPerBlock;
  const int d = p.head_dim;
  const SequenceRows rows = sequence_rows(p.rows, b);
  // 64-bit: any length less the rows; rotary_element clamps it to the table.
  const int64_t position0 = p.lengths != nullptr ? int64_t(p.lengths[b]) - rows.count : 0;
  const T* in = static_cast<const T*>(p.in) + int64_t(rows.entry) * p.in_stride_batch +
                int64_t(head) * p.in_stride_head + int64_t(rows.first) * p.in_stride_row;
  T* out = static_cast<T*>(p.out) + int64_t(rows.entry) * p.out_stride_batch + int64_t(head) * p.out_stride_head +
           int64_t(rows.first) * p.out_stride_row;
  for (int i = threadIdx.x; i < RotaryRowsTraits::kRowsPerBlock * d; i += blockDim.x) {
    const int s = first_row + i / d, e = i % d;
    if (s >= rows.count) break;
    const T* row = in + int64_t(s) * p.in_stride_row;
    const int64_t position = rotary_position(p.rotary, b, position0, s);
    const float value = rotary_element(p.rotary, position, e, [&](int j) { return to_float(row[j]); });
    out[int64_t(s) * p.out_stride_row + e] = from_float<T>(value);
  }
}

SELFATTN_KERNELS_END
