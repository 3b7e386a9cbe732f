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
// (deterministic).
#include <cmath>
#include <cstdint>

#include "../common/simt_tile.cuh"
#include "kv_cache_params.h"

SELFATTN_KERNELS_BEGIN

struct DecodeCombineTraits {
  static constexpr int kThreads = 128;
};

template <class T>
__global__ void __launch_bounds__(DecodeCombineTraits::kThreads) decode_combine_kernel(const DecodeCombineParams p) {
  // Grid-stride over rows: any number of rows with any grid.
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const int i = int(row % p.seq_q), head = int((row / p.seq_q) % p.heads);
    const int64_t b = row / p.seq_q / p.heads;
    const float sink = p.sinks != nullptr ? p.sinks[head] : -INFINITY;  // ScoreMods::sinks, as head_sink
    float max_lse = sink;
    for (int s = 0; s < p.num_splits; ++s) max_lse = fmaxf(max_lse, p.partial_lse[int64_t(s) * p.rows + row]);
    float sum = 0.0f, lse = -INFINITY;
    if (max_lse != -INFINITY) {
      sum = sink != -INFINITY ? expf(sink - max_lse) : 0.0f;
      for (int s = 0; s < p.num_splits; ++s) sum += expf(p.partial_lse[int64_t(s) * p.rows + row] - max_lse);
      lse = max_lse + logf(sum);
    }
    T* out = static_cast<T*>(p.out) + b * p.out_stride_batch + int64_t(head) * p.out_stride_head + int64_t(i) * p.out_stride_row;
    for (int e = threadIdx.x; e < p.head_dim; e += blockDim.x) {
      float value = 0.0f;
      for (int s = 0; s < p.num_splits; ++s) {
        const float split_lse = p.partial_lse[int64_t(s) * p.rows + row];
        if (split_lse == -INFINITY) continue;  // an empty split: its O is 0 and weighs nothing
        value = fmaf(expf(split_lse - max_lse), p.partial_out[(int64_t(s) * p.rows + row) * p.head_dim + e], value);
      }
      out[e] = from_float<T>(sum > 0.0f ? value / sum : 0.0f);  // a row with no key (nor sink): 0
    }
    if (threadIdx.x == 0 && p.lse != nullptr) p.lse[row] = lse;
  }
}

SELFATTN_KERNELS_END
