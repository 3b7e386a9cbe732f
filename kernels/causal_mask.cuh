#pragma once
// The mask in one place for every kernel: which keys each query row sees.
#include <cstdint>

#include "common/compat.h"
#include "params.h"

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

SELFATTN_KERNELS_END
