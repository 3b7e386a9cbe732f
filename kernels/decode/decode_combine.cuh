#pragma once
// Combines the num_splits partial results of decode_split_kv into out and lse: with
// M = max_s lse_s, w_s = exp(lse_s - M) and W = sum_s w_s, lse = M + log(W) and
// out = sum_s w_s O_s / W. (Not sum_s exp(lse_s - lse) O_s: that weight carries the log's error and
// lse's rounding, the same for a whole row; with the 1-ulp logf and 2-ulp expf CUDA documents, f32
// rows came out up to 1.2x over the error the tests allow.)
// Empty splits (LSE -inf) weigh nothing; a row with no key anywhere gets 0 and -inf. The head's
// sink, which no split took, enters here once: as one more split with LSE = its logit and O = 0
// (so a row with no key gets 0 and the sink's logit). One block
// per row (striding over the rows when there are more than blocks), the splits summed in order
// (deterministic). A packed call's rows that no sequence owns are skipped.
//
// Each w_s is computed once per row, by one thread, into shared memory (kThreads splits at a
// time), and every thread sums W and its columns' values from there: the same products, summed in
// the same order, as computing w_s in every thread, without the 2 x kThreads exps per split and
// row (the profiler's MUFU count made the launch MUFU-bound, above its own DRAM time, at 33 splits).
#include <cmath>
#include <cstdint>

#include "../common/primitives.cuh"
#include "../common/simt_tile.cuh"
#include "kv_cache_params.h"
#include "new_rows.cuh"

SELFATTN_KERNELS_BEGIN

struct DecodeCombineTraits {
  static constexpr int kThreads = 128;
  static constexpr int kMaxColumnsPerThread = 4;  // head_dim up to 512, the latent kernel's V (decode_latent_mma.cuh)
  static constexpr size_t kSmemBytes = kThreads * sizeof(float);  // one chunk of w_s
};

template <class T>
__global__ void __launch_bounds__(DecodeCombineTraits::kThreads) decode_combine_kernel(const DecodeCombineParams p) {
  constexpr int kThreads = DecodeCombineTraits::kThreads, kColumns = DecodeCombineTraits::kMaxColumnsPerThread;
  float* weights = dynamic_smem<float>();
  // Grid-stride over rows: any number of rows with any grid.
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    // The flat index (new_rows.cuh): row i of the views' entry b, head `head`.
    const int i = int(row % p.q_rows.total), head = int((row / p.q_rows.total) % p.heads);
    const int64_t b = row / p.q_rows.total / p.heads;
    // A packed call's rows that no sequence owns got no partials and are not written (the whole
    // block skips the row, so the barriers below stay uniform).
    if (!packed_row_owned(p.q_rows, p.batch, i)) continue;
    const float sink = p.sinks != nullptr ? p.sinks[head] : -INFINITY;  // ScoreMods::sinks, as head_sink
    float max_lse = sink;
    for (int s = 0; s < p.num_splits; ++s) max_lse = fmaxf(max_lse, p.partial_lse[int64_t(s) * p.rows + row]);
    // No split and no sink with a key: every weight 0, out 0, lse -inf.
    const bool any = max_lse != -INFINITY;
    float sum = any && sink != -INFINITY ? expf(sink - max_lse) : 0.0f;
    float value[kColumns] = {};
    for (int chunk = 0; chunk < p.num_splits; chunk += kThreads) {
      __syncthreads();  // the previous chunk's (or row's) weights are read
      const int s = chunk + int(threadIdx.x);
      if (s < p.num_splits) {
        const float split_lse = p.partial_lse[int64_t(s) * p.rows + row];
        // An empty split weighs 0 (its O is 0; exp(-inf - max) is 0 too, and NaN with max -inf).
        weights[threadIdx.x] = any && split_lse != -INFINITY ? expf(split_lse - max_lse) : 0.0f;
      }
      __syncthreads();
      const int count = p.num_splits - chunk < kThreads ? p.num_splits - chunk : kThreads;
      for (int j = 0; j < count; ++j) {
        const float w = weights[j];
        sum += w;
        if (w == 0.0f) continue;  // empty, or too far below the max to count: fmaf(0, O, v) == v
        const float* o = p.partial_out + (int64_t(chunk + j) * p.rows + row) * p.head_dim;
        for (int c = 0; c < kColumns; ++c) {
          const int e = int(threadIdx.x) + c * kThreads;
          if (e < p.head_dim) value[c] = fmaf(w, o[e], value[c]);
        }
      }
    }
    T* out = static_cast<T*>(p.out) + b * p.out_stride_batch + int64_t(head) * p.out_stride_head + int64_t(i) * p.out_stride_row;
    for (int c = 0; c < kColumns; ++c) {
      const int e = int(threadIdx.x) + c * kThreads;
      if (e < p.head_dim) out[e] = from_float<T>(sum > 0.0f ? value[c] / sum : 0.0f);  // a row with no key (nor sink): 0
    }
    if (threadIdx.x == 0 && p.lse != nullptr) p.lse[row] = any ? max_lse + logf(sum) : -INFINITY;
  }
}

SELFATTN_KERNELS_END
