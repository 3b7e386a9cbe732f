// attention_probabilities() and attention_probabilities_varlen(): the softmax weights attention()
// forms, written out (FlashAttention's S_dmask, for inspection and tests). They are the naive
// path's: its Q K^T into the workspace, chunk by chunk, then its softmax writing P straight into
// `probs` with dropout's signs (SoftmaxParams::dropout_signs) instead of dropout's zeros.
#include <string>

#include "forward/paths.h"
#include "forward/score_chunks.h"
#include "selfattn/attention.h"
#include "selfattn/error.h"
#include "validation/attention_validation.h"

namespace selfattn {
namespace {

using detail::AttentionCall;
using detail::ByteRange;
using detail::byte_range;

// A stand-in for out, which the probabilities have none of: q's shape with v's head dim at a
// distinct address (FP8 q: bf16), validated with check_out_overlap off.
TensorView stand_in_out(const TensorView& q, const TensorView& v) {
  alignas(256) static unsigned char distinct_address[256];
  const DType dtype = is_fp8(q.dtype) ? DType::bf16 : q.dtype;
  return TensorView::bhsd(distinct_address, dtype, q.batch(), q.heads(), q.seq(), v.head_dim());
}

// probs: contiguous fp32 [batch, heads, rows, keys], apart from everything the call reads.
void check_probs(const char* function, const AttentionCall& call, const TensorView& probs, int64_t cu_entries) {
  detail::check_view(function, "probs", probs);
  if (probs.dtype != DType::f32) {
    throw InvalidArgument(std::string(function) + ": probs.dtype expected f32, got " + to_string(probs.dtype));
  }
  const int64_t expected[4] = {call.batch, call.heads, call.seq_q, call.seq_k};
  const char* names[4] = {"batch", "heads", call.varlen() ? "max_seqlen_q" : "seq_q",
                          call.varlen() ? "max_seqlen_k" : "seq_k"};
  for (int i = 0; i < 4; ++i) {
    if (probs.shape[i] != expected[i]) {
      throw InvalidArgument(std::string(function) + ": probs.shape[" + std::to_string(i) + "] expected " +
                            std::to_string(expected[i]) + " (" + names[i] + "), got " + std::to_string(probs.shape[i]));
    }
  }
  const int64_t dense[4] = {call.heads * call.seq_q * call.seq_k, call.seq_q * call.seq_k, call.seq_k, 1};
  for (int i = 0; i < 4; ++i) {
    if (probs.shape[i] > 1 && probs.strides[i] != dense[i]) {
      throw InvalidArgument(std::string(function) + ": probs expected contiguous [batch, heads, rows, keys] (stride " +
                            std::to_string(dense[i]) + " at dimension " + std::to_string(i) + "), got stride " +
                            std::to_string(probs.strides[i]));
    }
  }
  const ByteRange range = byte_range(probs);
  const auto apart = [&](const char* name, const ByteRange& other) {
    detail::expect_disjoint(function, "probs", range, name, other);
  };
  apart("q", byte_range(call.q));
  apart("k", byte_range(call.k));
  apart("v", byte_range(call.v));
  if (call.bias) apart("options.bias", byte_range(*call.bias));
  const size_t batch_bytes = size_t(call.batch) * sizeof(int32_t);
  apart("options.key_lengths", byte_range(call.key_lengths, batch_bytes));
  apart("options.key_start", byte_range(call.key_start, batch_bytes));
  apart("options.q_offset", byte_range(call.q_offset, batch_bytes));
  const int64_t slope_rows = call.alibi_stride_batch != 0 ? call.batch : 1;  // [batch, heads] or [heads]
  apart("options.alibi_slopes", byte_range(call.alibi_slopes, size_t(slope_rows) * call.heads * sizeof(float)));
  apart("options.sinks", byte_range(call.sinks, size_t(call.heads) * sizeof(float)));
  apart("cu_seqlens_q", byte_range(call.cu_seqlens_q, size_t(cu_entries) * sizeof(int32_t)));
  apart("cu_seqlens_k", byte_range(call.cu_seqlens_k, size_t(cu_entries) * sizeof(int32_t)));
}

void run_probabilities(Context& ctx, const AttentionCall& call, const TensorView& probs, const AttentionOptions& options,
                       const char* function, int64_t cu_entries) {
  check_probs(function, call, probs, cu_entries);
  if (options.lse != nullptr) {
    throw InvalidArgument(std::string(function) + ": options.lse expected null (attention() writes the LSE)");
  }
  if (options.path != Path::automatic && options.path != Path::naive) {
    throw NotAvailable(std::string(function) + ": path " + to_string(options.path) +
                       ": the probabilities come from the naive path's kernels (automatic or naive)");
  }
  if (call.fp8()) throw NotAvailable(std::string(function) + ": FP8 inputs are not supported");
  detail::ContextState& state = ctx.state();
  if (const char* reason = detail::naive_unsupported(state, call)) {
    throw NotAvailable(std::string(function) + ": " + reason);
  }
  if (probs.numel() == 0) return;
  const detail::ScorePlan plan = detail::plan_scores(state, call, detail::naive_score_layout, 0, function);
  void* workspace = state.workspace.reserve(plan.workspace_bytes, std::string(function) + ": scores S");
  // Entries no sequence's row and key own (varlen) stay 0; every other one is written.
  if (call.varlen()) detail::zero_fill(*state.device, probs);
  detail::run_naive_probabilities(state, plan, probs, workspace);
}

}  // namespace

void attention_probabilities(Context& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                             const TensorView& probs, const AttentionOptions& options) {
  const char* function = "attention_probabilities";
  const AttentionCall call =
      detail::validate_attention(function, q, k, v, stand_in_out(q, v), options, /*check_out_overlap=*/false);
  run_probabilities(ctx, call, probs, options, function, 0);
}

void attention_probabilities_varlen(Context& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                                    const TensorView& probs, const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k,
                                    int batch, int max_seqlen_q, int max_seqlen_k, const AttentionOptions& options) {
  const char* function = "attention_probabilities_varlen";
  const AttentionCall call =
      detail::validate_attention_varlen(q, k, v, stand_in_out(q, v), cu_seqlens_q, cu_seqlens_k, batch, max_seqlen_q,
                                        max_seqlen_k, options, function, /*check_out_overlap=*/false);
  run_probabilities(ctx, call, probs, options, function, batch > 0 ? batch + 1 : 0);
}

}  // namespace selfattn
