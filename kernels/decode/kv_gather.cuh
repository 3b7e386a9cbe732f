#pragma once
// Copies each sequence's cached K and V into dense [batch, kv_heads, capacity, d] buffers (d: K's
// head_dim, V's head_dim_v; any strides: [batch, capacity, kv_heads, d] for a packed call),
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
  // K's rows are d long, V's dv; a thread takes element e of both (e past one's width: the other's alone).
  const int d = p.cache.head_dim, dv = p.cache.head_dim_v, width = d > dv ? d : dv;
  const int length = kv_length(p.cache, b);
  T* k_out = static_cast<T*>(p.k_out) + int64_t(b) * p.k_out_stride_batch + int64_t(head) * p.k_out_stride_head;
  T* v_out = static_cast<T*>(p.v_out) + int64_t(b) * p.v_out_stride_batch + int64_t(head) * p.v_out_stride_head;
  const C* k_cache = static_cast<const C*>(p.cache.k);
  const C* v_cache = static_cast<const C*>(p.cache.v);
  const KvScales scales = kv_scales<C>(p.cache, head);
  // Stored value to T: a copy, or an FP8 value times its scale in fp32, rounded once.
  const auto real = [](C stored, float scale) {
    if constexpr (IsFp8<C>::value) return from_float<T>(to_float(stored) * scale);
    else return stored;
  };
  for (int i = threadIdx.x; i < KvGatherTraits::kRowsPerBlock * width; i += blockDim.x) {
    const int t = first_row + i / width, e = i % width;
    if (t >= p.capacity) break;
    const int page = t < length ? kv_page_of(p.cache, b, t) : -1;
    if (e < d) {
      k_out[int64_t(t) * p.k_out_stride_row + e] =
          page < 0 ? from_float<T>(0.0f) : real(k_cache[kv_k_offset(p.cache, page, head, t) + e], scales.k);
    }
    if (e < dv) {
      v_out[int64_t(t) * p.v_out_stride_row + e] =
          page < 0 ? from_float<T>(0.0f) : real(v_cache[kv_v_offset(p.cache, page, head, t) + e], scales.v);
    }
  }
}

SELFATTN_KERNELS_END
