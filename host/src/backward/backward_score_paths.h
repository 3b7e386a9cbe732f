#pragma once
// What the naive and cublas backward paths share (backward_naive.cpp, backward_cublas.cpp): the
// workspace plan (D, then the fp32 dK/dV accumulators, then the chunk's score rows: score_chunks.h)
// and, per padded call of the plan, the backward's own views sliced to its rows.
#include <cstdint>

#include "backward/backward_paths.h"
#include "forward/score_chunks.h"

namespace selfattn::detail {

// Fills planned.scores and planned.workspace: dK then dV accumulators behind D (4 * head_dim_qk and
// 4 * head_dim_v bytes per key row of k, each 256-byte aligned), then the chunk's scores laid out by
// `layout_of`, with the limit less everything before them as their budget. The scores are the last
// part, so the total is their offset plus their bytes (no rounding after them).
void plan_score_backward(ContextState& ctx, PlannedBackward& planned, const char* function,
                         ScoreLayout (*layout_of)(const AttentionCall&));

// A padded call's part of one fp32 accumulator, [batch, kv_heads, k.seq(), row_length] contiguous
// (dk's or dv's shape).
struct KvAccumulator {
  float* first = nullptr;  // the call's first key row of kv pair 0
  int64_t kv_stride = 0;   // elements from one kv pair to the next: k.seq() * row_length
  int row_length = 0;      // head_dim_qk for dK, head_dim_v for dV
};

// One padded call's share of the backward's arguments and accumulators.
struct BackwardSlices {
  TensorView dout, dq;          // the padded call's rows (varlen: from its q_row_offset)
  const float* lse = nullptr;   // LSE and D of its rows: [pair * lse_pair_stride + row]
  const float* d = nullptr;
  KvAccumulator dk_accum, dv_accum;
};
BackwardSlices slices_of(const PlannedBackward& planned, const ChunkedCall& chunked, void* workspace);

// Zeroes both accumulators (before the first chunk), and stores them into dk and dv at the end.
void zero_kv_accumulators(ContextState& ctx, const PlannedBackward& planned, void* workspace);
void store_kv_gradients(ContextState& ctx, const PlannedBackward& planned, void* workspace);

}  // namespace selfattn::detail
