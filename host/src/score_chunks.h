#pragma once
// What the naive and cublas paths share: both materialise the scores S (and probabilities P) of a
// CHUNK of the problem in the context's workspace, and both run our softmax kernel between their
// two matrix products. A chunk is `pairs` consecutive (batch, head) pairs x `rows` consecutive
// query rows; the whole problem when it fits the workspace limit, else the largest that does
// (whole heads first, then row ranges of one head). Only a single row too long for the limit is an
// error (WorkspaceTooSmall naming the limit).
#include <cstddef>
#include <cstdint>
#include <functional>

#include "../../kernels/registry.h"
#include "kernel_args.h"
#include "paths.h"

namespace selfattn::detail {

struct ScoreLayout {
  size_t row_bytes = 0;     // workspace bytes one query row needs (S, plus P when separate)
  int64_t s_row_stride = 0; // fp32 elements between rows of S
};

struct Chunk {
  int pair_begin = 0, pairs = 0;  // flat (batch * heads + head) range
  int row_begin = 0, rows = 0;    // query-row range
};

// Calls run_chunk(chunk, workspace) for every chunk covering [0, batch*heads) x [0, seq_q), each
// with at least rows * pairs * row_bytes bytes of workspace. The chunk size is the largest the
// workspace limit allows (retrying smaller when other workspace slots hold part of the limit).
void for_each_chunk(ContextState& ctx, const AttentionCall& call, const ScoreLayout& layout,
                    const std::function<void(const Chunk&, void* workspace)>& run_chunk);

kernels::KeyMask key_mask(const AttentionCall& call);

// A padded call as it is, or each sequence of a variable-length call as a padded call of batch 1
// on its rows (cu_seqlens are read back to the host: this synchronizes the stream). LSE row `query`
// of pair `bh` of the call handed over is at call.lse[bh * lse_pair_stride + query]. Sequences
// without queries are skipped; a sequence without keys is handed over with seq_k 0 (its rows must
// become 0 and its LSE -inf).
void for_each_sequence(ContextState& ctx, const AttentionCall& call,
                       const std::function<void(const AttentionCall& padded, int64_t lse_pair_stride)>& run_padded);

// P = softmax(scale * S + mask) for one chunk: S fp32 with row stride s_row_stride, P (element
// p_elem, row stride p_row_stride) possibly over S; LSE when the call asks (see for_each_sequence).
void launch_softmax(ContextState& ctx, const AttentionCall& call, const Chunk& chunk, const float* s,
                    int64_t s_row_stride, void* p, kernels::Element p_elem, int64_t p_row_stride, float scale,
                    int64_t lse_pair_stride);

}  // namespace selfattn::detail
