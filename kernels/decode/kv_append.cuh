#pragma once
// Appends new tokens' K and V to a cache (contiguous or paged): token t of sequence b (dense or
// packed rows, new_rows.cuh) goes to position lengths[b] + t, K optionally rotated at that position. V's rows may be
// shorter or longer than K's; a V that is a view of K's leading columns is written with K. Tokens that would land past
// the capacity or in a page outside the pool are dropped (kv_page_of), so no length or block-table entry can make this
// write outside the cache.
//
// T is k_new's and v_new's element, C the cache's: T itself (K rounded once after rotary, V copied
// as it is), or FP8 (C = __nv_fp8_e4m3 / e5m2): K rotated in fp32 first, then each value divided
// by its kv head's scale in fp32 (IEEE division) and quantized by from_float<C> (round to nearest
// even, saturating to the finite range), so that stored x scale approximates the value.
#include <cstdint>

#include "../common/simt_tile.cuh"
#include "kv_pages.cuh"
#include "new_rows.cuh"
#include "rotary.cuh"

SELFATTN_KERNELS_BEGIN

struct KvAppendTraits {
  static constexpr int kThreads = 128;
  static constexpr int kRowsPerBlock = 4;
};

template <class T, class C = T>
__global__ void __launch_bounds__(KvAppendTraits::kThreads) kv_append_kernel(const KvAppendParams p) {
  const int b = blockIdx.z, head = blockIdx.y;
  const int first_row = blockIdx.x * KvAppendTraits::kRowsPerBlock;
  // K's rows are d long, V's dv; a thread takes element e of both (e past one's width: the other's alone).
  const int d = p.cache.head_dim, dv = p.cache.head_dim_v, width = d > dv ? d : dv;
  // The clamped length: a negative one appends at 0, one past the capacity drops every token.
  const int start = kv_length(p.cache, b);
  const SequenceRows rows = sequence_rows(p.rows, b);
  if (p.updated_lengths != nullptr && blockIdx.x == 0 && head == 0 && threadIdx.x == 0) {
    const int capacity = kv_capacity(p.cache);
    p.updated_lengths[b] = start + rows.count > capacity ? capacity : start + rows.count;
  }
  const T* k_new = static_cast<const T*>(p.k_new) + int64_t(rows.entry) * p.new_stride_batch_k +
                   int64_t(head) * p.new_stride_head_k + int64_t(rows.first) * p.new_stride_row_k;
  // Null when V is a view of K's leading columns: K's write is V's too.
  const T* v_new = p.v_new == nullptr
                       ? nullptr
                       : static_cast<const T*>(p.v_new) + int64_t(rows.entry) * p.new_stride_batch_v +
                             int64_t(head) * p.new_stride_head_v + int64_t(rows.first) * p.new_stride_row_v;
  C* k_cache = static_cast<C*>(p.cache.k);
  C* v_cache = static_cast<C*>(p.cache.v);
  const KvScales scales = kv_scales<C>(p.cache, head);
  for (int i = threadIdx.x; i < KvAppendTraits::kRowsPerBlock * width; i += blockDim.x) {
    const int t = first_row + i / width, e = i % width;
    if (t >= rows.count) break;
    const int position = start + t;
    const int page = kv_page_of(p.cache, b, position);
    if (page < 0) continue;
    if (e < d) {
      const T* k_row = k_new + int64_t(t) * p.new_stride_row_k;
      const int64_t position_rotated = rotary_position(p.rotary, b, start, t);
      const float k_value = rotary_element(p.rotary, position_rotated, e, [&](int j) { return to_float(k_row[j]); });
      if constexpr (IsFp8<C>::value) {
        k_cache[kv_k_offset(p.cache, page, head, position) + e] = from_float<C>(k_value / scales.k);
      } else {
        k_cache[kv_k_offset(p.cache, page, head, position) + e] = from_float<T>(k_value);
      }
    }
    if (e < dv && v_new != nullptr) {
      const T v_value = v_new[int64_t(t) * p.new_stride_row_v + e];
      if constexpr (IsFp8<C>::value) {
        v_cache[kv_v_offset(p.cache, page, head, position) + e] = from_float<C>(to_float(v_value) / scales.v);
      } else {
        v_cache[kv_v_offset(p.cache, page, head, position) + e] = v_value;
      }
    }
  }
}

SELFATTN_KERNELS_END
