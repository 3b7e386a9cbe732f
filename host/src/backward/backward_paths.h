#pragma once
// The paths behind attention_backward() (selfattn/backward.h). attention_backward.cpp validates the
// arguments once into a BackwardCall, handles the calls no path sees, picks a path, asks it for a
// plan (every check that can throw: path support, a varlen call's cu_seqlens, the workspace), reserves
// the plan's workspace, and runs it. A path's run writes dq, dk and dv completely (varlen: the rows
// of its sequences; the caller zero-fills the rest first).
#include <cstddef>
#include <cstdint>

#include "core/backward_call.h"
#include "forward/paths.h"
#include "selfattn/backward.h"

namespace selfattn::detail {

// The workspace of a plan, one reservation: D (every path), then the path's own parts. Offsets
// are in bytes from the workspace's start, each 256-byte aligned; `bytes` is the total.
struct BackwardWorkspace {
  size_t d_offset = 0;          // fp32 D per query row, in the LSE's layout
  size_t dq_accum_offset = 0;   // fused, non-deterministic: fp32 dQ [rows of lse][head_dim]
  size_t offsets_offset = 0;    // fused, varlen: the ordered cu_seqlens (fused_workspace_bytes, paths.h)
  size_t dkv_accum_offset = 0;  // naive/cublas: fp32 dK then dV, each in its gradient's shape
  size_t scores_offset = 0;     // naive/cublas: the chunk's score rows
  size_t bytes = 0;
};

// A backward call ready to run: every check that can throw has passed.
struct PlannedBackward {
  BackwardCall call;
  Path path = Path::naive;
  ScorePlan scores;  // naive and cublas: the padded calls and chunks (score_chunks.h); empty for fused
  BackwardWorkspace workspace;
};

// Each returns nullptr when the path supports the call, else the reason.
const char* naive_backward_unsupported(const ContextState& ctx, const BackwardCall& call);
const char* cublas_backward_unsupported(const ContextState& ctx, const BackwardCall& call);
const char* fused_backward_unsupported(const ContextState& ctx, const BackwardCall& call);

// Each plans a call its *_unsupported accepted: fills planned.scores (naive, cublas) and
// planned.workspace (may throw WorkspaceTooSmall or, for varlen, InvalidArgument; messages start
// with `function`). Nothing is written.
void plan_naive_backward(ContextState& ctx, PlannedBackward& planned, const char* function);
void plan_cublas_backward(ContextState& ctx, PlannedBackward& planned, const char* function);
void plan_fused_backward(ContextState& ctx, PlannedBackward& planned, const char* function);

// Each runs a plan with planned.workspace.bytes of workspace at `workspace`.
void run_naive_backward(ContextState& ctx, const PlannedBackward& planned, void* workspace);
void run_cublas_backward(ContextState& ctx, const PlannedBackward& planned, void* workspace);
void run_fused_backward(ContextState& ctx, const PlannedBackward& planned, void* workspace);

// ---- shared by the paths (backward_common.cpp) ----

// D_i = sum_c dO_ic O_ic in fp32 for every query row, into d (the LSE's layout) - the first kernel of
// every path.
void launch_backward_dot(ContextState& ctx, const BackwardCall& call, float* d);

// call.dsinks from the LSE and D (sink_gradient.cuh); a varlen call counts the rows of its sequences.
void launch_sink_gradient(ContextState& ctx, const BackwardCall& call, const float* d);

// Stores an fp32 accumulator [batch, heads, seq, head_dim] (contiguous, `view`'s shape) into `view`
// (its dtype and strides), each value times `multiplier`.
void launch_store_gradient(ContextState& ctx, const float* accumulator, const TensorView& view, float multiplier);

}  // namespace selfattn::detail
