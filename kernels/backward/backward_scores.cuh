#pragma once
// The elementwise step of the naive and cublas backward paths: from a chunk's recomputed S and dP
// rows to P and dS (see BackwardScoresParams for the formulas and what dS carries).
//
// A warp owns a row: lane l takes keys l, l + 32, ... Query row i sees keys [begin, end) of
// visible_key_range(i) (attention_heads.cuh), each score passed through modified_score()
// (score_mods.cuh) exactly as the forward's softmax does, so P matches the forward's probabilities
// given its LSE. Every other key gets P = dS = 0, as does a whole row whose LSE is -inf (it saw no
// key, or the bias masked every key): no exp(-inf - -inf) is ever evaluated, so no NaN.
// Writing P over S and dS over dP is safe: each element is read, then written, by the same lane.
#include <cmath>
#include <cstdint>

#include "../common/attention_heads.cuh"
#include "../common/compat.h"
#include "../common/primitives.cuh"
#include "../common/score_mods.cuh"
#include "../common/simt_tile.cuh"
#include "naive_backward_params.h"

SELFATTN_KERNELS_BEGIN

struct BackwardScoresTraits {
  static constexpr int kRowsPerBlock = 4;  // one warp per row, 4 warps: short rows leave few lanes idle per block
  static constexpr int kThreads = 32 * kRowsPerBlock;
};

// d/ds of softcap * tanh(s / softcap): the factor the softcap puts on a score's gradient.
__device__ inline float softcap_gradient(float scaled, float softcap) {
  const float t = tanhf(scaled / softcap);
  return 1.0f - t * t;
}

template <class PT>
__global__ void __launch_bounds__(BackwardScoresTraits::kThreads) backward_scores_kernel(const BackwardScoresParams p) {
  const int row = int(blockIdx.x) * BackwardScoresTraits::kRowsPerBlock + int(threadIdx.x / 32);
  if (row >= p.rows) return;  // whole warps leave; nothing below synchronises
  const int lane = int(threadIdx.x % 32);

  const int bh = p.bh_begin + int(blockIdx.y);
  const int batch = bh / p.heads;
  const int query = p.row_begin + row;
  const KeyRange seen = visible_key_range(p.mask, batch, query, p.seq_k);
  const HeadScoreMods mods = head_score_mods(p.mods, batch, bh % p.heads);
  const int aligned = aligned_key(query, sequence_keys(p.mask, batch, p.seq_k));
  const float lse = p.lse[int64_t(bh) * p.lse_pair_stride + query];
  const float d = p.d[int64_t(bh) * p.lse_pair_stride + query];
  const bool live = lse != -INFINITY;  // a row that saw no key keeps P = dS = 0

  const float* s = p.s + int64_t(blockIdx.y) * p.s_bh_stride + int64_t(row) * p.s_row_stride;
  const float* dp = p.dp + int64_t(blockIdx.y) * p.s_bh_stride + int64_t(row) * p.s_row_stride;
  PT* prob = static_cast<PT*>(p.p) + int64_t(blockIdx.y) * p.p_bh_stride + int64_t(row) * p.p_row_stride;
  PT* ds = static_cast<PT*>(p.ds) + int64_t(blockIdx.y) * p.p_bh_stride + int64_t(row) * p.p_row_stride;

  for (int key = lane; key < p.seq_k; key += 32) {
    float p_value = 0.0f, ds_value = 0.0f;
    if (live && key >= seen.begin && key < seen.end) {
      const float scaled = s[key] * p.scale;
      const float x = p.mods.changes_values ? modified_score(p.mods, mods, scaled, query, aligned, key) : scaled;
      p_value = expf(x - lse);  // x = -inf (a bias-masked key) gives 0
      float dp_value = dp[key];
      if (p.mods.dropout_threshold != 0) {
        // The forward's mask (dropout.cuh): dV takes P M / (1 - p), dP is dO.v through the same.
        const bool keep = dropout_keep(p.mods.dropout_seed, p.mods.dropout_offset, p.mods.dropout_threshold,
                                       mods.dropout_stream, query, key);
        dp_value = keep ? dp_value * p.mods.dropout_scale : 0.0f;
        ds_value = p_value * (dp_value - d) * p.scale;
        p_value = keep ? p_value * p.mods.dropout_scale : 0.0f;
      } else {
        ds_value = p_value * (dp_value - d) * p.scale;
      }
      if (p.mods.softcap > 0.0f) ds_value *= softcap_gradient(scaled, p.mods.softcap);
    }
    prob[key] = from_float<PT>(p_value);
    ds[key] = from_float<PT>(ds_value);
  }
}

SELFATTN_KERNELS_END
