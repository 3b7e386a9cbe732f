// Path 'fused': one flash-style kernel per call; S and P never reach memory.
//   compute capability 9.0 (and the sim), f16/bf16, head_dim 64/128/256, 16-byte aligned rows whose
//   strides a TMA map takes                                     -> hopper/flash_fwd_hopper.cuh
//   compute capability 9.0 (and the sim), e4m3 q/k/v, head_dim 128/256, f16/bf16 out, not varlen, no
//   key_start, no dropout, 16-byte aligned rows       -> hopper/transpose_v_fp8.cuh, then
//                                                        hopper/flash_fwd_hopper_fp8.cuh
//   (every other FP8 call is dequantized by attention.cpp and never reaches a path)
//   f16/bf16 with a shipped head dim and 16-byte aligned rows -> flash_fwd.cuh (tensor cores)
//   everything else up to head_dim 256 (fp32, other head dims, unaligned views)
//                                                               -> flash_fwd_simt.cuh (exact fp32)
#include <cmath>
#include <cstdint>
#include <string>

#include "runtime/backend_kernels.h"
#include "forward/kernel_args.h"
#include "forward/paths.h"
#include "runtime/capability.h"
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

// The Hopper instances: (dtype, head_dim) -> kernel, per backend (cuda: only in builds for sm_90a).
using HopperInstanceFn = kernels::FlashFwdHopperInstance (*)();
struct HopperEntry {
  DType dtype;
  int head_dim;
  HopperInstanceFn sim;
  HopperInstanceFn cuda;
};

#if SELFATTN_HAVE_HOPPER_KERNELS
#define SELFATTN_HOPPER_CUDA(E, D) &kernels::cuda_target::flash_fwd_hopper_instance<Element::E, D>
#else
#define SELFATTN_HOPPER_CUDA(E, D) nullptr
#endif
#define SELFATTN_HOPPER_ENTRY(E, D) \
  HopperEntry { DType::E, D, &kernels::sim_target::flash_fwd_hopper_instance<Element::E, D>, SELFATTN_HOPPER_CUDA(E, D) }

const HopperEntry kHopperInstances[] = {
    SELFATTN_HOPPER_ENTRY(f16, 64),  SELFATTN_HOPPER_ENTRY(f16, 128),  SELFATTN_HOPPER_ENTRY(f16, 256),
    SELFATTN_HOPPER_ENTRY(bf16, 64), SELFATTN_HOPPER_ENTRY(bf16, 128), SELFATTN_HOPPER_ENTRY(bf16, 256),
};
#undef SELFATTN_HOPPER_ENTRY
#undef SELFATTN_HOPPER_CUDA

// The Hopper FP8 instances: (out dtype, head_dim) -> kernel and pre-pass; q, k, v are e4m3.
using HopperFp8InstanceFn = kernels::FlashFwdHopperInstance (*)();
struct HopperFp8Entry {
  DType out;
  int head_dim;
  HopperFp8InstanceFn sim;
  HopperFp8InstanceFn cuda;
};

#if SELFATTN_HAVE_HOPPER_KERNELS
#define SELFATTN_HOPPER_FP8_CUDA(E, D) &kernels::cuda_target::flash_fwd_hopper_fp8_instance<Element::E, D>
#else
#define SELFATTN_HOPPER_FP8_CUDA(E, D) nullptr
#endif
#define SELFATTN_HOPPER_FP8_ENTRY(E, D)                                                                   \
  HopperFp8Entry {                                                                                        \
    DType::E, D, &kernels::sim_target::flash_fwd_hopper_fp8_instance<Element::E, D>, SELFATTN_HOPPER_FP8_CUDA(E, D) \
  }

const HopperFp8Entry kHopperFp8Instances[] = {
    SELFATTN_HOPPER_FP8_ENTRY(f16, 128),
    SELFATTN_HOPPER_FP8_ENTRY(bf16, 128),
    SELFATTN_HOPPER_FP8_ENTRY(f16, 256),
    SELFATTN_HOPPER_FP8_ENTRY(bf16, 256),
};
#undef SELFATTN_HOPPER_FP8_ENTRY
#undef SELFATTN_HOPPER_FP8_CUDA

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

// The Hopper instance for the call, or null: the context allows it, the device is a 9.0 one, and
// the call is one the kernel takes.
HopperInstanceFn hopper_instance(const ContextState& ctx, const AttentionCall& call) {
  if (!hopper_kernels_usable(ctx) || !use_tensor_cores(call)) return nullptr;
  // Its TMA pipeline zeroes V rows only past the sequence's end (the last tile); rows before a
  // key_start would need the same in the first tile. Such calls run the mma.sync kernel instead.
  if (call.key_start != nullptr) return nullptr;
  // It has no dropout (kernels/common/dropout.cuh): the mma.sync kernel applies it.
  if (call.dropout_p > 0) return nullptr;
  for (const HopperEntry& entry : kHopperInstances)
    if (entry.dtype == call.dtype && entry.head_dim == call.head_dim)
      return ctx.device->backend() == Backend::sim ? entry.sim : entry.cuda;
  return nullptr;
}

// A 4-D map (head_dim, rows, heads, batch) over `view` with boxes of 64 columns x box_rows rows,
// 128-byte swizzle. Varlen views are [1, heads, total, d]: batch extent 1.
kernels::TmaTiledSpec tma_spec_of(const TensorView& view, int box_rows) {
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
  spec.box[0] = 64;
  spec.box[1] = uint32_t(box_rows);
  spec.box[2] = 1;
  spec.box[3] = 1;
  spec.swizzle = kernels::TmaSwizzle::b128;
  return spec;
}

// The FP8 kernel's maps: 1-byte elements, boxes of 128 columns (128 bytes, the swizzle's row).
kernels::TmaTiledSpec tma_spec_fp8(const TensorView& view, int box_rows) {
  kernels::TmaTiledSpec spec = tma_spec_of(view, box_rows);
  spec.box[0] = 128;
  return spec;
}

// keys_padded of the V^T buffer: whole pre-pass blocks.
int64_t fp8_keys_padded(const AttentionCall& call, int keys_multiple) {
  return (int64_t(call.seq_k) + keys_multiple - 1) / keys_multiple * keys_multiple;
}
constexpr int kFp8KeysMultiple = 64;  // TransposeVFp8Traits::kKeys; run_hopper_fp8 checks they agree

size_t fp8_vt_bytes(const AttentionCall& call) {
  return round_up_256(size_t(call.batch) * size_t(call.kv_heads) * size_t(call.head_dim) *
                      size_t(fp8_keys_padded(call, kFp8KeysMultiple)));
}

const HopperFp8Entry* hopper_fp8_entry(const ContextState& ctx, const AttentionCall& call) {
  if (!hopper_kernels_usable(ctx) || call.dtype != DType::e4m3) return nullptr;
  for (const HopperFp8Entry& entry : kHopperFp8Instances) {
    if (entry.out != call.out.dtype || entry.head_dim != call.head_dim) continue;
    const bool sim = ctx.device->backend() == Backend::sim;
    if ((sim ? entry.sim : entry.cuda) == nullptr) return nullptr;
    if (!SELFATTN_KERNEL_FOR(ctx.device->backend(), transpose_v_fp8_instance().kernel)) return nullptr;
    return &entry;
  }
  return nullptr;
}

// The V^T pre-pass into `workspace`, then the FP8 kernel reading it.
void run_hopper_fp8(ContextState& ctx, const AttentionCall& call, void* workspace) {
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
  tp.head_dim = call.head_dim;
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
  vt.dims[1] = uint64_t(call.head_dim);
  vt.dims[2] = uint64_t(call.kv_heads);
  vt.dims[3] = uint64_t(call.batch);
  vt.strides_bytes[0] = 1;
  vt.strides_bytes[1] = uint64_t(keys_padded);
  vt.strides_bytes[2] = uint64_t(keys_padded) * uint64_t(call.head_dim);
  vt.strides_bytes[3] = vt.strides_bytes[2] * uint64_t(call.kv_heads);
  // Boxes of one V^T swizzle row: 128 keys (128-byte swizzle), or the tile's 64 (64-byte).
  const bool rows_of_64 = fwd.block_keys < 128;
  vt.box[0] = rows_of_64 ? 64 : 128;
  vt.box[1] = uint32_t(call.head_dim);
  vt.box[2] = 1;
  vt.box[3] = 1;
  vt.swizzle = rows_of_64 ? kernels::TmaSwizzle::b64 : kernels::TmaSwizzle::b128;
  std::string problem = ctx.device->encode_tma_tiled(&params.q_map, tma_spec_fp8(call.q, fwd.block_rows));
  if (problem.empty()) problem = ctx.device->encode_tma_tiled(&params.k_map, tma_spec_fp8(call.k, fwd.block_keys));
  if (problem.empty()) problem = ctx.device->encode_tma_tiled(&params.vt_map, vt);
  // fused_takes_fp8 checked the specs (tma_spec_problem): a refusal here is the backend's.
  if (!problem.empty()) throw BackendError("path fused: the FP8 kernel's tensor map: " + problem);
  kernels::LaunchShape shape;
  shape.grid = dim3(unsigned((call.seq_q + fwd.block_rows - 1) / fwd.block_rows), unsigned(call.heads),
                    unsigned(call.batch));
  shape.block = dim3(unsigned(fwd.block_threads));
  shape.dynamic_smem_bytes = fwd.smem_bytes;
  ctx.device->launch(fwd.kernel, shape, &params);
}

// Runs the Hopper kernel; false (nothing launched) when a view's strides cannot be a TMA map
// (negative, or beyond the map's limits), for the caller to fall back to the mma.sync kernel.
bool run_hopper(ContextState& ctx, const AttentionCall& call, HopperInstanceFn instance_fn) {
  const kernels::FlashFwdHopperInstance instance = instance_fn();
  kernels::FlashFwdHopperParams params{};
  params.base = flash_fwd_params_of(call);
  params.k_map_rows = int(call.k.seq());
  if (!ctx.device->encode_tma_tiled(&params.q_map, tma_spec_of(call.q, instance.block_rows)).empty() ||
      !ctx.device->encode_tma_tiled(&params.k_map, tma_spec_of(call.k, instance.block_keys)).empty() ||
      !ctx.device->encode_tma_tiled(&params.v_map, tma_spec_of(call.v, instance.block_keys)).empty()) {
    return false;
  }
  kernels::LaunchShape shape;
  shape.grid = dim3(unsigned((call.seq_q + instance.block_rows - 1) / instance.block_rows), unsigned(call.heads),
                    unsigned(call.batch));
  shape.block = dim3(unsigned(instance.block_threads));
  shape.dynamic_smem_bytes = instance.smem_bytes;
  ctx.device->launch(instance.kernel, shape, &params);
  return true;
}

FlashFwdInstance choose_instance(const ContextState& ctx, const AttentionCall& call) {
  const bool sim = ctx.device->backend() == Backend::sim;
  if (use_tensor_cores(call)) {
    const TensorCoreEntry& entry = *tensor_core_entry(call);
    if (sim) return entry.sim();
    if (entry.cuda != nullptr) return entry.cuda();
    return FlashFwdInstance{};
  }
  return SELFATTN_KERNEL_FOR(ctx.device->backend(), flash_fwd_simt_instance(element_of(call.dtype), call.head_dim));
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
  p.head_dim = call.head_dim;
  p.heads_per_kv_head = call.heads / call.kv_heads;
  p.scale_log2 = float(double(call.scale) * 1.4426950408889634);
  p.scale = call.scale;
  p.causal = causal_mask_of(call.causal);
  p.mods = score_mods_of(call);
  return p;
}

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

const char* fused_unsupported(const ContextState& ctx, const AttentionCall& call) {
  // FP8 calls reach a path only when the fused path takes them natively (attention.cpp
  // dequantizes the others); no other fused kernel reads FP8.
  if (call.fp8()) return fused_takes_fp8(ctx, call) ? nullptr : "FP8 inputs run natively only on the Hopper FP8 kernel";
  if (call.head_dim > kMaxHeadDim) return "head_dim above 256 needs the naive or cublas path";
  if (call.heads > kMaxGridYZ || call.batch > kMaxGridYZ) return "more than 65535 heads or sequences per call";
  if (!choose_instance(ctx, call).kernel) return "this build has no fused kernel for the backend";
  if (call.varlen() && !ordered_offsets_available(ctx)) return "this build has no running_max_offsets kernel";
  return nullptr;
}

bool ordered_offsets_available(const ContextState& ctx) {
  return bool(SELFATTN_KERNEL_FOR(ctx.device->backend(), running_max_offsets_kernel_ref()));
}

size_t fused_workspace_bytes(const AttentionCall& call) {
  // FP8 calls (never varlen: fused_takes_fp8) take the V^T buffer of the pre-pass.
  if (call.fp8()) return fp8_vt_bytes(call);
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
  if (given.fp8()) {
    run_hopper_fp8(ctx, given, workspace);  // fused_unsupported passed: fused_takes_fp8
    return;
  }
  const AttentionCall call = with_ordered_offsets(ctx, given, workspace);
  if (const HopperInstanceFn hopper = hopper_instance(ctx, call)) {
    if (run_hopper(ctx, call, hopper)) return;
  }
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
