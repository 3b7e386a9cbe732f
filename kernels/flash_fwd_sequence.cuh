#pragma once
// What both fused kernels need to know about one (batch, head) before touching data: where its
// rows start, how many queries and keys it has, and which keys each query row sees.
#include <cstdint>

#include "causal_mask.cuh"
#include "common/compat.h"
#include "flash_fwd_params.h"

// Loops over register fragments must be unrolled completely, or the fragment arrays they index
// move to local memory (nvcc). The host compiler (sim) does not need it.
#if SELFATTN_SIM
#define SELFATTN_FLASH_UNROLL
#else
#define SELFATTN_FLASH_UNROLL _Pragma("unroll")
#endif

SELFATTN_KERNELS_BEGIN

struct FlashSequence {
  int64_t q_row_start;  // first row of this sequence in q/out/lse (varlen packing), else 0
  int64_t k_row_start;
  int q_len;
  int k_len;
};

__host__ __device__ inline int32_t flash_clamp_row(int32_t row, int32_t low, int32_t high) {
  return row < low ? low : (row > high ? high : row);
}

__host__ __device__ inline FlashSequence flash_sequence(const FlashFwdParams& p, int batch) {
  FlashSequence s;
  if (p.cu_seqlens_q != nullptr) {
    // cu_seqlens are device data nobody checked: each sequence's rows are clamped into the views
    // ([0, total_q) of q/out/lse, [0, total_k) of k/v), so a wrong entry gives a wrong (possibly
    // empty) sequence but no access outside them.
    const int32_t q_begin = flash_clamp_row(p.cu_seqlens_q[batch], 0, p.total_q);
    const int32_t k_begin = flash_clamp_row(p.cu_seqlens_k[batch], 0, p.total_k);
    s.q_row_start = q_begin;
    s.q_len = flash_clamp_row(p.cu_seqlens_q[batch + 1], q_begin, p.total_q) - q_begin;
    s.k_row_start = k_begin;
    s.k_len = flash_clamp_row(p.cu_seqlens_k[batch + 1], k_begin, p.total_k) - k_begin;
  } else {
    s.q_row_start = 0;
    s.k_row_start = 0;
    s.q_len = p.seq_q;
    s.k_len = key_length(p.key_lengths, batch, p.seq_k);
  }
  return s;
}

SELFATTN_KERNELS_END
