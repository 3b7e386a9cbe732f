#pragma once
// Which (batch, head) a block of the naive-path kernels works on, and where that head's rows start.
#include <cstdint>

#include "common/compat.h"
#include "naive_params.h"

SELFATTN_KERNELS_BEGIN

// The flat pair index bh = batch * heads + head, and the kv head GQA maps the head to.
struct HeadOf {
  int batch, head, kv_head;
};
__host__ __device__ inline HeadOf head_of(int bh, int heads, int heads_per_kv) {
  const int head = bh % heads;
  return {bh / heads, head, head / heads_per_kv};
}

template <class T>
__host__ __device__ inline const T* head_rows(const HeadsView& view, int batch, int head) {
  return static_cast<const T*>(view.data) + batch * view.stride_batch + head * view.stride_head;
}

// Keys [0, visible) that query row `row` of batch `batch` sees:
//   visible = min(len_k, row + 1)                   causal top_left
//           = min(len_k, row + 1 + len_k - seq_q)   causal bottom_right (clamped at 0)
//           = len_k                                 no causal mask
// len_k = key_lengths[batch] clamped to [0, seq_k], or seq_k. Non-decreasing in row, so the last
// row of a tile sees every key any row of it sees.
__host__ __device__ inline int visible_keys(const KeyMask& mask, int batch, int row, int seq_k) {
  int len_k = seq_k;
  if (mask.key_lengths) {
    const int given = mask.key_lengths[batch];
    len_k = given < 0 ? 0 : (given < seq_k ? given : seq_k);
  }
  int visible = len_k;
  if (mask.causal == CausalMask::top_left) visible = row + 1;
  if (mask.causal == CausalMask::bottom_right) visible = row + 1 + len_k - mask.seq_q;
  return visible < 0 ? 0 : (visible < len_k ? visible : len_k);
}

SELFATTN_KERNELS_END
