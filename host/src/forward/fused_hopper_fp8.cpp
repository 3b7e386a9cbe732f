// The fused path's Hopper FP8 family (fused_families.h): the V^T pre-pass
// (hopper/transpose_v_fp8.cuh) into the workspace, then hopper/flash_fwd_hopper_fp8.cuh: e4m3
// q/k/v, f16/bf16 out, on compute capability 9.0 (and the sim). Every FP8 call it does not take is
// dequantized by fp8_inputs.cpp and runs as a 16/32-bit call.
#include <cstdint>
#include <string>

#include "forward/fused_families.h"
#include "forward/kernel_args.h"
#include "forward/paths.h"
#include "runtime/backend_kernels.h"
#include "runtime/capability.h"
#include "selfattn/error.h"

namespace selfattn::detail {
namespace {

using kernels::Element;
using HopperFp8InstanceFn = kernels::FlashFwdHopperInstance (*)();

// Its kernel list (kernels/hopper/flash_fwd_hopper_kernels.inc): (out dtype, head_dim_qk,
// head_dim_v) -> kernel, per backend (cuda: null where the build has no sm_90a code).
struct HopperFp8Entry {
  DType out;
  int head_dim_qk, head_dim_v;
  KernelArch arch;
  HopperFp8InstanceFn sim;
  HopperFp8InstanceFn cuda;
};

#define SELFATTN_FLASH_FWD_HOPPER(arch, E, DQK, DV)
#define SELFATTN_FLASH_FWD_HOPPER_FP8(arch, E, DQK, DV)                                                  \
  HopperFp8Entry{DType::E, DQK, DV, KernelArch::arch,                                                    \
                 &kernels::sim_target::flash_fwd_hopper_fp8_instance<Element::E, DQK>,                   \
                 SELFATTN_IF_BUILT_##arch(&kernels::cuda_target::flash_fwd_hopper_fp8_instance<Element::E, DQK>)},
const HopperFp8Entry kHopperFp8Instances[] = {
#include "kernels/hopper/flash_fwd_hopper_kernels.inc"
};
#undef SELFATTN_FLASH_FWD_HOPPER
#undef SELFATTN_FLASH_FWD_HOPPER_FP8

constexpr int kMaxGridYZ = 65535;  // heads on grid.y, batch on grid.z

// The FP8 kernel's maps: 1-byte elements, boxes of 128 columns (128 bytes, the swizzle's row).
kernels::TmaTiledSpec tma_spec_fp8(const TensorView& view, int box_rows) { return tma_spec_of(view, box_rows, 128); }

// keys_padded of the V^T buffer: whole pre-pass blocks.
int64_t fp8_keys_padded(const AttentionCall& call, int keys_multiple) {
  return (int64_t(call.seq_k) + keys_multiple - 1) / keys_multiple * keys_multiple;
}
constexpr int kFp8KeysMultiple = 64;  // TransposeVFp8Traits::kKeys; run_hopper_fp8 checks they agree

size_t fp8_vt_bytes(const AttentionCall& call) {
  return round_up_256(size_t(call.batch) * size_t(call.kv_heads) * size_t(call.head_dim_v) *
                      size_t(fp8_keys_padded(call, kFp8KeysMultiple)));
}

const HopperFp8Entry* hopper_fp8_entry(const ContextState& ctx, const AttentionCall& call) {
  if (call.dtype != DType::e4m3) return nullptr;
  for (const HopperFp8Entry& entry : kHopperFp8Instances) {
    if (entry.out != call.out.dtype || entry.head_dim_qk != call.head_dim_qk || entry.head_dim_v != call.head_dim_v ||
        !kernels_usable(ctx, entry.arch))
      continue;
    const bool sim = ctx.device->backend() == Backend::sim;
    if ((sim ? entry.sim : entry.cuda) == nullptr) return nullptr;
    if (!SELFATTN_KERNEL_FOR(ctx.device->backend(), transpose_v_fp8_instance().kernel)) return nullptr;
    return &entry;
  }
  return nullptr;
}

bool takes(const ContextState& ctx, const AttentionCall& call) { return fused_takes_fp8(ctx, call); }

// The V^T pre-pass into `workspace`, then the FP8 kernel reading it.
bool run(ContextState& ctx, const AttentionCall& call, void* workspace) {
  const HopperFp8Entry& entry = *hopper_fp8_entry(ctx, call);
  const kernels::FlashFwdHopperInstance fwd = (ctx.device->backend() == Backend::sim ? entry.sim : entry.cuda)();
  const kernels::TransposeVFp8Instance transpose =
      SELFATTN_KERNEL_FOR(ctx.device->backend(), transpose_v_fp8_instance());
  if (transpose.keys != kFp8KeysMultiple) throw BackendError("path fused: the FP8 pre-pass's key block changed");
  const int64_t keys_padded = fp8_keys_padded(call, kFp8KeysMultiple);

  kernels::TransposeVFp8Params tp{};
  tp.v = call.v.data;
  tp.v_stride_batch = call.v.strides[0];
  tp.v_stride_head = call.v.strides[1];
  tp.v_stride_row = call.v.strides[2];
  tp.vt = workspace;
  tp.key_lengths = call.key_lengths;
  tp.seq_k = call.seq_k;
  tp.keys_padded = int(keys_padded);
  tp.head_dim = call.head_dim_v;
  kernels::LaunchShape tshape;
  tshape.grid = dim3(unsigned(keys_padded / transpose.keys), unsigned(call.kv_heads), unsigned(call.batch));
  tshape.block = dim3(unsigned(transpose.threads));
  tshape.dynamic_smem_bytes = transpose.smem_bytes;
  ctx.device->launch(transpose.kernel, tshape, &tp);

  kernels::FlashFwdHopperFp8Params params{};
  params.base = flash_fwd_params_of(call);
  params.q_descale = call.q_descale;
  params.k_descale = call.k_descale;
  params.v_descale = call.v_descale;
  params.kv_heads = call.kv_heads;
  kernels::TmaTiledSpec vt{};
  vt.base = workspace;
  vt.rank = 4;
  vt.element_bytes = 1;
  vt.dims[0] = uint64_t(keys_padded);
  vt.dims[1] = uint64_t(call.head_dim_v);
  vt.dims[2] = uint64_t(call.kv_heads);
  vt.dims[3] = uint64_t(call.batch);
  vt.strides_bytes[0] = 1;
  vt.strides_bytes[1] = uint64_t(keys_padded);
  vt.strides_bytes[2] = uint64_t(keys_padded) * uint64_t(call.head_dim_v);
  vt.strides_bytes[3] = vt.strides_bytes[2] * uint64_t(call.kv_heads);
  // Boxes of one V^T swizzle row: 128 keys (128-byte swizzle), or the tile's 64 (64-byte).
  const bool rows_of_64 = fwd.block_keys < 128;
  vt.box[0] = rows_of_64 ? 64 : 128;
  vt.box[1] = uint32_t(call.head_dim_v);
  vt.box[2] = 1;
  vt.box[3] = 1;
  vt.swizzle = rows_of_64 ? kernels::TmaSwizzle::b64 : kernels::TmaSwizzle::b128;
  std::string problem = ctx.device->encode_tma_tiled(&params.q_map, tma_spec_fp8(call.q, fwd.block_rows));
  if (problem.empty()) problem = ctx.device->encode_tma_tiled(&params.k_map, tma_spec_fp8(call.k, fwd.block_keys));
  if (problem.empty()) problem = ctx.device->encode_tma_tiled(&params.vt_map, vt);
  // fused_takes_fp8 checked the specs (tma_spec_problem): a refusal here is the backend's.
  if (!problem.empty()) throw BackendError("path fused: the FP8 kernel's tensor map: " + problem);
  ctx.device->launch(fwd.kernel, query_blocks(call, fwd.block_rows, fwd.block_threads, fwd.smem_bytes), &params);
  return true;
}

}  // namespace

const FusedFamily kFusedHopperFp8{"hopper_fp8", &takes, &run};

size_t hopper_fp8_workspace_bytes(const AttentionCall& call) { return fp8_vt_bytes(call); }

bool fused_takes_fp8(const ContextState& ctx, const AttentionCall& call) {
  if (!call.fp8() || hopper_fp8_entry(ctx, call) == nullptr) return false;
  // Sequences are rows of one map (varlen) and left padding (key_start) would need the pre-pass
  // and the maps to follow per-sequence offsets; dropout is the mma.sync kernel's alone.
  if (call.varlen() || call.key_start != nullptr || call.dropout_p > 0) return false;
  if (call.heads > kMaxGridYZ || call.batch > kMaxGridYZ) return false;
  // The pre-pass reads 16-byte chunks of V's rows; TMA takes q and k only on 16-byte strides.
  if (!rows_16_byte_aligned(call.q) || !rows_16_byte_aligned(call.k) || !rows_16_byte_aligned(call.v) ||
      !rows_16_byte_aligned(call.out))
    return false;
  for (int i = 0; i < 3; ++i)
    if (call.v.strides[i] < 0) return false;
  return kernels::tma_spec_problem(tma_spec_fp8(call.q, 128)).empty() &&
         kernels::tma_spec_problem(tma_spec_fp8(call.k, 128)).empty();
}

}  // namespace selfattn::detail
