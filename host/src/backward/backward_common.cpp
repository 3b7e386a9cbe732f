// What every backward path shares (backward_paths.h): the D preprocessing, the sinks' gradient and
// the store of an fp32 gradient accumulator into the caller's view.
#include <algorithm>

#include "runtime/backend_kernels.h"
#include "backward/backward_paths.h"
#include "forward/kernel_args.h"
#include "selfattn/error.h"

namespace selfattn::detail {
namespace {

// Blocks for `work` items of `per_block` each, capped: the kernels loop over the rest.
unsigned blocks_for(int64_t work, int64_t per_block, int64_t max_blocks) {
  return unsigned(std::clamp<int64_t>((work + per_block - 1) / per_block, 1, max_blocks));
}
constexpr int64_t kMaxBlocks = 65535 * 4;  // both kernels' traits allow this many and loop beyond

}  // namespace

void launch_backward_dot(ContextState& ctx, const BackwardCall& call, float* d) {
  const AttentionCall& f = call.forward;
  const kernels::BackwardKernel kernel = SELFATTN_KERNEL_FOR(ctx.device->backend(), backward_dot_instance(element_of(f.dtype)));
  if (!kernel.kernel) throw NotAvailable("attention_backward: no backward_dot kernel for this backend");
  kernels::BackwardDotParams p{};
  p.out = f.out.data;
  p.dout = call.dout.data;
  p.out_stride_batch = f.out.strides[0];
  p.out_stride_head = f.out.strides[1];
  p.out_stride_row = f.out.strides[2];
  p.dout_stride_batch = call.dout.strides[0];
  p.dout_stride_head = call.dout.strides[1];
  p.dout_stride_row = call.dout.strides[2];
  p.d = d;
  p.dlse = call.dlse;
  // The views' own extents: a varlen call's [1, heads, total_q] is the D layout as it stands.
  p.batch = int(f.q.batch());
  p.heads = int(f.q.heads());
  p.rows = int(f.q.seq());
  p.head_dim = f.head_dim_v;  // D = rowsum(dO * O) runs over out's columns
  const int64_t rows = int64_t(p.batch) * p.heads * p.rows;
  if (rows == 0) return;
  kernels::LaunchShape shape;
  shape.grid = dim3(blocks_for(rows, kernel.rows_per_block, kMaxBlocks));
  shape.block = dim3(unsigned(kernel.threads));
  ctx.device->launch(kernel.kernel, shape, &p);
}

void launch_sink_gradient(ContextState& ctx, const BackwardCall& call, const float* d) {
  const AttentionCall& f = call.forward;
  const kernels::BackwardKernel kernel = SELFATTN_KERNEL_FOR(ctx.device->backend(), sink_gradient_instance());
  if (!kernel.kernel) throw NotAvailable("attention_backward: no sink_gradient kernel for this backend");
  kernels::SinkGradientParams p{};
  p.lse = call.lse;
  p.d = d;
  p.sinks = f.sinks;
  p.dsinks = call.dsinks;
  // The rows of a varlen call's sequences end where its last one does; rows past it hold no query.
  p.rows_end = f.varlen() ? f.cu_seqlens_q + f.batch : nullptr;
  // The LSE layout as the views stand (varlen: batch 1, rows = total_q), as backward_dot's.
  p.batch = int(f.q.batch());
  p.heads = f.heads;
  p.rows = int(f.q.seq());
  kernels::LaunchShape shape;
  shape.grid = dim3(unsigned(f.heads));
  shape.block = dim3(unsigned(kernel.threads));
  shape.dynamic_smem_bytes = kernel.smem_bytes;
  ctx.device->launch(kernel.kernel, shape, &p);
}

void launch_store_gradient(ContextState& ctx, const float* accumulator, const TensorView& view, float multiplier) {
  const kernels::BackwardKernel kernel =
      SELFATTN_KERNEL_FOR(ctx.device->backend(), store_gradient_instance(element_of(view.dtype)));
  if (!kernel.kernel) throw NotAvailable("attention_backward: no store_gradient kernel for this backend");
  kernels::StoreGradientParams p{};
  p.accumulator = accumulator;
  p.out = view.data;
  p.out_stride_batch = view.strides[0];
  p.out_stride_head = view.strides[1];
  p.out_stride_row = view.strides[2];
  p.batch = int(view.batch());
  p.heads = int(view.heads());
  p.seq = int(view.seq());
  p.head_dim = int(view.head_dim());
  p.multiplier = multiplier;
  if (view.numel() == 0) return;
  kernels::LaunchShape shape;
  shape.grid = dim3(blocks_for(view.numel(), kernel.threads, kMaxBlocks));
  shape.block = dim3(unsigned(kernel.threads));
  ctx.device->launch(kernel.kernel, shape, &p);
}

}  // namespace selfattn::detail
