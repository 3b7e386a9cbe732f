// Path 'naive' of attention_backward(): per chunk of query rows (score_chunks.h), with S/P and
// dP/dS as two fp32 rows per query row in the workspace -
//   S  = Q K^T              qk_tiled         fp32, unscaled, over head_dim_qk
//   dP = dO V^T             qk_tiled         the same computation on dO and V, over head_dim_v
//   P, dS                   backward_scores  P over S, dS (scale and softcap factor folded in) over dP
//   dQ = dS K               pv_tiled         rows complete within a chunk: written to dq directly
//   dV += P^T dO, dK += dS^T Q   grad_kv_tiled   into fp32 accumulators in dv's and dk's shapes
// and at the end store_gradient for dk and dv. Every dtype and any head_dim_qk, head_dim_v >= 1
// (tensor cores where the dtype and the product's head dim allow, P/dS rounded to the dtype there);
// variable-length batches run sequence by sequence (the plan's padded calls). Also holds what the
// cublas backward shares with it (backward_score_paths.h).
#include <algorithm>
#include <string>

#include "kernels/backward/naive_backward_params.h"
#include "runtime/backend_kernels.h"
#include "backward/backward_paths.h"
#include "backward/backward_score_paths.h"
#include "forward/kernel_args.h"
#include "forward/score_chunks.h"
#include "selfattn/error.h"

namespace selfattn::detail {

// ---- shared with the cublas backward (backward_score_paths.h) ----

namespace {
// One fp32 accumulator in `gradient`'s (dk's or dv's) shape, 256-byte aligned.
size_t accumulator_bytes(const TensorView& gradient) { return round_up_256(size_t(gradient.numel()) * sizeof(float)); }
}  // namespace

void plan_score_backward(ContextState& ctx, PlannedBackward& planned, const char* function,
                         ScoreLayout (*layout_of)(const AttentionCall&)) {
  BackwardWorkspace& w = planned.workspace;  // D is already there, at 0
  w.dkv_accum_offset = w.bytes;
  w.scores_offset = w.dkv_accum_offset + accumulator_bytes(planned.call.dk) + accumulator_bytes(planned.call.dv);
  planned.scores = plan_scores(ctx, planned.call.forward, layout_of, w.scores_offset, function);
  w.bytes = w.scores_offset + planned.scores.workspace_bytes;
}

namespace {
TensorView rows_from(TensorView view, int64_t first, int64_t count) {
  view.data = static_cast<unsigned char*>(view.data) + first * view.strides[2] * int64_t(dtype_size(view.dtype));
  view.shape[2] = count;
  return view;
}
// dK's accumulator, then dV's, each in its gradient's shape.
enum class Gradient { dk, dv };
float* accumulator(const PlannedBackward& planned, void* workspace, Gradient which) {
  const size_t skip = which == Gradient::dv ? accumulator_bytes(planned.call.dk) : 0;
  return reinterpret_cast<float*>(static_cast<unsigned char*>(workspace) + planned.workspace.dkv_accum_offset + skip);
}
KvAccumulator accumulator_of(const PlannedBackward& planned, const ChunkedCall& chunked, void* workspace,
                             Gradient which) {
  const int row_length = which == Gradient::dk ? planned.call.forward.head_dim_qk : planned.call.forward.head_dim_v;
  return {accumulator(planned, workspace, which) + chunked.k_row_offset * row_length,
          planned.call.forward.k.seq() * row_length, row_length};
}
}  // namespace

BackwardSlices slices_of(const PlannedBackward& planned, const ChunkedCall& chunked, void* workspace) {
  const BackwardCall& call = planned.call;
  const int64_t q0 = chunked.q_row_offset;
  BackwardSlices s;
  s.dout = rows_from(call.dout, q0, chunked.call.seq_q);
  s.dq = rows_from(call.dq, q0, chunked.call.seq_q);
  s.lse = call.lse + q0;
  s.d = reinterpret_cast<const float*>(static_cast<unsigned char*>(workspace) + planned.workspace.d_offset) + q0;
  s.dk_accum = accumulator_of(planned, chunked, workspace, Gradient::dk);
  s.dv_accum = accumulator_of(planned, chunked, workspace, Gradient::dv);
  return s;
}

void zero_kv_accumulators(ContextState& ctx, const PlannedBackward& planned, void* workspace) {
  ctx.device->fill(accumulator(planned, workspace, Gradient::dk), 0, size_t(planned.call.dk.numel()) * sizeof(float));
  ctx.device->fill(accumulator(planned, workspace, Gradient::dv), 0, size_t(planned.call.dv.numel()) * sizeof(float));
}

void store_kv_gradients(ContextState& ctx, const PlannedBackward& planned, void* workspace) {
  // The accumulators are contiguous in dk's and dv's shapes.
  launch_store_gradient(ctx, accumulator(planned, workspace, Gradient::dk), planned.call.dk, 1.0f);
  launch_store_gradient(ctx, accumulator(planned, workspace, Gradient::dv), planned.call.dv, 1.0f);
}

// ---- the naive path ----

namespace {

// Each kernel is chosen by the head dim of the product it computes (tensor cores from 16 on).
struct NaiveBackwardKernels {
  kernels::TiledKernel s, dp;      // S = Q K^T over head_dim_qk, dP = dO V^T over head_dim_v
  kernels::TiledKernel dq;         // dQ = dS K, head_dim_qk columns
  kernels::TiledKernel dk, dv;     // dK += dS^T Q (head_dim_qk columns), dV += P^T dO (head_dim_v)
  kernels::BackwardKernel scores;
  bool complete() const { return s.kernel && dp.kernel && dq.kernel && dk.kernel && dv.kernel && scores.kernel; }
};

NaiveBackwardKernels lookup(const ContextState& ctx, const BackwardCall& call) {
  const Backend backend = ctx.device->backend();
  const kernels::Element elem = element_of(call.forward.dtype), dq_elem = element_of(call.dq.dtype);
  const int d_qk = call.forward.head_dim_qk, d_v = call.forward.head_dim_v;
  return {SELFATTN_KERNEL_FOR(backend, qk_tiled_instance(elem, d_qk)),
          SELFATTN_KERNEL_FOR(backend, qk_tiled_instance(elem, d_v)),
          SELFATTN_KERNEL_FOR(backend, dq_tiled_instance(elem, dq_elem, d_qk)),
          SELFATTN_KERNEL_FOR(backend, grad_kv_tiled_instance(elem, d_qk)),
          SELFATTN_KERNEL_FOR(backend, grad_kv_tiled_instance(elem, d_v)),
          SELFATTN_KERNEL_FOR(backend, backward_scores_instance(kernels::Element::f32))};
}


ScoreLayout naive_backward_layout(const AttentionCall& padded) {
  // Two fp32 rows per query row: S (P written over it) and dP (dS written over it), 16-byte aligned.
  ScoreLayout layout;
  layout.s_row_stride = layout.p_row_stride = (int64_t(padded.seq_k) + 3) / 4 * 4;
  layout.row_bytes = 2 * size_t(layout.s_row_stride) * sizeof(float);
  return layout;
}

// accumulator += scores^T rows_of over the chunk's rows and the GQA group's heads (grad_kv_tiled).
void launch_grad_kv(ContextState& ctx, const kernels::TiledKernel& kernel, const AttentionCall& call,
                    const Chunk& chunk, const float* scores, int64_t row_stride, const TensorView& rows_of,
                    const KvAccumulator& accum) {
  kernels::GradKvParams g{};
  g.scores = scores;
  g.scores_bh_stride = row_stride * chunk.rows;
  g.scores_row_stride = row_stride;
  g.rows_of = heads_view(rows_of);
  g.accumulator = accum.first;
  g.acc_kv_stride = accum.kv_stride;
  g.heads = call.heads;
  g.heads_per_kv = call.heads / call.kv_heads;
  g.bh_begin = chunk.pair_begin;
  g.bh_count = chunk.pairs;
  g.row_begin = chunk.row_begin;
  g.rows = chunk.rows;
  g.seq_k = call.seq_k;
  g.head_dim = accum.row_length;  // = rows_of's head dim: dO's for dV, Q's for dK
  g.mask = key_mask(call);
  const int kv_first = chunk.pair_begin / g.heads_per_kv;
  const int kv_last = (chunk.pair_begin + chunk.pairs - 1) / g.heads_per_kv;
  kernels::LaunchShape shape;
  shape.grid = dim3(tile_count(g.head_dim, kernel.tile_cols), tile_count(call.seq_k, kernel.tile_rows),
                    unsigned(kv_last - kv_first + 1));
  shape.block = dim3(unsigned(kernel.threads));
  shape.dynamic_smem_bytes = kernel.smem_bytes;
  ctx.device->launch(kernel.kernel, shape, &g);
}

void run_padded(ContextState& ctx, const NaiveBackwardKernels& kernels, const PlannedBackward& planned,
                const ChunkedCall& chunked, void* workspace) {
  const AttentionCall& call = chunked.call;
  const BackwardSlices slices = slices_of(planned, chunked, workspace);
  const int64_t ld = chunked.layout.s_row_stride;
  float* s = reinterpret_cast<float*>(static_cast<unsigned char*>(workspace) + planned.workspace.scores_offset);

  for_each_chunk(chunked, [&](const Chunk& chunk) {
    float* dp = s + ld * chunk.rows * chunk.pairs;  // the chunk's dP rows follow its S rows
    launch_qk(ctx, kernels.s, call, chunk, call.q, call.k, s, ld);
    launch_qk(ctx, kernels.dp, call, chunk, slices.dout, call.v, dp, ld);

    kernels::BackwardScoresParams sp{};
    sp.s = s;
    sp.dp = dp;
    sp.p = s;    // P over S
    sp.ds = dp;  // dS over dP
    sp.s_bh_stride = sp.p_bh_stride = ld * chunk.rows;
    sp.s_row_stride = sp.p_row_stride = ld;
    sp.lse = slices.lse;
    sp.d = slices.d;
    sp.lse_pair_stride = chunked.lse_pair_stride;
    sp.mask = key_mask(call);
    sp.mods = score_mods_of(call);
    sp.scale = call.scale;
    sp.heads = call.heads;
    sp.bh_begin = chunk.pair_begin;
    sp.row_begin = chunk.row_begin;
    sp.rows = chunk.rows;
    sp.seq_k = call.seq_k;
    kernels::LaunchShape sp_shape;
    sp_shape.grid = dim3(tile_count(chunk.rows, kernels.scores.rows_per_block), unsigned(chunk.pairs));
    sp_shape.block = dim3(unsigned(kernels.scores.threads));
    ctx.device->launch(kernels.scores.kernel, sp_shape, &sp);

    // dQ = dS K: pv_tiled with P := dS, V := K; the scale is in dS already.
    kernels::PvParams pv{};
    pv.p = dp;
    pv.p_bh_stride = ld * chunk.rows;
    pv.p_row_stride = ld;
    pv.v = heads_view(call.k);
    pv.out = slices.dq.data;
    pv.out_stride_batch = slices.dq.strides[0];
    pv.out_stride_head = slices.dq.strides[1];
    pv.out_stride_seq = slices.dq.strides[2];
    pv.heads = call.heads;
    pv.heads_per_kv = call.heads / call.kv_heads;
    pv.bh_begin = chunk.pair_begin;
    pv.row_begin = chunk.row_begin;
    pv.rows = chunk.rows;
    pv.seq_k = call.seq_k;
    pv.head_dim = call.head_dim_qk;
    pv.mask = key_mask(call);
    kernels::LaunchShape pv_shape;
    pv_shape.grid = dim3(tile_count(call.head_dim_qk, kernels.dq.tile_cols), tile_count(chunk.rows, kernels.dq.tile_rows),
                         unsigned(chunk.pairs));
    pv_shape.block = dim3(unsigned(kernels.dq.threads));
    pv_shape.dynamic_smem_bytes = kernels.dq.smem_bytes;
    ctx.device->launch(kernels.dq.kernel, pv_shape, &pv);

    launch_grad_kv(ctx, kernels.dv, call, chunk, s, ld, slices.dout, slices.dv_accum);
    launch_grad_kv(ctx, kernels.dk, call, chunk, dp, ld, call.q, slices.dk_accum);
  });
}

}  // namespace

const char* naive_backward_unsupported(const ContextState& ctx, const BackwardCall& call) {
  if (!lookup(ctx, call).complete()) return "the naive backward kernels are not built for this backend";
  return nullptr;
}

void plan_naive_backward(ContextState& ctx, PlannedBackward& planned, const char* function) {
  plan_score_backward(ctx, planned, function, naive_backward_layout);
}

void run_naive_backward(ContextState& ctx, const PlannedBackward& planned, void* workspace) {
  const NaiveBackwardKernels kernels = lookup(ctx, planned.call);
  if (!kernels.complete()) throw NotAvailable("attention_backward: naive backward kernels not built for this backend");
  zero_kv_accumulators(ctx, planned, workspace);
  for (const ChunkedCall& chunked : planned.scores.calls) {
    // A varlen sequence without keys: its dq rows are already 0 (the caller zero-fills varlen
    // gradients) and it has no key rows.
    if (chunked.call.seq_k == 0) continue;
    run_padded(ctx, kernels, planned, chunked, workspace);
  }
  store_kv_gradients(ctx, planned, workspace);
}

}  // namespace selfattn::detail
