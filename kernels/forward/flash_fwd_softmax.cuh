#pragma once
// The online softmax and the epilogue of both fused forward kernels (flash_fwd.cuh on mma.sync,
// hopper/flash_fwd_hopper_pipeline.cuh on wgmma), one query row of one thread at a time.
//
// Both kernels hold scores and O as m16n8 C fragments: for n8 column tile t, the thread's pair of
// columns 2*in_group + {0, 1} of row group + 8*half is at frag[4t + 2*half + {0, 1}]. The helpers
// take `row_frag = frag + 2*half`, so element j of column tile t is row_frag[4t + j]. (mma.sync's
// score[mt][nt][4] is that flat array per m-tile, wgmma's accumulator is it for the warpgroup.)
#include <cstdint>

#include "../common/compat.h"
#include "../common/primitives.cuh"
#include "flash_fwd_params.h"
#include "flash_fwd_sequence.cuh"
#include "../common/score_mods.cuh"

SELFATTN_KERNELS_BEGIN

// One query row's running softmax: the maximum score so far in the log2 domain (score * scale *
// log2 e), and this thread's part of the sum of exp2(score - max) (the quad's sum is taken once,
// in flash_store_row).
struct FlashRowState {
  float max;
  float sum;
};

__device__ __forceinline__ FlashRowState flash_row_start() { return {-INFINITY, 0.0f}; }

// One key tile of the online softmax for one row: masks, modifies and scales its KeyTiles8 x 2
// scores (keys key0 + 8t + 2*in_group + j), turns them into unnormalised probabilities
// exp2(score - max) in place, and folds them into `state`. Returns exp2(old max - new max), the
// factor the row's O must be multiplied by before this tile's P V is added (flash_rescale_row).
// With dropout (dropout.cuh) what stays in place is then the kept ones times 1 / (1 - p), zeros
// where dropped; `state` sums them all, before dropout. WithDropout: whether the kernel applies it
// at all (the Hopper kernel does not: calls with dropout run the mma.sync kernel, path_fused.cpp),
// so the Hopper kernel's code is what it was without dropout.
template <int KeyTiles8, bool WithDropout>
__device__ __forceinline__ float flash_softmax_row(const FlashFwdParams& p, const HeadScoreMods& mods,
                                                   const FlashSequence& seq, int row, int key0, int in_group,
                                                   bool needs_mask, float* row_frag, FlashRowState& state) {
  // Recomputed per tile rather than held in registers across the loop (a few integer ops).
  const KeyRange seen = needs_mask ? flash_visible_keys(p, seq, row) : KeyRange{0, 0};
  const int aligned = aligned_key(row, seq.keys);
  float tile_max = -INFINITY;
  SELFATTN_FLASH_UNROLL
  for (int t = 0; t < KeyTiles8; ++t) {
    SELFATTN_FLASH_UNROLL
    for (int j = 0; j < 2; ++j) {
      float& s = row_frag[4 * t + j];
      const int key = key0 + t * 8 + 2 * in_group + j;
      if (needs_mask && (key < seen.begin || key >= seen.end)) {
        s = -INFINITY;  // by selection: the raw score may be NaN (a key row past the sequence)
      } else if (p.mods.changes_values) {
        s = modified_score(p.mods, mods, s * p.scale, row, aligned, key) * kLog2e;
      } else {
        s *= p.scale_log2;
      }
      tile_max = fmaxf(tile_max, s);
    }
  }
  const float new_max = fmaxf(state.max, warp_reduce_max<4>(tile_max));
  // A row that has seen no key keeps max -inf; shifting by 0 then avoids (-inf) - (-inf) and
  // still maps its masked scores to exp2(-inf) = 0.
  const float shift = new_max == -INFINITY ? 0.0f : new_max;
  const float rescale = exp2f(state.max - shift);
  state.max = new_max;
  float sum = 0.0f;
  SELFATTN_FLASH_UNROLL
  for (int t = 0; t < KeyTiles8; ++t) {
    SELFATTN_FLASH_UNROLL
    for (int j = 0; j < 2; ++j) {
      float& s = row_frag[4 * t + j];
      s = exp2f(s - shift);
      sum += s;
    }
  }
  state.sum = state.sum * rescale + sum;
  // The softmax's sum is taken before dropout; P V takes the kept probabilities.
  if (WithDropout && p.mods.dropout_threshold != 0) {
    SELFATTN_FLASH_UNROLL
    for (int t = 0; t < KeyTiles8; ++t) {
      SELFATTN_FLASH_UNROLL
      for (int j = 0; j < 2; ++j) {
        float& s = row_frag[4 * t + j];
        s = dropout_apply(p.mods, mods.dropout_stream, row, key0 + t * 8 + 2 * in_group + j, s);
      }
    }
  }
  return rescale;
}

// O's row times `rescale` (its DimTiles8 x 2 elements of this thread).
template <int DimTiles8>
__device__ __forceinline__ void flash_rescale_row(float* row_acc, float rescale) {
  // Once a row's maximum settles (most tiles of a long row), rescale is exactly 1 and the
  // multiplies would change nothing: skipping them gives bit-identical results.
  if (rescale == 1.0f) return;
  SELFATTN_FLASH_UNROLL
  for (int t = 0; t < DimTiles8; ++t) {
    row_acc[4 * t] *= rescale;
    row_acc[4 * t + 1] *= rescale;
  }
}

// The epilogue of one row: O times softmax_row_end's inverse (1 / l without a sink) to `out` (the
// sequence's first row, this head) and the LSE. A row without visible keys has l = 0 and O = 0: it
// writes 0 and -inf (the sink's logit with one). Called by all four threads of the row's quad (the
// sum is reduced over them), for rows past q_len too (they write nothing).
template <class T, int DimTiles8>
__device__ __forceinline__ void flash_store_row(const FlashFwdParams& p, int batch, int head, const FlashSequence& seq,
                                                T* out, int row, int in_group, const float* row_acc,
                                                const FlashRowState& state) {
  const float sum = warp_reduce_sum<4>(state.sum);
  if (row >= seq.q_len) return;
  const SoftmaxRowEnd end = softmax_row_end</*Log2=*/true>(state.max, sum, head_sink(p.mods, head));
  T* out_row = out + row * p.out_stride_row;
  SELFATTN_FLASH_UNROLL
  for (int t = 0; t < DimTiles8; ++t) {
    const uint32_t pair = pack2<T>(row_acc[4 * t] * end.inverse, row_acc[4 * t + 1] * end.inverse);
    *reinterpret_cast<uint32_t*>(out_row + t * 8 + 2 * in_group) = pair;
  }
  if (p.lse != nullptr && in_group == 0) {
    p.lse[batch * p.lse_stride_batch + head * p.lse_stride_head + seq.q_row_start + row] = end.lse;
  }
}

SELFATTN_KERNELS_END
