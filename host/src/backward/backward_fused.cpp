// Path 'fused' of attention_backward(): FlashAttention-2's backward on tensor cores.
//   default:        dQ accumulator zeroed -> flash_bwd_dkdv.cuh (dK, dV; dQ by fp32 atomics)
//                   -> store_gradient (dq = accumulator * scale)
//   deterministic:  flash_bwd_dkdv.cuh without its dQ part -> flash_bwd_dq.cuh (dQ per query tile)
// f16/bf16, head_dim 32, 64, 96, 128 and MLA's (192, 128), every row of q, k, v, dout and the
// gradients on 16 bytes.
#include <cstdint>
#include <string>

#include "kernels/registry.h"
#include "backward/backward_paths.h"
#include "forward/kernel_args.h"
#include "runtime/capability.h"
#include "selfattn/error.h"

namespace selfattn::detail {
namespace {

using kernels::Element;
using kernels::FlashBwdInstance;
using InstanceFn = FlashBwdInstance (*)();

// Its kernel list (kernels/backward/flash_bwd_kernels.inc): (dtype, head_dim_qk, head_dim_v) -> the
// two kernels, per backend (cuda: null in a build without nvcc).
struct BackwardEntry {
  DType dtype;
  int head_dim_qk, head_dim_v;
  KernelArch arch;
  InstanceFn sim_dkdv, sim_dq;
  InstanceFn cuda_dkdv, cuda_dq;
};

#define SELFATTN_FLASH_BWD(arch, E, DQK, DV)                                                                \
  BackwardEntry{DType::E,                                                                                   \
                DQK,                                                                                        \
                DV,                                                                                         \
                KernelArch::arch,                                                                           \
                &kernels::sim_target::flash_bwd_dkdv_instance<Element::E, DQK, DV>,                              \
                &kernels::sim_target::flash_bwd_dq_instance<Element::E, DQK, DV>,                                \
                SELFATTN_IF_BUILT_##arch(&kernels::cuda_target::flash_bwd_dkdv_instance<Element::E, DQK, DV>), \
                SELFATTN_IF_BUILT_##arch(&kernels::cuda_target::flash_bwd_dq_instance<Element::E, DQK, DV>)},
const BackwardEntry kInstances[] = {
#include "kernels/backward/flash_bwd_kernels.inc"
};
#undef SELFATTN_FLASH_BWD

constexpr int kMaxGridYZ = 65535;  // (kv) heads on grid.y, batch on grid.z

const BackwardEntry* entry_for(const ContextState& ctx, const AttentionCall& call) {
  for (const BackwardEntry& entry : kInstances)
    if (entry.dtype == call.dtype && entry.head_dim_qk == call.head_dim_qk && entry.head_dim_v == call.head_dim_v &&
        kernels_usable(ctx, entry.arch))
      return &entry;
  return nullptr;
}

struct Kernels {
  FlashBwdInstance dkdv, dq;
};
Kernels kernels_for(const ContextState& ctx, const AttentionCall& call) {
  const BackwardEntry* entry = entry_for(ctx, call);
  if (entry == nullptr) return {};
  if (ctx.device->backend() == Backend::sim) return {entry->sim_dkdv(), entry->sim_dq()};
  if (entry->cuda_dkdv == nullptr) return {};
  return {entry->cuda_dkdv(), entry->cuda_dq()};
}

kernels::FlashBwdParams make_params(const BackwardCall& call, const BackwardWorkspace& workspace, void* base) {
  const AttentionCall& f = call.forward;
  kernels::FlashBwdParams p{};
  p.fwd = flash_fwd_params_of(f);
  p.fwd.out = nullptr;
  p.fwd.lse = const_cast<float*>(call.lse);  // read only
  const bool varlen = f.varlen();  // varlen views are [1, heads, total, d]: no batch stride (flash_fwd_params.h)
  p.dout = call.dout.data;
  p.dout_stride_batch = varlen ? 0 : call.dout.strides[0];
  p.dout_stride_head = call.dout.strides[1];
  p.dout_stride_row = call.dout.strides[2];
  unsigned char* bytes = static_cast<unsigned char*>(base);
  p.d = reinterpret_cast<const float*>(bytes + workspace.d_offset);
  p.dq_accum = call.deterministic ? nullptr : reinterpret_cast<float*>(bytes + workspace.dq_accum_offset);
  p.dq = call.dq.data;
  p.dk = call.dk.data;
  p.dv = call.dv.data;
  p.dq_element = element_of(call.dq.dtype);
  p.dk_element = element_of(call.dk.dtype);
  p.dv_element = element_of(call.dv.dtype);
  p.dq_stride_batch = varlen ? 0 : call.dq.strides[0];
  p.dq_stride_head = call.dq.strides[1];
  p.dq_stride_row = call.dq.strides[2];
  p.dk_stride_batch = varlen ? 0 : call.dk.strides[0];
  p.dk_stride_head = call.dk.strides[1];
  p.dk_stride_row = call.dk.strides[2];
  p.dv_stride_batch = varlen ? 0 : call.dv.strides[0];
  p.dv_stride_head = call.dv.strides[1];
  p.dv_stride_row = call.dv.strides[2];
  return p;
}

unsigned tiles(int length, int tile) { return unsigned((length + tile - 1) / tile); }

}  // namespace

const char* fused_backward_unsupported(const ContextState& ctx, const BackwardCall& call) {
  const AttentionCall& f = call.forward;
  if (f.dtype == DType::f32)
    return "the fused backward runs on tensor cores (f16/bf16); fp32 needs the naive or cublas path";
  if (entry_for(ctx, f) == nullptr && !f.equal_head_dims())
    return "no fused backward kernel takes head_dim_v != head_dim_qk except MLA's (192, 128) (the naive and cublas "
           "paths take any pair)";
  if (entry_for(ctx, f) == nullptr)
    return "the fused backward has head_dim 32, 64, 96 and 128 (256 would hold 256 fp32 accumulators of dK and dV "
           "per thread: spills); others need the naive or cublas path";
  if (f.heads > kMaxGridYZ || f.batch > kMaxGridYZ) return "more than 65535 heads or sequences per call";
  for (const TensorView* view : {&f.q, &f.k, &f.v, &call.dout, &call.dq, &call.dk, &call.dv})
    if (!rows_16_byte_aligned(*view))
      return "the fused backward copies and stores 16-byte chunks of rows: every row of q, k, v, dout, dq, dk and "
             "dv must start on 16 bytes";
  if (!kernels_for(ctx, f).dkdv.kernel) return "this build has no fused backward kernel for the backend";
  if (f.varlen() && !ordered_offsets_available(ctx)) return "this build has no running_max_offsets kernel";
  return nullptr;
}

void plan_fused_backward(ContextState&, PlannedBackward& planned, const char*) {
  BackwardWorkspace& workspace = planned.workspace;
  workspace.offsets_offset = workspace.bytes;
  workspace.bytes += fused_workspace_bytes(planned.call.forward);
  // The dQ accumulator (backward.h): head_dim_qk floats per query row, in the LSE's row layout.
  if (planned.call.deterministic) return;
  workspace.dq_accum_offset = workspace.bytes;
  workspace.bytes += round_up_256(size_t(backward_query_rows(planned.call)) * planned.call.forward.head_dim_qk *
                                  sizeof(float));
}

void run_fused_backward(ContextState& ctx, const PlannedBackward& planned, void* workspace) {
  const BackwardCall& call = planned.call;  // varlen: cu_seqlens already ordered (attention_backward.cpp)
  const AttentionCall& f = call.forward;
  const Kernels kernels = kernels_for(ctx, f);
  const kernels::FlashBwdParams params = make_params(call, planned.workspace, workspace);
  if (!call.deterministic) {
    ctx.device->fill(params.dq_accum, 0, size_t(backward_query_rows(call)) * f.head_dim_qk * sizeof(float));
  }
  kernels::LaunchShape shape;
  shape.grid = dim3(tiles(f.seq_k, kernels.dkdv.block_tile), unsigned(f.kv_heads), unsigned(f.batch));
  shape.block = dim3(unsigned(kernels.dkdv.block_threads));
  shape.dynamic_smem_bytes = kernels.dkdv.smem_bytes;
  ctx.device->launch(kernels.dkdv.kernel, shape, &params);
  if (!call.deterministic) {
    launch_store_gradient(ctx, params.dq_accum, call.dq, f.scale);
    return;
  }
  shape.grid = dim3(tiles(f.seq_q, kernels.dq.block_tile), unsigned(f.heads), unsigned(f.batch));
  shape.block = dim3(unsigned(kernels.dq.block_threads));
  shape.dynamic_smem_bytes = kernels.dq.smem_bytes;
  ctx.device->launch(kernels.dq.kernel, shape, &params);
}

}  // namespace selfattn::detail
