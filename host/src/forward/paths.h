#pragma once
// The attention paths behind attention(): each says whether it supports a validated call and runs
// it. attention.cpp validates arguments once, resolves `automatic`, plans the call (every check
// that can throw) and then runs one of these.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/attention_call.h"
#include "runtime/context_state.h"
#include "selfattn/attention.h"

namespace selfattn::detail {

// Each returns nullptr when supported, else a reason ("head_dim 7 needs the naive or cublas path").
const char* naive_unsupported(const ContextState& ctx, const AttentionCall& call);
const char* cublas_unsupported(const ContextState& ctx, const AttentionCall& call);
const char* fused_unsupported(const ContextState& ctx, const AttentionCall& call);

// ---- the score paths' plan (naive, cublas: score_chunks.h) ----

// How one padded call keeps the scores of a query row in the workspace.
struct ScoreLayout {
  size_t row_bytes = 0;      // workspace bytes one query row needs (S, plus P when separate)
  int64_t s_row_stride = 0;  // fp32 elements between rows of S
  int64_t p_row_stride = 0;  // elements (of P's type) between rows of P; s_row_stride when P is over S
};
ScoreLayout naive_score_layout(const AttentionCall& padded);
ScoreLayout cublas_score_layout(const AttentionCall& padded);

// A padded call (the whole call, or one sequence of a varlen call as a call of batch 1) with the
// chunk it runs in: `pairs` consecutive (batch, head) pairs x `rows` consecutive query rows.
struct ChunkedCall {
  AttentionCall call;           // never varlen
  int64_t lse_pair_stride = 0;  // LSE row q of pair bh is at call.lse[bh * lse_pair_stride + q]
  ScoreLayout layout;
  int pairs = 0, rows = 0;
  // Where this padded call's rows start in the varlen call's packed views (0 otherwise): the
  // backward slices its own views (dout, dq, the dK/dV accumulators) with them.
  int64_t q_row_offset = 0, k_row_offset = 0;
  int sequence = 0;  // the varlen call's sequence this padded call is (0 otherwise)
};

// Every chunk of a call, fixed before anything runs; workspace_bytes holds the largest.
struct ScorePlan {
  std::vector<ChunkedCall> calls;
  size_t workspace_bytes = 0;
};

// ---- planning and running (attention.cpp) ----

inline size_t round_up_256(size_t bytes) { return (bytes + 255) / 256 * 256; }

// The fused kernels read a varlen call's cu_seqlens on the device, where the host never checks them.
// Made non-decreasing first (a running maximum, one small kernel per call), they can be wrong but
// never make two sequences share a row, so no two blocks write the same output. path_fused.cpp:
//   fused_workspace_bytes: the workspace that takes (the q and the k offsets; 0 unless varlen);
//   with_ordered_offsets:  launches it into `workspace` and returns the call reading those offsets
//                          (the call itself unless varlen). The forward and the fused backward use both.
//   ordered_offsets_available: whether the backend has that kernel (the paths' support checks ask).
//   order_offsets:         launches it over one or two arrays of `count` entries (the KV cache's
//                          packed calls order one), NotAvailable without the kernel.
size_t fused_workspace_bytes(const AttentionCall& call);
AttentionCall with_ordered_offsets(ContextState& ctx, const AttentionCall& call, void* workspace);
bool ordered_offsets_available(const ContextState& ctx);
void order_offsets(ContextState& ctx, const int32_t* in_0, int32_t* out_0, const int32_t* in_1, int32_t* out_1,
                   int count, const char* function);

// A validated call ready to run: every check that can throw (path support, the cu_seqlens of a
// varlen call, the workspace limit) has passed, so running it can only fail in the backend.
struct PlannedAttention {
  AttentionCall call;
  Path path = Path::naive;
  ScorePlan scores;  // naive and cublas; empty for fused
  // The workspace the run takes: the scores' (naive, cublas), or the fused path's ordered
  // cu_seqlens (varlen; fused_workspace_bytes).
  size_t workspace_bytes() const { return path == Path::fused ? fused_workspace_bytes(call) : scores.workspace_bytes; }
};

// Plans a call with at least one query row and one key. `function` names the entry point in
// messages. The scores get the workspace limit less `reserved_before` bytes the caller keeps in
// front of them (self_attention()'s projections).
PlannedAttention plan_attention(ContextState& ctx, const AttentionCall& call, Path requested, const char* function,
                                size_t reserved_before = 0);
// Runs a plan with planned.workspace_bytes() bytes of workspace at `workspace`.
void run_planned(ContextState& ctx, const PlannedAttention& planned, void* workspace);

// The calls no path sees (attention.cpp): no query row writes nothing; no key at all (seq_k or the
// packed keys 0) zero-fills out and sets each LSE row to -inf, or to its head's sink logit (varlen:
// all of q's rows). Returns whether the call was one of them (and so is complete).
bool run_without_keys(ContextState& state, const AttentionCall& call);

// The path a call runs: `requested` when unsupported(requested) is null, else NotAvailable with its
// reason; for automatic the first of fused, then cublas (cuda) or naive (sim), then the other, that
// unsupported() accepts, else NotAvailable listing every reason. `described` names the call in the
// messages, `function` the entry point. Shared by attention() and attention_backward().
Path choose_path(Backend backend, Path requested, const char* function, const std::string& described,
                 const std::function<const char*(Path)>& unsupported);

// Writes zeros to every element of `view` (a dense view in one fill, else one fill per row).
void zero_fill(Device& device, const TensorView& view);

// Each runs a plan of a call its *_unsupported accepted; run_fused takes fused_workspace_bytes(call)
// bytes of workspace at `workspace` (null when that is 0).
void run_naive(ContextState& ctx, const ScorePlan& plan, void* workspace);
// attention_probabilities(): the naive path's Q K^T and softmax of a naive plan, P written into
// `probs` (contiguous fp32 [batch, heads, seq_q, seq_k], varlen: a [max_q, max_k] slice per
// sequence) with dropout's signs; plan.workspace_bytes at `workspace`.
void run_naive_probabilities(ContextState& ctx, const ScorePlan& plan, const TensorView& probs, void* workspace);
void run_cublas(ContextState& ctx, const ScorePlan& plan, void* workspace);
void run_fused(ContextState& ctx, const AttentionCall& call, void* workspace);
// FP8 inputs (fp8_inputs.cpp). runs_fp8_natively: the call runs as it is, on the fused path's
// Hopper FP8 kernel (fused_takes_fp8, fused_hopper_fp8.cpp), when `requested` allows that path. Every
// other FP8 call goes through run_fp8_dequantized: q, k and v dequantized into out's dtype in the
// workspace (dequantized_call(call, base) is the call on those copies at `base`), then planned and
// run as a 16- or 32-bit call; it reserves the workspace itself.
bool fused_takes_fp8(const ContextState& ctx, const AttentionCall& call);
bool runs_fp8_natively(const ContextState& ctx, const AttentionCall& call, Path requested);
AttentionCall dequantized_call(const AttentionCall& call, void* base);
void run_fp8_dequantized(ContextState& ctx, const AttentionCall& call, Path requested, const char* function);

}  // namespace selfattn::detail
