// FP8 attention inputs (AttentionOptions::q_descale) on the paths that take 16- or 32-bit ones: q,
// k and v are dequantized into out's dtype in the workspace, in front of what the path itself
// needs, and the call runs on those copies (descales applied, so the copies are the real values
// rounded once). The Hopper FP8 kernel takes the calls it can as they are (fused_takes_fp8).
#include <string>

#include "forward/kernel_args.h"
#include "forward/paths.h"
#include "runtime/backend_kernels.h"
#include "selfattn/error.h"

namespace selfattn::detail {
namespace {

// The three copies' bytes, each rounded to 256 so every copy starts as aligned as the workspace.
struct DequantizedSizes {
  size_t q = 0, k = 0, v = 0;
  size_t total() const { return q + k + v; }
};

size_t copy_bytes(const TensorView& view, DType dtype) {
  return round_up_256(size_t(view.numel()) * dtype_size(dtype));
}

DequantizedSizes dequantized_sizes(const AttentionCall& call) {
  const DType dtype = call.out.dtype;
  return {copy_bytes(call.q, dtype), copy_bytes(call.k, dtype), copy_bytes(call.v, dtype)};
}

TensorView contiguous_copy_at(void* data, DType dtype, const TensorView& view) {
  return TensorView::bhsd(data, dtype, view.batch(), view.heads(), view.seq(), view.head_dim());
}

void dequantize_one(ContextState& ctx, const AttentionCall& call, const TensorView& in, const float* descale,
                    bool query, void* out) {
  if (in.numel() == 0) return;
  const kernels::KernelRef kernel = SELFATTN_KERNEL_FOR(
      ctx.device->backend(), dequantize_fp8_kernel_ref(element_of(call.out.dtype), cache_element_of(in.dtype)));
  kernels::DequantizeFp8Params params{};
  params.in = in.data;
  params.out = out;
  params.descale = descale;
  params.in_stride_batch = in.strides[0];
  params.in_stride_head = in.strides[1];
  params.in_stride_row = in.strides[2];
  params.batch = int(in.batch());
  params.heads = int(in.heads());
  params.seq = int(in.seq());
  params.head_dim = int(in.head_dim());
  params.kv_heads = call.kv_heads;
  params.heads_per_descale = query ? call.heads / call.kv_heads : 1;
  params.cu_seqlens = call.varlen() ? (query ? call.cu_seqlens_q : call.cu_seqlens_k) : nullptr;
  params.sequences = call.batch;
  using Traits = kernels::DequantizeFp8Traits;
  kernels::LaunchShape shape;
  shape.grid = dim3(unsigned((in.seq() + Traits::kRowsPerBlock - 1) / Traits::kRowsPerBlock), unsigned(in.heads()),
                    unsigned(in.batch()));
  shape.block = dim3(Traits::kThreads);
  ctx.device->launch(kernel, shape, &params);
}

unsigned char* at(void* base, size_t offset) { return static_cast<unsigned char*>(base) + offset; }

}  // namespace

AttentionCall dequantized_call(const AttentionCall& call, void* base) {
  const DequantizedSizes sizes = dequantized_sizes(call);
  const DType dtype = call.out.dtype;
  AttentionCall copy = call;
  copy.dtype = dtype;
  copy.q = contiguous_copy_at(at(base, 0), dtype, call.q);
  copy.k = contiguous_copy_at(at(base, sizes.q), dtype, call.k);
  copy.v = contiguous_copy_at(at(base, sizes.q + sizes.k), dtype, call.v);
  copy.q_descale = copy.k_descale = copy.v_descale = nullptr;
  return copy;
}

bool runs_fp8_natively(const ContextState& ctx, const AttentionCall& call, Path requested) {
  return (requested == Path::automatic || requested == Path::fused) && fused_takes_fp8(ctx, call);
}

void run_fp8_dequantized(ContextState& ctx, const AttentionCall& call, Path requested, const char* function) {
  if (!SELFATTN_KERNEL_FOR(ctx.device->backend(),
                           dequantize_fp8_kernel_ref(element_of(call.out.dtype), cache_element_of(call.dtype)))) {
    throw NotAvailable(std::string(function) + ": this build has no dequantize_fp8 kernel for the backend");
  }
  // The dequantize kernel's grid: heads on y, batch on z (varlen: the views' batch of 1).
  constexpr int kMaxGridYZ = 65535;
  if (call.heads > kMaxGridYZ || call.q.batch() > kMaxGridYZ) {
    throw NotAvailable(std::string(function) + ": FP8 inputs with more than 65535 heads or batches");
  }
  const size_t copies = dequantized_sizes(call).total();
  // The plan's views lie in the workspace, which is sized for the plan: plan on the copies'
  // reservation, then again if growing it for the path moved it (the same plan on a new base).
  void* base = ctx.workspace.reserve(copies, std::string(function) + ": q, k and v dequantized from FP8");
  PlannedAttention planned = plan_attention(ctx, dequantized_call(call, base), requested, function, copies);
  void* sized = ctx.workspace.reserve(copies + planned.workspace_bytes(),
                                      std::string(function) + ": dequantized q, k, v and the path's workspace");
  if (sized != base) planned = plan_attention(ctx, dequantized_call(call, base = sized), requested, function, copies);
  dequantize_one(ctx, call, call.q, call.q_descale, /*query=*/true, planned.call.q.data);
  dequantize_one(ctx, call, call.k, call.k_descale, /*query=*/false, planned.call.k.data);
  dequantize_one(ctx, call, call.v, call.v_descale, /*query=*/false, planned.call.v.data);
  run_planned(ctx, planned, at(base, copies));
}

}  // namespace selfattn::detail
