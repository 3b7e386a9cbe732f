#pragma once
// What both fused kernels need to know about one (batch, head) before touching data: where its
// rows start, how many queries and keys it has, and which keys each query row sees.
#include <cstdint>

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

__host__ __device__ inline FlashSequence flash_sequence(const FlashFwdParams& p, int batch) {
  FlashSequence s;
  if (p.cu_seqlens_q != nullptr) {
    s.q_row_start = p.cu_seqlens_q[batch];
    s.q_len = int(p.cu_seqlens_q[batch + 1] - p.cu_seqlens_q[batch]);
    s.k_row_start = p.cu_seqlens_k[batch];
    s.k_len = int(p.cu_seqlens_k[batch + 1] - p.cu_seqlens_k[batch]);
  } else {
    s.q_row_start = 0;
    s.k_row_start = 0;
    s.q_len = p.seq_q;
    s.k_len = p.seq_k;
    if (p.key_lengths != nullptr) {
      const int given = p.key_lengths[batch];
      s.k_len = given < 0 ? 0 : (given > p.seq_k ? p.seq_k : given);
    }
  }
  return s;
}

// Query `row` sees keys [0, result). Non-decreasing in row, so a block's last row bounds the keys
// any of its rows needs. bottom_right aligns the last query with the last (visible) key.
__host__ __device__ inline int flash_visible_keys(int row, int q_len, int k_len, FlashCausal causal) {
  int visible = k_len;
  if (causal == FlashCausal::top_left) visible = row + 1;
  if (causal == FlashCausal::bottom_right) visible = row + 1 + (k_len - q_len);
  if (visible < 0) visible = 0;
  return visible < k_len ? visible : k_len;
}

SELFATTN_KERNELS_END
