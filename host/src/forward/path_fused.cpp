// Path 'fused': one flash-style kernel per call; S and P never reach memory. The kernel families
// (fused_families.h), tried in this order, the first that takes the call running it:
//   hopper_fp8  compute capability 9.0 (and the sim), e4m3 q/k/v, a head dim of its list, f16/bf16
//               out, not varlen, no key_start, no dropout, 16-byte aligned rows
//               -> hopper/transpose_v_fp8.cuh, then hopper/flash_fwd_hopper_fp8.cuh
//               (every other FP8 call is dequantized by fp8_inputs.cpp and never reaches a path)
//   hopper      compute capability 9.0 (and the sim), f16/bf16, a head dim of its list, 16-byte
//               aligned rows whose strides a TMA map takes  -> hopper/flash_fwd_hopper.cuh
//   mma.sync    f16/bf16 with a head dim of its list and 16-byte aligned rows -> flash_fwd.cuh
//   simt        everything else up to head_dim 256 (fp32, other head dims, unaligned views)
//               -> flash_fwd_simt.cuh (exact fp32)
// Each family's kernels are those of its list (kernels/forward/flash_fwd_kernels.inc,
// kernels/hopper/flash_fwd_hopper_kernels.inc), on the architectures runtime/capability.h allows.
#include <cstdint>
#include <string>

#include "forward/fused_families.h"
#include "forward/kernel_args.h"
#include "forward/paths.h"
#include "runtime/backend_kernels.h"
#include "selfattn/error.h"

namespace selfattn::detail {

bool rows_16_byte_aligned(const TensorView& view) {
  const size_t element = dtype_size(view.dtype);
  if (reinterpret_cast<uintptr_t>(view.data) % 16 != 0) return false;
  for (int i = 0; i < 3; ++i)
    if ((view.strides[i] * int64_t(element)) % 16 != 0) return false;
  return true;
}

namespace {

// The families in the order they are tried.
const FusedFamily* const kFamilies[] = {&kFusedHopperFp8, &kFusedHopper, &kFusedMma, &kFusedSimt};

constexpr int kMaxHeadDim = 256;   // every family keeps a row's O slice in registers
constexpr int kMaxGridYZ = 65535;  // heads on grid.y, batch on grid.z

bool some_family_takes(const ContextState& ctx, const AttentionCall& call) {
  for (const FusedFamily* family : kFamilies)
    if (family->takes(ctx, call)) return true;
  return false;
}

}  // namespace

// Declared in kernel_args.h: the fused backward describes the forward call it differentiates with it.
kernels::FlashFwdParams flash_fwd_params_of(const AttentionCall& call) {
  kernels::FlashFwdParams p{};
  p.q = call.q.data;
  p.k = call.k.data;
  p.v = call.v.data;
  p.out = call.out.data;
  p.lse = call.lse;
  // Varlen views are [1, heads, total, d]: the batch index selects a sequence through cu_seqlens,
  // never a batch stride.
  const bool varlen = call.varlen();
  p.q_stride_batch = varlen ? 0 : call.q.strides[0];
  p.k_stride_batch = varlen ? 0 : call.k.strides[0];
  p.v_stride_batch = varlen ? 0 : call.v.strides[0];
  p.out_stride_batch = varlen ? 0 : call.out.strides[0];
  p.q_stride_head = call.q.strides[1];
  p.k_stride_head = call.k.strides[1];
  p.v_stride_head = call.v.strides[1];
  p.out_stride_head = call.out.strides[1];
  p.q_stride_row = call.q.strides[2];
  p.k_stride_row = call.k.strides[2];
  p.v_stride_row = call.v.strides[2];
  p.out_stride_row = call.out.strides[2];
  // lse: [batch, heads, seq_q], or [heads, total_q] for varlen.
  p.lse_stride_batch = varlen ? 0 : int64_t(call.heads) * call.seq_q;
  p.lse_stride_head = varlen ? call.q.seq() : call.seq_q;
  p.key_lengths = call.key_lengths;
  p.key_start = call.key_start;
  p.q_offset = call.q_offset;
  p.cu_seqlens_q = call.cu_seqlens_q;
  p.cu_seqlens_k = call.cu_seqlens_k;
  p.seq_q = call.seq_q;
  p.seq_k = call.seq_k;
  p.total_q = int(call.q.seq());
  p.total_k = int(call.k.seq());
  p.head_dim = call.head_dim_qk;  // read by the SIMT kernel, which takes equal head dims only (fused_mma.cpp)
  p.heads_per_kv_head = call.heads / call.kv_heads;
  p.scale_log2 = float(double(call.scale) * 1.4426950408889634);
  p.scale = call.scale;
  p.causal = causal_mask_of(call.causal);
  p.mods = score_mods_of(call);
  return p;
}

const char* fused_unsupported(const ContextState& ctx, const AttentionCall& call) {
  // FP8 calls reach a path only when the fused path takes them natively (fp8_inputs.cpp
  // dequantizes the others); no other fused kernel reads FP8.
  if (call.fp8()) return fused_takes_fp8(ctx, call) ? nullptr : "FP8 inputs run natively only on the Hopper FP8 kernel";
  if (call.head_dim_qk > kMaxHeadDim) return "head_dim above 256 needs the naive or cublas path";
  // Two head dims: only the tensor-core kernel list's pairs (kernels/forward/flash_fwd_kernels.inc).
  if (!call.equal_head_dims() && !some_family_takes(ctx, call))
    return "no fused kernel takes head_dim_v != head_dim_qk here: the mma.sync kernel takes (192, 128) in f16/bf16 "
           "with every row on 16 bytes (the naive and cublas paths take any pair)";
  if (call.heads > kMaxGridYZ || call.batch > kMaxGridYZ) return "more than 65535 heads or sequences per call";
  if (!some_family_takes(ctx, call)) return "this build has no fused kernel for the backend";
  if (call.varlen() && !ordered_offsets_available(ctx)) return "this build has no running_max_offsets kernel";
  return nullptr;
}

bool ordered_offsets_available(const ContextState& ctx) {
  return bool(SELFATTN_KERNEL_FOR(ctx.device->backend(), running_max_offsets_kernel_ref()));
}

size_t fused_workspace_bytes(const AttentionCall& call) {
  // FP8 calls (never varlen: fused_takes_fp8) take the V^T buffer of the pre-pass.
  if (call.fp8()) return hopper_fp8_workspace_bytes(call);
  return call.varlen() ? 2 * round_up_256(size_t(call.batch + 1) * sizeof(int32_t)) : 0;
}

void order_offsets(ContextState& ctx, const int32_t* in_0, int32_t* out_0, const int32_t* in_1, int32_t* out_1,
                   int count, const char* function) {
  const kernels::KernelRef kernel = SELFATTN_KERNEL_FOR(ctx.device->backend(), running_max_offsets_kernel_ref());
  if (!kernel)
    throw NotAvailable(std::string(function) + ": this build has no running_max_offsets kernel for the backend");
  kernels::RunningMaxOffsetsParams params{};
  params.in[0] = in_0;
  params.in[1] = in_1;
  params.out[0] = out_0;
  params.out[1] = out_1;
  params.count = count;
  constexpr int kThreads = 256;  // count <= 65536 entries (at most 65535 sequences): at most 256 per thread
  kernels::LaunchShape shape;
  shape.grid = dim3(in_1 != nullptr ? 2 : 1);  // block i orders array i
  shape.block = dim3(kThreads);
  shape.dynamic_smem_bytes = kThreads * sizeof(int32_t);
  ctx.device->launch(kernel, shape, &params);
}

AttentionCall with_ordered_offsets(ContextState& ctx, const AttentionCall& call, void* workspace) {
  if (!call.varlen()) return call;
  auto* ordered_q = static_cast<int32_t*>(workspace);
  auto* ordered_k =
      reinterpret_cast<int32_t*>(static_cast<unsigned char*>(workspace) + fused_workspace_bytes(call) / 2);
  order_offsets(ctx, call.cu_seqlens_q, ordered_q, call.cu_seqlens_k, ordered_k, call.batch + 1, "path fused");
  AttentionCall ordered = call;
  ordered.cu_seqlens_q = ordered_q;
  ordered.cu_seqlens_k = ordered_k;
  return ordered;
}

void run_fused(ContextState& ctx, const AttentionCall& given, void* workspace) {
  if (const char* reason = fused_unsupported(ctx, given)) throw NotAvailable(std::string("path fused: ") + reason);
  const AttentionCall call = with_ordered_offsets(ctx, given, workspace);
  for (const FusedFamily* family : kFamilies)
    if (family->takes(ctx, call) && family->run(ctx, call, workspace)) return;
  throw BackendError("path fused: each kernel that takes the call declined to launch it");
}

}  // namespace selfattn::detail
