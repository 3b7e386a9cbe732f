// The fused path's Hopper family (fused_families.h): hopper/flash_fwd_hopper.cuh, f16/bf16 with
// wgmma and TMA, on compute capability 9.0 (and the sim), for the head dims of its kernel list.
#include <cstdint>

#include "forward/fused_families.h"
#include "forward/kernel_args.h"
#include "runtime/backend_kernels.h"
#include "runtime/capability.h"

namespace selfattn::detail {
namespace {

using kernels::Element;
using HopperInstanceFn = kernels::FlashFwdHopperInstance (*)();

// Its kernel list (kernels/hopper/flash_fwd_hopper_kernels.inc): (dtype, head_dim_qk, head_dim_v)
// -> kernel, per backend (cuda: null where the build has no sm_90a code).
struct HopperEntry {
  DType dtype;
  int head_dim_qk, head_dim_v;
  KernelArch arch;
  HopperInstanceFn sim;
  HopperInstanceFn cuda;
};

#define SELFATTN_FLASH_FWD_HOPPER(arch, E, DQK, DV)                                                 \
  HopperEntry{DType::E, DQK, DV, KernelArch::arch,                                                  \
              &kernels::sim_target::flash_fwd_hopper_instance<Element::E, DQK, DV>,                 \
              SELFATTN_IF_BUILT_##arch(&kernels::cuda_target::flash_fwd_hopper_instance<Element::E, DQK, DV>)},
#define SELFATTN_FLASH_FWD_HOPPER_FP8(arch, E, DQK, DV)
const HopperEntry kHopperInstances[] = {
#include "kernels/hopper/flash_fwd_hopper_kernels.inc"
};
#undef SELFATTN_FLASH_FWD_HOPPER
#undef SELFATTN_FLASH_FWD_HOPPER_FP8

// The instance for the call, or null: the context may run its architecture's code and the call is
// one the kernel takes.
HopperInstanceFn hopper_instance(const ContextState& ctx, const AttentionCall& call) {
  if (call.fp8() || call.dtype == DType::f32) return nullptr;
  // Its TMA pipeline zeroes V rows only past the sequence's end (the last tile); rows before a
  // key_start would need the same in the first tile. Such calls run the mma.sync kernel instead.
  if (call.key_start != nullptr) return nullptr;
  // It has no dropout (kernels/common/dropout.cuh): the mma.sync kernel applies it.
  if (call.dropout_p > 0) return nullptr;
  if (!rows_16_byte_aligned(call.q) || !rows_16_byte_aligned(call.k) || !rows_16_byte_aligned(call.v) ||
      !rows_16_byte_aligned(call.out))
    return nullptr;
  for (const HopperEntry& entry : kHopperInstances) {
    if (entry.dtype != call.dtype || entry.head_dim_qk != call.head_dim_qk || entry.head_dim_v != call.head_dim_v ||
        !kernels_usable(ctx, entry.arch))
      continue;
    return ctx.device->backend() == Backend::sim ? entry.sim : entry.cuda;
  }
  return nullptr;
}

bool takes(const ContextState& ctx, const AttentionCall& call) { return hopper_instance(ctx, call) != nullptr; }

// False (nothing launched) when a view's strides cannot be a TMA map (negative, or beyond the map's
// limits): the mma.sync family runs the call.
bool run(ContextState& ctx, const AttentionCall& call, void* /*workspace*/) {
  const kernels::FlashFwdHopperInstance instance = hopper_instance(ctx, call)();
  kernels::FlashFwdHopperParams params{};
  params.base = flash_fwd_params_of(call);
  params.k_map_rows = int(call.k.seq());
  if (!ctx.device->encode_tma_tiled(&params.q_map, tma_spec_of(call.q, instance.block_rows)).empty() ||
      !ctx.device->encode_tma_tiled(&params.k_map, tma_spec_of(call.k, instance.block_keys)).empty() ||
      !ctx.device->encode_tma_tiled(&params.v_map, tma_spec_of(call.v, instance.block_keys)).empty()) {
    return false;
  }
  ctx.device->launch(instance.kernel,
                     query_blocks(call, instance.block_rows, instance.block_threads, instance.smem_bytes), &params);
  return true;
}

}  // namespace

const FusedFamily kFusedHopper{"hopper", &takes, &run};

kernels::TmaTiledSpec tma_spec_of(const TensorView& view, int box_rows, int box_columns) {
  kernels::TmaTiledSpec spec;
  spec.base = view.data;
  spec.rank = 4;
  spec.element_bytes = int(dtype_size(view.dtype));
  const int64_t element = spec.element_bytes;
  spec.dims[0] = uint64_t(view.head_dim());
  spec.dims[1] = uint64_t(view.seq());
  spec.dims[2] = uint64_t(view.heads());
  spec.dims[3] = uint64_t(view.batch());
  spec.strides_bytes[0] = uint64_t(element);
  spec.strides_bytes[1] = uint64_t(view.strides[2] * element);
  spec.strides_bytes[2] = uint64_t(view.strides[1] * element);
  spec.strides_bytes[3] = uint64_t(view.strides[0] * element);
  spec.box[0] = uint32_t(box_columns);
  spec.box[1] = uint32_t(box_rows);
  spec.box[2] = 1;
  spec.box[3] = 1;
  spec.swizzle = kernels::TmaSwizzle::b128;
  return spec;
}

}  // namespace selfattn::detail
