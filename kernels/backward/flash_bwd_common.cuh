#pragma once
// What both fused backward kernels (flash_bwd_dkdv.cuh, flash_bwd_dq.cuh) compute per score, and how
// they store a gradient. The math, per (batch, head), query row i and key j it sees:
//   x_ij = mods(scale q_i.k_j)          (score_mods.cuh; log2 units below: one exp2 per probability)
//   P_ij = exp(x_ij - lse_i)            (0 for a masked key, and for a row whose lse is -inf)
//   dS_ij = P_ij (dP_ij - D_i) * mods'  (softcap: 1 - tanh^2(scale q_i.k_j / softcap); ALiBi and bias: 1)
// with dP_ij = dO_i.v_j and D_i = dO_i.O_i (backward_dot.cuh). With dropout (dropout.cuh; mask M,
// rate p) dV takes P_ij M_ij / (1 - p) and dP_ij = dO_i.v_j M_ij / (1 - p); dS keeps its form.
#include <cstdint>

#include "../common/compat.h"
#include "../common/primitives.cuh"
#include "../forward/flash_fwd_sequence.cuh"
#include "../common/score_mods.cuh"
#include "../common/simt_tile.cuh"
#include "flash_bwd_params.h"

SELFATTN_KERNELS_BEGIN

// P and dS of one score (see the top). `raw` is the unscaled q.k (an mma accumulator), `dp` its
// dO.v, `visible` whether the mask leaves the key to the row. `lse_log2` is the row's LSE times
// log2(e) (-inf: the row saw no key in the forward, so P is 0 and the exp2 below never sees
// (-inf) - (-inf)).
struct FlashBwdScore {
  float p, ds;
};
__device__ __forceinline__ FlashBwdScore flash_bwd_score(const FlashFwdParams& f, const HeadScoreMods& mods, float raw,
                                                         float dp, bool visible, int row, int aligned, int key,
                                                         float lse_log2, float d_row) {
  if (!visible || lse_log2 == -INFINITY) return {0.0f, 0.0f};
  float x;
  float factor = 1.0f;
  if (f.mods.changes_values) {
    x = modified_score(f.mods, mods, raw * f.scale, row, aligned, key) * kLog2e;
    if (f.mods.softcap > 0.0f) {
      // d/ds softcap * tanh(s / softcap) = 1 - tanh^2(s / softcap): the derivative of the softcap
      // step of modified_score(), at the same s.
      const float t = tanhf(raw * f.scale / f.mods.softcap);
      factor = 1.0f - t * t;
    }
  } else {
    x = raw * f.scale_log2;
  }
  const float p = exp2f(x - lse_log2);  // a -inf bias gives x = -inf and p = 0
  if (f.mods.dropout_threshold != 0) {
    // dV takes the forward's dropped P (kept / (1 - p)); dP's element is dO.v_j through the same
    // mask and scale. D_i = dO_i.O_i is still sum_j P_ij dP_ij with both dropped: dS as below.
    if (!dropout_keep(f.mods.dropout_seed, f.mods.dropout_offset, f.mods.dropout_threshold, mods.dropout_stream, row,
                      key)) {
      return {0.0f, -p * d_row * factor};
    }
    return {p * f.mods.dropout_scale, p * (dp * f.mods.dropout_scale - d_row) * factor};
  }
  return {p, p * (dp - d_row) * factor};
}

// Stores two adjacent elements (columns c, c + 1 of one row) of a gradient in its element type.
// 16-bit pairs go as one 32-bit store: rows are 16-byte aligned (the host checks) and c is even.
__device__ __forceinline__ void flash_bwd_store_pair(void* base, Element element, int64_t offset, float lo, float hi) {
  switch (element) {
    case Element::f16: *reinterpret_cast<uint32_t*>(static_cast<__half*>(base) + offset) = pack_half2(lo, hi); return;
    case Element::bf16:
      *reinterpret_cast<uint32_t*>(static_cast<__nv_bfloat16*>(base) + offset) = pack_bf162(lo, hi);
      return;
    case Element::f32: break;
  }
  float* out = static_cast<float*>(base) + offset;
  out[0] = lo;
  out[1] = hi;
}

// The entry of query row `row` of (batch, head) in the LSE's layout (flash_bwd_params.h).
__device__ __forceinline__ int64_t flash_bwd_row_entry(const FlashFwdParams& f, const FlashSequence& seq, int batch,
                                                       int head, int row) {
  return batch * f.lse_stride_batch + head * f.lse_stride_head + seq.q_row_start + row;
}

SELFATTN_KERNELS_END

SELFATTN_KERNELS_BEGIN

// The query rows [begin, end) of a sequence that may see a key of [key_begin, key_end): every row
// that does lies inside (a row inside may see none of them, e.g. an empty row: its P is 0). Both
// bounds of a row's visible keys are non-decreasing in the row (causal_mask.cuh), so the first row
// whose keys end past key_begin and the first row whose keys begin at or past key_end are found by
// bisection: a block's cost follows the rows that see it (a sliding window's does not grow with seq).
__device__ __forceinline__ KeyRange flash_bwd_rows_seeing(const FlashFwdParams& f, const FlashSequence& seq,
                                                          int key_begin, int key_end) {
  if (key_end <= key_begin || seq.q_len <= 0) return {0, 0};
  int low = 0, high = seq.q_len;  // first row with end > key_begin lies in [low, high]
  while (low < high) {
    const int mid = low + (high - low) / 2;
    if (flash_visible_keys(f, seq, mid).end > key_begin) high = mid;
    else low = mid + 1;
  }
  const int begin = low;
  high = seq.q_len;  // first row with begin >= key_end lies in [low, high]
  while (low < high) {
    const int mid = low + (high - low) / 2;
    if (flash_visible_keys(f, seq, mid).begin >= key_end) high = mid;
    else low = mid + 1;
  }
  return {begin, low};
}

SELFATTN_KERNELS_END
