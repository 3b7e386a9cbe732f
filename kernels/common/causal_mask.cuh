#pragma once
// The mask in one place for every kernel: which keys each query row sees.
#include <cstdint>

#include "compat.h"
#include "../params.h"

SELFATTN_KERNELS_BEGIN

// A batch's key length: key_lengths[batch] clamped to [0, seq_k], or seq_k without key lengths.
__host__ __device__ inline int key_length(const int32_t* key_lengths, int batch, int seq_k) {
  if (key_lengths == nullptr) return seq_k;
  const int given = key_lengths[batch];
  return given < 0 ? 0 : (given < seq_k ? given : seq_k);
}

// Query `row` of a sequence with q_len queries and k_len keys sees keys [0, result):
//   none          k_len
//   top_left      min(k_len, row + 1)
//   bottom_right  min(k_len, row + 1 + k_len - q_len), at least 0
// Non-decreasing in row, so the last row of a tile bounds the keys any row of it sees.
__host__ __device__ inline int visible_keys(int row, int q_len, int k_len, CausalMask causal) {
  int visible = k_len;
  if (causal == CausalMask::top_left) visible = row + 1;
  if (causal == CausalMask::bottom_right) visible = row + 1 + (k_len - q_len);
  if (visible < 0) visible = 0;
  return visible < k_len ? visible : k_len;
}

// The key position row `row` is aligned with (selfattn::Causal in types.h): row itself under
// top_left, row + (k_len - q_len) under bottom_right and under none (so a window or ALiBi without a
// causal mask is aligned at the last key, as FlashAttention does).
__host__ __device__ inline int aligned_row(int row, int q_len, int k_len, CausalMask causal) {
  return causal == CausalMask::top_left ? row : row + (k_len - q_len);
}

// Keys [begin, end) that query `row` sees under the causal mask and the sliding window
// (window_left, window_right; -1 unbounded): with i' = aligned_row(row),
//   end   = min(visible_keys(row), i' + window_right + 1)
//   begin = max(0, i' - window_left)
// and begin >= end means none (normalised to begin == end, both in [0, k_len]). Both bounds are
// non-decreasing in row, so the first and the last row of a tile bound the keys any row of it sees.
struct KeyRange {
  int begin, end;
  __host__ __device__ bool empty() const { return begin >= end; }
};
__host__ __device__ inline KeyRange visible_key_range(int row, int q_len, int k_len, CausalMask causal, int window_left,
                                                      int window_right) {
  const int i = aligned_row(row, q_len, k_len, causal);
  KeyRange range{0, visible_keys(row, q_len, k_len, causal)};
  // int64 sums: an aligned row near INT_MAX plus a wide window must not wrap.
  if (window_right >= 0 && int64_t(i) + window_right + 1 < range.end) range.end = int(int64_t(i) + window_right + 1);
  if (window_left >= 0 && int64_t(i) - window_left > 0) range.begin = int(int64_t(i) - window_left);
  if (range.end < 0) range.end = 0;
  if (range.begin > range.end) range.begin = range.end;
  return range;
}

SELFATTN_KERNELS_END
