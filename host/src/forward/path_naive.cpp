// Path 'naive': three kernels per chunk (score_chunks.h) -
//   S = Q K^T       qk_tiled     fp32 scores into the workspace
//   P = softmax(S)  softmax_rows scale + causal/key-length mask, P written over S, LSE
//   O = P V         pv_tiled     O in the call's dtype and strides
// Every dtype and head dims >= 1, v's apart from q's and k's (d_v != d_qk); the kernels pick
// tensor cores where dtype and head dim allow.
// Variable-length batches run sequence by sequence (the plan's padded calls, score_chunks.h).
#include <string>

#include "runtime/backend_kernels.h"
#include "forward/paths.h"
#include "forward/score_chunks.h"
#include "selfattn/error.h"

namespace selfattn::detail {
namespace {

struct NaiveKernels {
  kernels::TiledKernel qk, pv;
};

// S = Q K^T runs over the q·k head dim, O = P V over v's: each kernel is looked up for its own.
NaiveKernels lookup(Backend backend, const AttentionCall& call) {
  const kernels::Element elem = element_of(call.dtype);
  return {SELFATTN_KERNEL_FOR(backend, qk_tiled_instance(elem, call.head_dim_qk)),
          SELFATTN_KERNEL_FOR(backend, pv_tiled_instance(elem, call.head_dim_v))};
}

}  // namespace

const char* naive_unsupported(const ContextState& ctx, const AttentionCall& call) {
  const NaiveKernels naive = lookup(ctx.device->backend(), call);
  if (!naive.qk.kernel || !naive.pv.kernel) return "the naive kernels are not built for this backend";
  return nullptr;
}

ScoreLayout naive_score_layout(const AttentionCall& padded) {
  // P is written over S (fp32 both): one fp32 row of seq_k per query row, padded to 16 bytes.
  ScoreLayout layout;
  layout.s_row_stride = layout.p_row_stride = (int64_t(padded.seq_k) + 3) / 4 * 4;
  layout.row_bytes = size_t(layout.s_row_stride) * sizeof(float);
  return layout;
}

namespace {

void run_padded(ContextState& ctx, const NaiveKernels& naive, const ChunkedCall& chunked, void* workspace) {
  const AttentionCall& call = chunked.call;
  const ScoreLayout& layout = chunked.layout;
  for_each_chunk(chunked, [&](const Chunk& chunk) {
    float* scores = static_cast<float*>(workspace);
    const int64_t pair_stride = layout.s_row_stride * chunk.rows;
    launch_qk(ctx, naive.qk, call, chunk, call.q, call.k, scores, layout.s_row_stride);

    launch_softmax(ctx, call, chunk, scores, layout.s_row_stride, scores, kernels::Element::f32, layout.s_row_stride,
                   call.scale, chunked.lse_pair_stride);

    kernels::PvParams pv{};
    pv.p = scores;
    pv.p_bh_stride = pair_stride;
    pv.p_row_stride = layout.s_row_stride;
    pv.v = heads_view(call.v);
    pv.out = call.out.data;
    pv.out_stride_batch = call.out.strides[0];
    pv.out_stride_head = call.out.strides[1];
    pv.out_stride_seq = call.out.strides[2];
    pv.heads = call.heads;
    pv.heads_per_kv = call.heads / call.kv_heads;
    pv.bh_begin = chunk.pair_begin;
    pv.row_begin = chunk.row_begin;
    pv.rows = chunk.rows;
    pv.seq_k = call.seq_k;
    pv.head_dim = call.head_dim_v;
    pv.mask = key_mask(call);
    kernels::LaunchShape pv_shape;
    pv_shape.grid = dim3(tile_count(call.head_dim_v, naive.pv.tile_cols), tile_count(chunk.rows, naive.pv.tile_rows), unsigned(chunk.pairs));
    pv_shape.block = dim3(unsigned(naive.pv.threads));
    pv_shape.dynamic_smem_bytes = naive.pv.smem_bytes;
    ctx.device->launch(naive.pv.kernel, pv_shape, &pv);
  });
}
}  // namespace

namespace {
// Every padded call of a plan has the call's dtype and head dims: one lookup serves them all.
NaiveKernels plan_kernels(ContextState& ctx, const ScorePlan& plan) {
  const AttentionCall& first = plan.calls.front().call;
  const NaiveKernels naive = lookup(ctx.device->backend(), first);
  if (!naive.qk.kernel || !naive.pv.kernel) throw NotAvailable("path naive: kernels not built for this backend");
  return naive;
}
}  // namespace

void run_naive(ContextState& ctx, const ScorePlan& plan, void* workspace) {
  if (plan.calls.empty()) return;
  const NaiveKernels naive = plan_kernels(ctx, plan);
  for (const ChunkedCall& chunked : plan.calls) run_padded(ctx, naive, chunked, workspace);
}

void run_naive_probabilities(ContextState& ctx, const ScorePlan& plan, const TensorView& probs, void* workspace) {
  if (plan.calls.empty()) return;
  const NaiveKernels naive = plan_kernels(ctx, plan);
  for (const ChunkedCall& chunked : plan.calls) {
    // The softmax writes P straight into probs: the padded call's (batch, head) pairs and rows
    // there, from its sequence's slice (varlen) or batch 0.
    float* base = static_cast<float*>(probs.data) + chunked.sequence * probs.strides[0];
    for_each_chunk(chunked, [&](const Chunk& chunk) {
      float* scores = static_cast<float*>(workspace);
      launch_qk(ctx, naive.qk, chunked.call, chunk, chunked.call.q, chunked.call.k, scores,
                chunked.layout.s_row_stride);
      float* p = base + chunk.pair_begin * probs.strides[1] + chunk.row_begin * probs.strides[2];
      launch_softmax(ctx, chunked.call, chunk, scores, chunked.layout.s_row_stride, p, kernels::Element::f32,
                     probs.strides[2], chunked.call.scale, chunked.lse_pair_stride, probs.strides[1],
                     /*dropout_signs=*/true);
    });
  }
}

}  // namespace selfattn::detail
