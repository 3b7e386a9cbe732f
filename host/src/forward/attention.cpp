// attention() and attention_varlen(): validate every argument once into an AttentionCall, handle
// the calls that need no kernel (nothing to compute; no keys at all), pick a path, run it.
//
// Zero sizes are handled here, not by the paths:
//   batch, heads or seq_q == 0  -> nothing is written.
//   seq_k == 0 (varlen: total_k or max_seqlen_k == 0) -> out is zero-filled and lse set to -inf, or
//   to the head's sink logit with sinks (varlen: all of out's total_q rows, since no sequence has a
//   key).
// Paths therefore only see calls with at least one query row and at least one key column.
// (Rows that see no key for other reasons - key_lengths of 0, causal masks - are the paths' job.)
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "validation/attention_validation.h"
#include "runtime/backend_kernels.h"
#include "forward/paths.h"
#include "forward/score_chunks.h"
#include "selfattn/attention.h"
#include "selfattn/error.h"

namespace selfattn {
namespace {

using detail::AttentionCall;
using detail::ContextState;

const char* unsupported_reason(const ContextState& state, const AttentionCall& call, Path path) {
  switch (path) {
    case Path::naive: return detail::naive_unsupported(state, call);
    case Path::cublas: return detail::cublas_unsupported(state, call);
    case Path::fused: return detail::fused_unsupported(state, call);
    case Path::automatic: break;
  }
  return "not a concrete path";
}

Path choose_attention_path(const ContextState& state, const AttentionCall& call, Path requested,
                           const char* function) {
  return detail::choose_path(state.device->backend(), requested, function, detail::describe(call),
                             [&](Path path) { return unsupported_reason(state, call, path); });
}

}  // namespace

namespace detail {

bool run_without_keys(ContextState& state, const AttentionCall& call) {
  if (call.batch == 0 || call.heads == 0 || call.seq_q == 0) return true;
  const bool no_keys = call.seq_k == 0 || call.k.seq() == 0;
  if (!no_keys) return false;
  const int64_t rows_per_head = call.varlen() ? call.q.seq() : call.seq_q;
  const int64_t lse_rows = call.varlen() ? int64_t(call.heads) * rows_per_head : int64_t(call.batch) * call.heads * rows_per_head;
  const bool writes_lse = call.lse != nullptr && lse_rows > 0;
  // The kernel is looked up before out is written: a throw leaves everything untouched.
  const kernels::KernelRef kernel =
      writes_lse ? SELFATTN_KERNEL_FOR(state.device->backend(), lse_without_keys_kernel_ref()) : kernels::KernelRef{};
  if (writes_lse && !kernel) throw NotAvailable("attention: no lse_without_keys kernel for this backend");
  zero_fill(*state.device, call.out);
  if (!writes_lse) return true;
  const kernels::LseWithoutKeysParams params{call.lse, call.sinks, lse_rows, rows_per_head, call.heads};
  constexpr int kThreads = 256;
  constexpr int64_t kMaxBlocks = 65535;  // the kernel's grid-stride loop covers the rest
  kernels::LaunchShape shape;
  shape.grid = dim3(unsigned(std::min((lse_rows + kThreads - 1) / kThreads, kMaxBlocks)));
  shape.block = dim3(kThreads);
  state.device->launch(kernel, shape, &params);
  return true;
}

}  // namespace detail

namespace {

// Plans (every check that can throw), sizes the workspace for the plan, runs it.
void run_attention(ContextState& state, const AttentionCall& call, Path requested, const char* function) {
  if (detail::run_without_keys(state, call)) return;
  if (call.fp8() && !detail::runs_fp8_natively(state, call, requested)) {
    return detail::run_fp8_dequantized(state, call, requested, function);
  }
  const detail::PlannedAttention planned = detail::plan_attention(state, call, requested, function);
  const char* use = planned.path == Path::fused ? ": the fused path's ordered cu_seqlens" : ": scores S/P";
  void* workspace = state.workspace.reserve(planned.workspace_bytes(), std::string(function) + use);
  detail::run_planned(state, planned, workspace);
}

}  // namespace

void attention(Context& ctx, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
               const AttentionOptions& options) {
  ContextState& state = ctx.state();
  run_attention(state, detail::validate_attention("attention", q, k, v, out, options), options.path, "attention");
}

void attention_varlen(Context& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                      const TensorView& out, const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k, int batch,
                      int max_seqlen_q, int max_seqlen_k, const AttentionOptions& options) {
  ContextState& state = ctx.state();
  const AttentionCall call = detail::validate_attention_varlen(q, k, v, out, cu_seqlens_q, cu_seqlens_k, batch,
                                                               max_seqlen_q, max_seqlen_k, options);
  run_attention(state, call, options.path, "attention_varlen");
}

Path resolve_path(Context& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                  const AttentionOptions& options) {
  ContextState& state = ctx.state();
  // out only has to be valid for validation: a view shaped like q with v's head dim at a distinct
  // (never used) address; FP8 inputs are taken as giving bf16 out.
  alignas(256) static unsigned char distinct_address[256];
  const DType out_dtype = is_fp8(q.dtype) ? DType::bf16 : q.dtype;
  TensorView out = TensorView::bhsd(distinct_address, out_dtype, q.batch(), q.heads(), q.seq(), v.head_dim());
  AttentionOptions checked = options;
  checked.lse = nullptr;
  const AttentionCall call =
      detail::validate_attention("resolve_path", q, k, v, out, checked, /*check_out_overlap=*/false);
  if (call.fp8() && !detail::runs_fp8_natively(state, call, options.path)) {
    // The path that runs the dequantized copies (their addresses: any 256-aligned ones).
    return choose_attention_path(state, detail::dequantized_call(call, distinct_address), options.path, "resolve_path");
  }
  return choose_attention_path(state, call, options.path, "resolve_path");
}

bool path_available(const Context& ctx, Path path) {
  if (path == Path::automatic) return true;
  const ContextState& state = const_cast<Context&>(ctx).state();
  // The path exists when it supports at least one ordinary call; the probe calls are never run.
  alignas(256) static unsigned char probe_memory[4 * 256];
  for (DType dtype : {DType::f16, DType::bf16, DType::f32}) {
    for (int head_dim : {64, 128, 32, 2}) {
      AttentionCall call;
      call.dtype = dtype;
      call.batch = call.heads = call.kv_heads = 1;
      call.seq_q = call.seq_k = 128;
      call.head_dim_qk = call.head_dim_v = head_dim;
      call.scale = 1.0f / std::sqrt(float(head_dim));
      call.q = TensorView::bhsd(probe_memory + 0 * 256, dtype, 1, 1, 128, head_dim);
      call.k = TensorView::bhsd(probe_memory + 1 * 256, dtype, 1, 1, 128, head_dim);
      call.v = TensorView::bhsd(probe_memory + 2 * 256, dtype, 1, 1, 128, head_dim);
      call.out = TensorView::bhsd(probe_memory + 3 * 256, dtype, 1, 1, 128, head_dim);
      if (unsupported_reason(state, call, path) == nullptr) return true;
    }
  }
  return false;
}

namespace detail {

// The order `automatic` tries: the fused kernel first; then the GEMM-based path that is fastest on
// the backend (cuBLAS on a GPU; on the sim the naive kernels, whose own code is what is being tested).
namespace {
std::vector<Path> automatic_order(Backend backend) {
  if (backend == Backend::cuda) return {Path::fused, Path::cublas, Path::naive};
  return {Path::fused, Path::naive, Path::cublas};
}
}  // namespace

Path choose_path(Backend backend, Path requested, const char* function, const std::string& described,
                 const std::function<const char*(Path)>& unsupported) {
  if (requested != Path::automatic) {
    if (const char* reason = unsupported(requested)) {
      throw NotAvailable(std::string(function) + ": path " + to_string(requested) + " does not support " + described +
                         ": " + reason);
    }
    return requested;
  }
  std::string reasons;
  for (Path path : automatic_order(backend)) {
    const char* reason = unsupported(path);
    if (reason == nullptr) return path;
    reasons += std::string("; ") + to_string(path) + ": " + reason;
  }
  throw NotAvailable(std::string(function) + ": no path supports " + described + " on the " + to_string(backend) +
                     " backend" + reasons);
}

// Writes zeros to every element of `view` (a dense view in one fill, else one fill per row).
void zero_fill(Device& device, const TensorView& view) {
  if (view.numel() == 0) return;
  const size_t element = dtype_size(view.dtype);
  if (detail::is_dense(view)) {
    device.fill(view.data, 0, size_t(view.numel()) * element);
    return;
  }
  for (int64_t b = 0; b < view.batch(); ++b)
    for (int64_t h = 0; h < view.heads(); ++h)
      for (int64_t s = 0; s < view.seq(); ++s)
        device.fill(static_cast<unsigned char*>(view.data) + view.offset(b, h, s, 0) * element, 0,
                    size_t(view.head_dim()) * element);
}

PlannedAttention plan_attention(ContextState& ctx, const AttentionCall& call, Path requested, const char* function,
                                size_t reserved_before) {
  PlannedAttention planned;
  planned.call = call;
  planned.path = choose_attention_path(ctx, call, requested, function);
  if (planned.path == Path::naive) {
    planned.scores = plan_scores(ctx, call, naive_score_layout, reserved_before, function);
  } else if (planned.path == Path::cublas) {
    planned.scores = plan_scores(ctx, call, cublas_score_layout, reserved_before, function);
  }
  return planned;
}

void run_planned(ContextState& ctx, const PlannedAttention& planned, void* workspace) {
  switch (planned.path) {
    case Path::naive: return run_naive(ctx, planned.scores, workspace);
    case Path::cublas: return run_cublas(ctx, planned.scores, workspace);
    case Path::fused: return run_fused(ctx, planned.call, workspace);
    case Path::automatic: break;
  }
}

}  // namespace detail
}  // namespace selfattn
