#pragma once
// Which (batch, head) a block of the naive-path kernels works on, and where that head's rows start.
#include <cstdint>

#include "causal_mask.cuh"
#include "compat.h"
#include "../unfused/naive_params.h"

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

// Batch `batch`'s keys and row alignment (causal_mask.cuh).
__host__ __device__ inline SequenceKeys sequence_keys(const KeyMask& mask, int batch, int seq_k) {
  return sequence_keys(mask.seq_q, key_length(mask.key_lengths, batch, seq_k), mask.causal, mask.key_start,
                       mask.q_offset, batch);
}

// Keys [begin, end) that query row `row` (of the whole call) of batch `batch` sees.
__host__ __device__ inline KeyRange visible_key_range(const KeyMask& mask, int batch, int row, int seq_k) {
  return visible_key_range(row, sequence_keys(mask, batch, seq_k), mask.causal, mask.window_left, mask.window_right);
}

// Keys the chunk rows [row0, row0 + tile_rows) see at most: from the first row's begin to the last
// row's end (both bounds are non-decreasing in row). Key tiles outside are skipped by Q K^T and
// summed by nobody in P V. ChunkParams: QkParams or PvParams (mask, rows, row_begin, seq_k).
template <class ChunkParams>
__device__ inline KeyRange tile_visible_keys(const ChunkParams& p, int batch, int row0, int tile_rows) {
  const int last = (row0 + tile_rows < p.rows ? row0 + tile_rows : p.rows) - 1;
  const KeyRange first_row = visible_key_range(p.mask, batch, p.row_begin + row0, p.seq_k);
  const KeyRange last_row = visible_key_range(p.mask, batch, p.row_begin + last, p.seq_k);
  return {first_row.begin, last_row.end};
}

SELFATTN_KERNELS_END
