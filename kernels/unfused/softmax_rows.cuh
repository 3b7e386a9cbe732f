#pragma once
// P = softmax(modified(scale * S) + mask) row by row, plus the row's natural-log LSE; shared by the
// naive and cublas paths (see SoftmaxParams). Query row i sees keys [begin, end) of
// visible_key_range(i) (attention_heads.cuh), each score passed through modified_score()
// (score_mods.cuh: softcap, ALiBi, bias); other keys get P = 0. A row that sees no key, or whose
// every visible key the bias masks (-inf), gets P = 0 everywhere and LSE = -inf, never NaN (no
// exp(-inf - -inf) is ever evaluated, and the sum is tested, not the count). With a sink the row's
// probabilities sum to less than 1 (softmax_row_end, score_mods.cuh), and a row without keys gets
// LSE = the sink's logit. With dropout (dropout.cuh) the P written is the kept probabilities times
// 1 / (1 - p), zeros where dropped (with SoftmaxParams::dropout_signs: the probabilities unscaled,
// negated where dropped); the LSE is the softmax's, before dropout.
//
// A "row group" of Group threads owns one row: a warp (Group 32, 4 rows per 128-thread block) for
// short rows, the whole block (Group 256) for long ones. Cached: the row is read once into registers
// (Group * kCachedPerThread keys at most), max and sum are two group reductions. Not cached: one
// streaming pass keeps an online (max, sum) per thread, merged by the group; a second pass writes P.
// Writing P over S (p == s) is safe: each element is read and later written by the same thread.
#include <cmath>
#include <cstdint>

#include "../common/compat.h"
#include "../common/attention_heads.cuh"
#include "../common/primitives.cuh"
#include "naive_params.h"
#include "../common/score_mods.cuh"
#include "../common/simt_tile.cuh"

SELFATTN_KERNELS_BEGIN

struct SoftmaxTraits {
  static constexpr int kCachedPerThread = 8;  // keys held in registers per thread: rows up to 8 x Group read once
  static constexpr int kWarpRowsPerBlock = 4; // warp-per-row blocks of 128 threads: enough warps per SM, small tail
  static constexpr int kBlockThreads = 256;   // block-per-row group: 8 warps share a long row's bandwidth
  static constexpr size_t kSmemBytes = 32 * sizeof(float);  // one partial per warp for block reductions
};

// Reductions over the row group. A block-wide group passes partials through shared memory. A row
// takes one group_max, then one group_sum: group_max ends with a barrier so that group_sum may
// overwrite the partials it reads; group_sum, the row's last use of them, needs none.
template <int Group>
__device__ inline float group_max(float value, float* partials) {
  value = warp_reduce_max<32>(value);
  if constexpr (Group == 32) {
    return value;
  } else {
    if (lane_id() == 0) partials[threadIdx.x / 32] = value;
    __syncthreads();
    float result = partials[0];
    for (int w = 1; w < Group / 32; ++w) result = fmaxf(result, partials[w]);
    __syncthreads();
    return result;
  }
}
template <int Group>
__device__ inline float group_sum(float value, float* partials) {
  value = warp_reduce_sum<32>(value);
  if constexpr (Group == 32) {
    return value;
  } else {
    if (lane_id() == 0) partials[threadIdx.x / 32] = value;
    __syncthreads();
    float result = 0;
    for (int w = 0; w < Group / 32; ++w) result += partials[w];
    return result;
  }
}

// exp(x - max) that is 0, not NaN, when the row has no visible key (max = -inf).
__device__ inline float exp_below(float x, float max) { return max == -INFINITY ? 0.0f : expf(x - max); }

template <class P, int Group, bool Cached>
__global__ void __launch_bounds__(Group == 32 ? 32 * SoftmaxTraits::kWarpRowsPerBlock : Group)
    softmax_rows_kernel(const SoftmaxParams p) {
  static_assert(Group == 32 || Group == SoftmaxTraits::kBlockThreads, "a warp or the block owns a row");
  float* partials = dynamic_smem<float>();
  const int row = Group == 32 ? int(blockIdx.x) * SoftmaxTraits::kWarpRowsPerBlock + int(threadIdx.x / 32)
                              : int(blockIdx.x);
  if (row >= p.rows) return;  // uniform over the row group: whole warps leave, a block's row exists
  const int member = int(threadIdx.x) % Group;

  const int bh = p.bh_begin + int(blockIdx.y);
  const int batch = bh / p.heads;
  const int query = p.row_begin + row;
  const KeyRange seen = visible_key_range(p.mask, batch, query, p.seq_k);
  const HeadScoreMods mods = head_score_mods(p.mods, batch, bh % p.heads);
  const int aligned = aligned_key(query, sequence_keys(p.mask, batch, p.seq_k));
  // The score the softmax takes for a visible key.
  const auto score = [&](float s_value, int key) {
    const float scaled = s_value * p.scale;
    return p.mods.changes_values ? modified_score(p.mods, mods, scaled, query, aligned, key) : scaled;
  };
  // A probability as P V takes it: after dropout (dropout.cuh), which the LSE and sum never see; or,
  // with dropout_signs, kept as it is or negated where dropout drops it (attention_probabilities).
  const auto dropped = [&](float prob, int key) {
    if (p.mods.dropout_threshold == 0) return prob;
    if (!p.dropout_signs) return dropout_apply(p.mods, mods.dropout_stream, query, key, prob);
    if (key < seen.begin || key >= seen.end) return 0.0f;  // the sign marks dropped weights of seen keys only
    return dropout_keep(p.mods.dropout_seed, p.mods.dropout_offset, p.mods.dropout_threshold, mods.dropout_stream,
                        query, key) ? prob : -prob;
  };

  const float* s = p.s + int64_t(blockIdx.y) * p.s_bh_stride + int64_t(row) * p.s_row_stride;
  P* out = static_cast<P*>(p.p) + int64_t(blockIdx.y) * p.p_bh_stride + int64_t(row) * p.p_row_stride;

  float row_max, row_sum;
  SoftmaxRowEnd end;
  if constexpr (Cached) {
    float x[SoftmaxTraits::kCachedPerThread];
    float thread_max = -INFINITY;
    for (int c = 0; c < SoftmaxTraits::kCachedPerThread; ++c) {
      const int key = member + c * Group;
      x[c] = key >= seen.begin && key < seen.end ? score(s[key], key) : -INFINITY;
      thread_max = fmaxf(thread_max, x[c]);
    }
    row_max = group_max<Group>(thread_max, partials);
    float thread_sum = 0;
    for (int c = 0; c < SoftmaxTraits::kCachedPerThread; ++c) {
      x[c] = exp_below(x[c], row_max);
      thread_sum += x[c];
    }
    row_sum = group_sum<Group>(thread_sum, partials);
    end = softmax_row_end</*Log2=*/false>(row_max, row_sum, mods.sink);
    for (int c = 0; c < SoftmaxTraits::kCachedPerThread; ++c) {
      const int key = member + c * Group;
      if (key < p.seq_k) out[key] = from_float<P>(dropped(x[c] * end.inverse, key));
    }
  } else {
    float thread_max = -INFINITY, thread_sum = 0;
    for (int key = seen.begin + member; key < seen.end; key += Group) {
      const float x = score(s[key], key);
      const float new_max = fmaxf(thread_max, x);
      thread_sum = thread_sum * exp_below(thread_max, new_max) + exp_below(x, new_max);
      thread_max = new_max;
    }
    row_max = group_max<Group>(thread_max, partials);
    row_sum = group_sum<Group>(thread_sum * exp_below(thread_max, row_max), partials);
    end = softmax_row_end</*Log2=*/false>(row_max, row_sum, mods.sink);
    for (int key = member; key < p.seq_k; key += Group)
      out[key] = from_float<P>(key >= seen.begin && key < seen.end
                                   ? dropped(exp_below(score(s[key], key), row_max) * end.inverse, key)
                                   : 0.0f);
  }

  if (p.lse && member == 0) p.lse[int64_t(bh) * p.lse_pair_stride + query] = end.lse;
}

SELFATTN_KERNELS_END
