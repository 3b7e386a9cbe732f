// attention_backward() and attention_varlen_backward(): validate every argument once into a
// BackwardCall, handle the calls no path sees, pick a path, plan it (every check that can throw),
// reserve the plan's workspace, compute D, run the path (backward_paths.h).
//
// Zero sizes are handled here, not by the paths: no query rows (batch, heads or seq_q of 0) or no
// keys (seq_k of 0) -> every gradient is zero-filled (dK = dV = 0 without queries, dQ = 0 without
// keys) and no path runs. The sinks' gradient is 0 without queries; with queries but no keys each
// row's softmax is its sink alone, and D and the sink gradient run as always.
#include <string>
#include <vector>

#include "backward/backward_paths.h"
#include "validation/attention_validation.h"
#include "validation/backward_validation.h"
#include "selfattn/backward.h"
#include "selfattn/error.h"

namespace selfattn::detail {
namespace {

const char* unsupported_reason(const ContextState& state, const BackwardCall& call, Path path) {
  switch (path) {
    case Path::naive: return naive_backward_unsupported(state, call);
    case Path::cublas: return cublas_backward_unsupported(state, call);
    case Path::fused: return fused_backward_unsupported(state, call);
    case Path::automatic: break;
  }
  return "not a concrete path";
}

Path choose_backward_path(const ContextState& state, const BackwardCall& call, Path requested, const char* function) {
  return choose_path(state.device->backend(), requested, function, describe(call.forward),
                     [&](Path path) { return unsupported_reason(state, call, path); });
}

void zero_gradients(ContextState& state, const BackwardCall& call) {
  zero_fill(*state.device, call.dq);
  zero_fill(*state.device, call.dk);
  zero_fill(*state.device, call.dv);
}

// D (every path's first kernel) into the workspace at `d`, then the sinks' gradient when asked.
void run_row_terms(ContextState& state, const BackwardCall& call, float* d) {
  launch_backward_dot(state, call, d);
  if (call.dsinks != nullptr) launch_sink_gradient(state, call, d);
}

// The calls no path sees (see the top of this file). Returns true when the call is complete.
bool run_without_work(ContextState& state, const BackwardCall& call, const char* function) {
  const AttentionCall& f = call.forward;
  const bool no_queries = f.batch == 0 || f.heads == 0 || f.seq_q == 0 || f.q.seq() == 0;
  const bool no_keys = f.seq_k == 0 || f.k.seq() == 0;
  if (!no_queries && !no_keys) return false;
  if (no_queries || call.dsinks == nullptr) {
    zero_gradients(state, call);
    if (call.dsinks != nullptr && f.heads > 0) state.device->fill(call.dsinks, 0, size_t(f.heads) * sizeof(float));
    return true;
  }
  // D, then (varlen) the running maximum of cu_seqlens, which the sinks' gradient ends at, read as
  // the fused path reads it.
  const size_t d_bytes = round_up_256(size_t(backward_query_rows(call)) * sizeof(float));
  auto* base = static_cast<unsigned char*>(
      state.workspace.reserve(d_bytes + fused_workspace_bytes(f), std::string(function) + ": backward workspace"));
  BackwardCall ordered = call;
  ordered.forward = with_ordered_offsets(state, f, base + d_bytes);
  zero_gradients(state, call);
  run_row_terms(state, ordered, reinterpret_cast<float*>(base));
  return true;
}

void run_backward(ContextState& state, const BackwardCall& call, Path requested, const char* function) {
  if (run_without_work(state, call, function)) return;
  PlannedBackward planned;
  planned.call = call;
  planned.path = choose_backward_path(state, call, requested, function);
  // D comes first in every plan; the path adds its own parts behind it.
  planned.workspace.d_offset = 0;
  planned.workspace.bytes = round_up_256(size_t(backward_query_rows(call)) * sizeof(float));
  switch (planned.path) {
    case Path::naive: plan_naive_backward(state, planned, function); break;
    case Path::cublas: plan_cublas_backward(state, planned, function); break;
    case Path::fused: plan_fused_backward(state, planned, function); break;
    case Path::automatic: break;
  }
  void* workspace = state.workspace.reserve(planned.workspace.bytes, std::string(function) + ": backward workspace");

  // Every check has passed: from here on the call writes.
  if (call.forward.varlen()) zero_gradients(state, call);  // rows outside every sequence stay 0
  unsigned char* base = static_cast<unsigned char*>(workspace);
  // The fused path reads a varlen call's cu_seqlens as their running maximum (paths.h); the sinks'
  // gradient, which ends at cu_seqlens_q[batch], reads them so too.
  if (planned.path == Path::fused) {
    planned.call.forward = with_ordered_offsets(state, call.forward, base + planned.workspace.offsets_offset);
  }
  run_row_terms(state, planned.call, reinterpret_cast<float*>(base + planned.workspace.d_offset));
  switch (planned.path) {
    case Path::naive: return run_naive_backward(state, planned, workspace);
    case Path::cublas: return run_cublas_backward(state, planned, workspace);
    case Path::fused: return run_fused_backward(state, planned, workspace);
    case Path::automatic: break;
  }
}

}  // namespace
}  // namespace selfattn::detail

namespace selfattn {

void attention_backward(Context& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const TensorView& dout, const float* lse, const TensorView& dq,
                        const TensorView& dk, const TensorView& dv, const AttentionOptions& options,
                        const BackwardOptions& backward) {
  const char* function = "attention_backward";
  const detail::BackwardCall call =
      detail::validate_backward(function, q, k, v, out, dout, lse, dq, dk, dv, options, backward);
  detail::run_backward(ctx.state(), call, options.path, function);
}

void attention_varlen_backward(Context& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& out, const TensorView& dout, const float* lse, const TensorView& dq,
                               const TensorView& dk, const TensorView& dv, const int32_t* cu_seqlens_q,
                               const int32_t* cu_seqlens_k, int batch, int max_seqlen_q, int max_seqlen_k,
                               const AttentionOptions& options, const BackwardOptions& backward) {
  const char* function = "attention_varlen_backward";
  const detail::BackwardCall call =
      detail::validate_varlen_backward(function, q, k, v, out, dout, lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, batch,
                                       max_seqlen_q, max_seqlen_k, options, backward);
  detail::run_backward(ctx.state(), call, options.path, function);
}

}  // namespace selfattn
