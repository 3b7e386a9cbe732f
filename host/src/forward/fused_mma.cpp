// The fused path's portable families (fused_families.h): forward/flash_fwd.cuh on tensor cores
// (mma.sync) for f16/bf16 with a head dim of its kernel list and 16-byte aligned rows, and
// forward/flash_fwd_simt.cuh (exact fp32) for everything else up to head_dim 256.
#include "forward/fused_families.h"
#include "forward/kernel_args.h"
#include "runtime/backend_kernels.h"
#include "runtime/capability.h"

namespace selfattn::detail {
namespace {

using kernels::Element;
using kernels::FlashFwdInstance;
using InstanceFn = FlashFwdInstance (*)();

// The tensor-core kernel list (kernels/forward/flash_fwd_kernels.inc): (dtype, head_dim_qk,
// head_dim_v) -> kernel, per backend (cuda: null in a build without nvcc).
struct TensorCoreEntry {
  DType dtype;
  int head_dim_qk, head_dim_v;
  KernelArch arch;
  InstanceFn sim;
  InstanceFn cuda;
};

#define SELFATTN_FLASH_FWD(arch, E, DQK, DV)                                                         \
  TensorCoreEntry{DType::E, DQK, DV, KernelArch::arch,                                               \
                  &kernels::sim_target::flash_fwd_instance<Element::E, DQK, DV>,                     \
                  SELFATTN_IF_BUILT_##arch(&kernels::cuda_target::flash_fwd_instance<Element::E, DQK, DV>)},
const TensorCoreEntry kTensorCoreInstances[] = {
#include "kernels/forward/flash_fwd_kernels.inc"
};
#undef SELFATTN_FLASH_FWD

const TensorCoreEntry* tensor_core_entry(const ContextState& ctx, const AttentionCall& call) {
  if (call.fp8() || call.dtype == DType::f32) return nullptr;
  if (!rows_16_byte_aligned(call.q) || !rows_16_byte_aligned(call.k) || !rows_16_byte_aligned(call.v) ||
      !rows_16_byte_aligned(call.out))
    return nullptr;
  for (const TensorCoreEntry& entry : kTensorCoreInstances)
    if (entry.dtype == call.dtype && entry.head_dim_qk == call.head_dim_qk && entry.head_dim_v == call.head_dim_v &&
        kernels_usable(ctx, entry.arch))
      return &entry;
  return nullptr;
}

FlashFwdInstance tensor_core_instance(const ContextState& ctx, const AttentionCall& call) {
  const TensorCoreEntry* entry = tensor_core_entry(ctx, call);
  if (entry == nullptr) return FlashFwdInstance{};
  const InstanceFn instance = ctx.device->backend() == Backend::sim ? entry->sim : entry->cuda;
  return instance != nullptr ? instance() : FlashFwdInstance{};
}

bool takes_mma(const ContextState& ctx, const AttentionCall& call) {
  return bool(tensor_core_instance(ctx, call).kernel);
}

// A kernel of the FlashFwdInstance kind (mma.sync, SIMT) over the call.
void launch_flash_fwd(ContextState& ctx, const AttentionCall& call, const FlashFwdInstance& instance) {
  const kernels::FlashFwdParams params = flash_fwd_params_of(call);
  ctx.device->launch(instance.kernel,
                     query_blocks(call, instance.block_rows, instance.block_threads, instance.smem_bytes), &params);
}

bool run_mma(ContextState& ctx, const AttentionCall& call, void* /*workspace*/) {
  launch_flash_fwd(ctx, call, tensor_core_instance(ctx, call));
  return true;
}

FlashFwdInstance simt_instance(const ContextState& ctx, const AttentionCall& call) {
  // Its head dim is a runtime value, one for q·k and v alike.
  if (call.fp8() || !call.equal_head_dims()) return FlashFwdInstance{};
  return SELFATTN_KERNEL_FOR(ctx.device->backend(), flash_fwd_simt_instance(element_of(call.dtype), call.head_dim_qk));
}

bool takes_simt(const ContextState& ctx, const AttentionCall& call) { return bool(simt_instance(ctx, call).kernel); }

bool run_simt(ContextState& ctx, const AttentionCall& call, void* /*workspace*/) {
  launch_flash_fwd(ctx, call, simt_instance(ctx, call));
  return true;
}

}  // namespace

const FusedFamily kFusedMma{"mma.sync", &takes_mma, &run_mma};
const FusedFamily kFusedSimt{"simt", &takes_simt, &run_simt};

kernels::LaunchShape query_blocks(const AttentionCall& call, int block_rows, int threads, size_t smem_bytes) {
  kernels::LaunchShape shape;
  shape.grid = dim3(unsigned((call.seq_q + block_rows - 1) / block_rows), unsigned(call.heads), unsigned(call.batch));
  shape.block = dim3(unsigned(threads));
  shape.dynamic_smem_bytes = smem_bytes;
  return shape;
}

}  // namespace selfattn::detail
