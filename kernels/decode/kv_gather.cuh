#pragma once
// Copies each sequence's cached K and V into dense [batch, kv_heads, capacity, head_dim] buffers
// (any strides: [batch, capacity, kv_heads, head_dim] for a packed call),
// so the naive and cublas paths (and the fused prefill kernel) run on them as on any padded batch
// with key_lengths. Rows at or past the sequence's length become zeros, as do rows whose page is
// outside the pool (kv_page_of): the paths multiply those rows by zero probabilities, and zeros
// keep that product finite.
//
// T is the gathered buffers' element (q's), C the cache's: T itself (a copy), or FP8, dequantized
// as stored x its kv head's scale in fp32 and rounded once to T.
#include <cstdint>

#include "../common/simt_tile.cuh"
#include "kv_pages.cuh"

SELFATTN_KERNELS_BEGIN

struct KvGatherTraits {
  static constexpr int kThreads = 128;
  static constexpr int kRowsPerBlock = 4;
};

template <class T, class C = T>
__global__ void __launch_bounds__(KvGatherTraits::kThreads) kv_gather_kernel(const KvGatherParams p) {
  const int b = blockIdx.z, head = blockIdx.y;
  const int first_row = blockIdx.x * KvGatherTraits::kRowsPerBlock;
  const int d = p.cache.head_dim;
  const int length = kv_length(p.cache, b);
  const int64_t dense_head = int64_t(b) * p.out_stride_batch + int64_t(head) * p.out_stride_head;
  T* k_out = static_cast<T*>(p.k_out) + dense_head;
  T* v_out = static_cast<T*>(p.v_out) + dense_head;
  const C* k_cache = static_cast<const C*>(p.cache.k);
  const C* v_cache = static_cast<const C*>(p.cache.v);
  const KvScales scales = kv_scales<C>(p.cache, head);
  for (int i = threadIdx.x; i < KvGatherTraits::kRowsPerBlock * d; i += blockDim.x) {
    const int t = first_row + i / d, e = i % d;
    if (t >= p.capacity) break;
    const int page = t < length ? kv_page_of(p.cache, b, t) : -1;
    const int64_t dense = int64_t(t) * p.out_stride_row + e;
    if (page < 0) {
      k_out[dense] = from_float<T>(0.0f);
      v_out[dense] = from_float<T>(0.0f);
      continue;
    }
    if constexpr (IsFp8<C>::value) {
      k_out[dense] = from_float<T>(to_float(k_cache[kv_k_offset(p.cache, page, head, t) + e]) * scales.k);
      v_out[dense] = from_float<T>(to_float(v_cache[kv_v_offset(p.cache, page, head, t) + e]) * scales.v);
    } else {
      k_out[dense] = k_cache[kv_k_offset(p.cache, page, head, t) + e];
      v_out[dense] = v_cache[kv_v_offset(p.cache, page, head, t) + e];
    }
  }
}

SELFATTN_KERNELS_END
