#pragma once
// What the naive and cublas paths share: both materialise the scores S (and probabilities P) of a
// CHUNK of the problem in the context's workspace, and both run our softmax kernel between their
// two matrix products. A chunk is `pairs` consecutive (batch, head) pairs x `rows` consecutive
// query rows: the whole problem when it fits the workspace, else the largest that does (whole heads
// first, then row ranges of one head). Only a single row too long for the workspace limit is an
// error (WorkspaceTooSmall naming the limit). The chunks are planned before anything runs.
#include <cstddef>
#include <cstdint>
#include <functional>

#include "kernels/common/causal_mask.cuh"
#include "kernels/registry.h"
#include "forward/kernel_args.h"
#include "forward/paths.h"

namespace selfattn::detail {

struct Chunk {
  int pair_begin = 0, pairs = 0;  // flat (batch * heads + head) range
  int row_begin = 0, rows = 0;    // query-row range
};

// The padded calls of `call` (itself, or each sequence of a variable-length call that has queries,
// as a call of batch 1 on its rows), each with its layout (`layout_of`, then at least 16 bytes a
// row: a sequence without keys still takes one) and the largest chunk whose scores fit the budget:
// the workspace limit less `reserved_before` bytes the caller keeps in front of them. A varlen
// call's cu_seqlens are read back to the host (this synchronizes the stream) and all checked here.
// Throws InvalidArgument (cu_seqlens) or WorkspaceTooSmall (a row of some padded call exceeds the
// budget), each message starting with `function`.
ScorePlan plan_scores(ContextState& ctx, const AttentionCall& call, ScoreLayout (*layout_of)(const AttentionCall&),
                      size_t reserved_before, const char* function);

// Calls run_chunk for every chunk covering [0, batch*heads) x [0, seq_q) of the padded call.
void for_each_chunk(const ChunkedCall& chunked, const std::function<void(const Chunk&)>& run_chunk);

kernels::KeyMask key_mask(const AttentionCall& call);

// A view's data and its batch, head and row strides, as the naive kernels take q, k, v and out.
inline kernels::HeadsView heads_view(const TensorView& view) {
  return {view.data, view.strides[0], view.strides[1], view.strides[2]};
}
// Tiles of `tile` that cover `count`.
inline unsigned tile_count(int64_t count, int tile) { return unsigned((count + tile - 1) / tile); }

// S = A B^T for the chunk with the naive path's tiled kernel (qk_tiled): A = q or dO (query heads),
// B = k or v (kv heads), S fp32 at `out` with row stride `row_stride`, the chunk's pairs one after
// another. Used by the naive forward, its backward and attention_probabilities().
void launch_qk(ContextState& ctx, const kernels::TiledKernel& kernel, const AttentionCall& call, const Chunk& chunk,
               const TensorView& a, const TensorView& b, float* out, int64_t row_stride);

// The keys [begin, end) some row of `chunk` may see, known on the host: the union of its rows'
// visible ranges (both bounds are non-decreasing in the row, so its first and last rows give it).
// The cublas path's GEMMs run over these keys only, so a key row no row of the chunk sees - a
// sliding-window cache's dropped keys, NaN included - never enters a product (0 * NaN = NaN).
// With key lengths (device data), a none / bottom_right row's alignment depends on the length, so
// the span is then all seq_k keys, and the GEMMs' sums are bounded on the device
// (gemm_over_visible_keys).
kernels::KeyRange chunk_key_span(const AttentionCall& call, const Chunk& chunk);

// One cublas-path GEMM of a chunk of `batch` whose sum must run over the keys each query row sees,
// when those depend on the batch's key length (device data): `g` over all its k (cuBLAS takes k
// from the host, and reading the length back would synchronize the stream, which attention() with
// key_lengths must not), then gemm_key_repair_kernel recomputes, over the keys its row sees
// (visible_key_range: past the length, and before a window aligned at the last key), the elements
// that came out non-finite. C's column c is query row row_begin + c; op(A) holds the keys from
// key_offset on (V or K rows: outside what a row sees they may be NaN); op(B) must be 0 there (P
// and dS are), which makes this the bounded sum; beta must be 0. Without key lengths the host's
// span is exact and this is the GEMM alone.
void gemm_over_visible_keys(ContextState& ctx, const GemmBatch& g, const AttentionCall& call, int batch,
                            int row_begin, int key_offset);

// Zeros the chunk's rows of `view` ([batch, heads, seq, d]; pair = batch * heads + head): the
// result of a GEMM over no keys, for a chunk whose span is empty.
void zero_chunk_rows(Device& device, const TensorView& view, int heads, const Chunk& chunk);

// P = softmax(scale * S + mask) for one chunk: S fp32 with row stride s_row_stride, P (element
// p_elem, row stride p_row_stride) possibly over S; LSE when the call asks (see ChunkedCall).
// P's (batch, head) pairs follow each other p_pair_stride elements apart (-1: p_row_stride x the
// chunk's rows, packed like S). dropout_signs: attention_probabilities' form of dropout
// (SoftmaxParams::dropout_signs).
void launch_softmax(ContextState& ctx, const AttentionCall& call, const Chunk& chunk, const float* s,
                    int64_t s_row_stride, void* p, kernels::Element p_elem, int64_t p_row_stride, float scale,
                    int64_t lse_pair_stride, int64_t p_pair_stride = -1, bool dropout_signs = false);

}  // namespace selfattn::detail
