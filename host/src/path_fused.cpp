// Path 'fused': one flash-style kernel per call; S and P never reach memory.
//   f16/bf16 with a shipped head dim and 16-byte aligned rows -> flash_fwd.cuh (tensor cores)
//   everything else up to head_dim 256 (fp32, other head dims, unaligned views)
//                                                               -> flash_fwd_simt.cuh (exact fp32)
#include <cmath>
#include <cstdint>
#include <string>

#include "kernel_args.h"
#include "kernels/registry.h"
#include "paths.h"
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

using kernels::Element;
using kernels::FlashFwdInstance;
using InstanceFn = FlashFwdInstance (*)();

// The tensor-core instances this build ships: (dtype, head_dim) -> kernel, per backend.
struct TensorCoreEntry {
  DType dtype;
  int head_dim;
  InstanceFn sim;
  InstanceFn cuda;  // null in a build without nvcc
};

#if SELFATTN_HAVE_CUDA
#define SELFATTN_FLASH_CUDA(E, D) &kernels::cuda_target::flash_fwd_instance<Element::E, D>
#else
#define SELFATTN_FLASH_CUDA(E, D) nullptr
#endif
#define SELFATTN_FLASH_ENTRY(E, D) \
  TensorCoreEntry { DType::E, D, &kernels::sim_target::flash_fwd_instance<Element::E, D>, SELFATTN_FLASH_CUDA(E, D) }

const TensorCoreEntry kTensorCoreInstances[] = {
    SELFATTN_FLASH_ENTRY(f16, 32),  SELFATTN_FLASH_ENTRY(f16, 64),   SELFATTN_FLASH_ENTRY(f16, 96),
    SELFATTN_FLASH_ENTRY(f16, 128), SELFATTN_FLASH_ENTRY(f16, 256),  SELFATTN_FLASH_ENTRY(bf16, 32),
    SELFATTN_FLASH_ENTRY(bf16, 64), SELFATTN_FLASH_ENTRY(bf16, 96),  SELFATTN_FLASH_ENTRY(bf16, 128),
    SELFATTN_FLASH_ENTRY(bf16, 256),
};
#undef SELFATTN_FLASH_ENTRY
#undef SELFATTN_FLASH_CUDA

constexpr int kMaxHeadDim = 256;   // both kernels keep a row's O slice in registers
constexpr int kMaxGridYZ = 65535;  // heads on grid.y, batch on grid.z

const TensorCoreEntry* tensor_core_entry(const AttentionCall& call) {
  if (call.dtype == DType::f32) return nullptr;
  for (const TensorCoreEntry& entry : kTensorCoreInstances)
    if (entry.dtype == call.dtype && entry.head_dim == call.head_dim) return &entry;
  return nullptr;
}

bool use_tensor_cores(const AttentionCall& call) {
  return tensor_core_entry(call) != nullptr && rows_16_byte_aligned(call.q) && rows_16_byte_aligned(call.k) &&
         rows_16_byte_aligned(call.v) && rows_16_byte_aligned(call.out);
}

FlashFwdInstance choose_instance(const ContextState& ctx, const AttentionCall& call) {
  const bool sim = ctx.device->backend() == Backend::sim;
  if (use_tensor_cores(call)) {
    const TensorCoreEntry& entry = *tensor_core_entry(call);
    if (sim) return entry.sim();
    if (entry.cuda != nullptr) return entry.cuda();
    return FlashFwdInstance{};
  }
  if (sim) return kernels::sim_target::flash_fwd_simt_instance(element_of(call.dtype), call.head_dim);
#if SELFATTN_HAVE_CUDA
  return kernels::cuda_target::flash_fwd_simt_instance(element_of(call.dtype), call.head_dim);
#else
  return FlashFwdInstance{};
#endif
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
  p.cu_seqlens_q = call.cu_seqlens_q;
  p.cu_seqlens_k = call.cu_seqlens_k;
  p.seq_q = call.seq_q;
  p.seq_k = call.seq_k;
  p.total_q = int(call.q.seq());
  p.total_k = int(call.k.seq());
  p.head_dim = call.head_dim;
  p.heads_per_kv_head = call.heads / call.kv_heads;
  p.scale_log2 = float(double(call.scale) * 1.4426950408889634);
  p.scale = call.scale;
  p.causal = causal_mask_of(call.causal);
  p.mods = score_mods_of(call);
  return p;
}

const char* fused_unsupported(const ContextState& ctx, const AttentionCall& call) {
  if (call.head_dim > kMaxHeadDim) return "head_dim above 256 needs the naive or cublas path";
  if (call.heads > kMaxGridYZ || call.batch > kMaxGridYZ) return "more than 65535 heads or sequences per call";
  if (!choose_instance(ctx, call).kernel) return "this build has no fused kernel for the backend";
  return nullptr;
}

void run_fused(ContextState& ctx, const AttentionCall& call) {
  if (const char* reason = fused_unsupported(ctx, call)) throw NotAvailable(std::string("path fused: ") + reason);
  const FlashFwdInstance instance = choose_instance(ctx, call);
  const kernels::FlashFwdParams params = flash_fwd_params_of(call);
  kernels::LaunchShape shape;
  shape.grid = dim3(unsigned((call.seq_q + instance.block_rows - 1) / instance.block_rows), unsigned(call.heads),
                    unsigned(call.batch));
  shape.block = dim3(unsigned(instance.block_threads));
  shape.dynamic_smem_bytes = instance.smem_bytes;
  ctx.device->launch(instance.kernel, shape, &params);
}

}  // namespace selfattn::detail
