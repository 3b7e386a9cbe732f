#pragma once
// Where a cached token lives, with every index derived from device metadata clamped to the view:
// the one place the KV-cache kernels turn (sequence, token) into memory.
#include <cstdint>

#include "../common/compat.h"
#include "../common/simt_tile.cuh"
#include "kv_cache_params.h"

SELFATTN_KERNELS_BEGIN

__host__ __device__ inline int kv_capacity(const KvPagesView& c) { return c.page_size * c.max_pages_per_seq; }

// Sequence b's length clamped to [0, capacity]: a wrong length can only mean fewer or more of the
// sequence's own slots, never memory past them.
__device__ inline int kv_length(const KvPagesView& c, int b) {
  const int length = c.lengths[b];
  return length < 0 ? 0 : (length > kv_capacity(c) ? kv_capacity(c) : length);
}

// The page holding token t of sequence b, or -1 when t is outside [0, capacity) or the block
// table (contiguous: the batch index) names a page outside [0, num_pages).
__device__ inline int kv_page_of(const KvPagesView& c, int b, int t) {
  if (t < 0 || t >= kv_capacity(c)) return -1;
  if (c.block_table == nullptr) {
    const int row = c.batch_index != nullptr ? c.batch_index[b] : b;
    return row >= 0 && row < c.num_pages ? row : -1;
  }
  const int page = c.block_table[int64_t(b) * c.max_pages_per_seq + t / c.page_size];
  return (page >= 0 && page < c.num_pages) ? page : -1;
}

// Element offsets of row t's head `head` in K and V (page must be kv_page_of(c, b, t) >= 0).
__device__ inline int64_t kv_k_offset(const KvPagesView& c, int page, int head, int t) {
  return int64_t(page) * c.k_stride_page + int64_t(head) * c.k_stride_head + int64_t(t % c.page_size) * c.k_stride_row;
}
__device__ inline int64_t kv_v_offset(const KvPagesView& c, int page, int head, int t) {
  return int64_t(page) * c.v_stride_page + int64_t(head) * c.v_stride_head + int64_t(t % c.page_size) * c.v_stride_row;
}

// An FP8 cache's scale of kv head `head` (k_scale or v_scale): per tensor [0], per kv head [head],
// the index clamped to [0, scale_count) so no head can read past the caller's scales.
__device__ inline float kv_scale(const float* scales, int scale_count, int head) {
  return scales[scale_count > 1 ? (head < 0 ? 0 : (head < scale_count ? head : scale_count - 1)) : 0];
}

// K's and V's scales of kv head `head` in a cache of element type Cache: an FP8 cache's
// (kv_scale()), 1 for every other element type.
struct KvScales {
  float k = 1.0f, v = 1.0f;
};
template <class Cache>
__device__ inline KvScales kv_scales(const KvPagesView& c, int head) {
  KvScales scales;
  if constexpr (IsFp8<Cache>::value) {
    scales.k = kv_scale(c.k_scale, c.scale_count, head);
    scales.v = kv_scale(c.v_scale, c.scale_count, head);
  }
  return scales;
}

SELFATTN_KERNELS_END
