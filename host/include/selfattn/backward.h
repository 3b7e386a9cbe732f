#pragma once
// The backward pass of attention(): the gradients dQ, dK, dV of a loss L given dO = dL/d(out).
//
// With P = softmax(mods(scale * Q K^T) + mask) the forward's probabilities (recomputed from q, k
// and the forward's LSE, never stored by the forward), per (batch, head):
//   dV = P^T dO
//   dP = dO V^T,  D_i = sum_c dO_ic O_ic  (= sum_j P_ij dP_ij),  dS = P * (dP - D)   (row-wise D)
//   dS' = dS * d mods / d s   (softcap: 1 - tanh^2(s / softcap); ALiBi and bias add constants: 1)
//   dQ = scale dS' K,  dK = scale dS'^T Q
// With dropout (AttentionOptions::dropout_p; keep mask M, the forward's, regenerated from the same
// dropout_seed and dropout_offset, so pass the forward's options unchanged):
//   dV = (P * M / (1 - p))^T dO,  dP = (dO V^T) * M / (1 - p),  dS = P * (dP - D)
// with D_i = sum_c dO_ic O_ic still = sum_j (P_ij M_ij / (1 - p)) (dO_i . v_j) = sum_j P_ij dP_ij,
// so D, dS and dsinks keep their form (the sink is never dropped).
// GQA/MQA: dK and dV of a kv head sum over the query heads that share it. Masked keys (causal,
// key lengths, window, a -inf bias) get no gradient: a row that sees no key has dQ = 0, a key no
// row sees has dK = dV = 0, exactly (never NaN).
#include <cstdint>

#include "selfattn/attention.h"
#include "selfattn/context.h"
#include "selfattn/tensor.h"

namespace selfattn {

struct BackwardOptions {
  // Bitwise-identical gradients run to run, whatever the order in which blocks run. The naive and
  // cublas paths always are; the fused path by default accumulates dQ with fp32 atomics from every
  // key tile (an order that varies between runs, so the last bits of dQ do), and with this set runs
  // a second kernel that computes dQ per query tile instead (no atomics; it recomputes S and dP
  // once more: 7 matrix products instead of 5). bench/NOTES.md has what it costs.
  bool deterministic = false;
  // The upstream gradient of the forward's LSE, dL/d(lse): device fp32 in the lse argument's layout
  // ([batch, heads, seq_q] contiguous; varlen: [heads, total_q]), or null for none (a loss of out
  // alone). It adds dlse_i P_ij to dS_ij (d lse_i / d s_ij = P_ij), which is D_i - dlse_i in place
  // of D_i in dS = P (dP - D): every path takes it at the same cost. Must not overlap a gradient.
  const float* dlse = nullptr;
  // The gradient of the forward's sinks (AttentionOptions::sinks): device fp32 [heads], written
  // (not accumulated) with dL/d sink[h] = -sum over the head's rows of P_i,sink (D_i - dlse_i),
  // P_i,sink = exp(sink[h] - lse_i), summed in a fixed order (deterministic). Null: not computed
  // (sinks held fixed); must be null without options.sinks when there are heads (with none, both
  // arrays are empty and either pointer may be null). A head whose sink is -inf gets 0, and
  // so does every head of a call without query rows. Must not overlap anything read or written.
  // Costs one pass over the LSE and D (2 x 4 bytes per query row) after D is computed.
  float* dsinks = nullptr;
};

// Gradients of attention(ctx, q, k, v, out, options) for the upstream gradient dout.
//   q, k, v:  the forward's inputs, as attention() takes them (any strides, head_dim stride 1)
//   out:      the forward's output [batch, heads, seq_q, head_dim_v], q's dtype
//   dout:     dL/d(out), same shape and dtype as out
//             (head_dim_v may differ from q's and k's head_dim on the naive and cublas paths; the
//             fused path refuses it with NotAvailable)
//   lse:      device fp32 [batch, heads, seq_q] contiguous: the forward's options.lse output
//             (natural log, -inf for a row that saw no key). Required when there are query rows.
//   dq:       [batch, heads, seq_q, head_dim], dk, dv: like k and v, each in q's
//             dtype or f32, any strides (head_dim stride 1). Every element is written.
// options: the forward's options, all of them honoured (path, causal, scale, key_lengths, window,
// softcap, ALiBi, bias, sinks, dropout); options.lse must be null (the forward's LSE is the `lse` argument).
// No gradient may overlap another or anything the call reads (q, k, v, out, dout, lse, key_lengths,
// slopes, bias, sinks). Throws as attention() does (InvalidArgument naming the argument, NotAvailable,
// WorkspaceTooSmall, BackendError), and every check runs before anything is written: on the first
// three, dq, dk and dv are untouched.
// Zero sizes: no query rows gives dK = dV = 0; no keys gives dQ = 0; nothing runs a path.
// Workspace (ContextOptions::workspace_limit), in bytes, one reservation; each part rounded up to
// 256 (the last may be counted unrounded):
//   every path:   D, 4 per query row (batch * heads * seq_q; varlen heads * total_q); also a call
//                 without keys that asks for dsinks (D, and for varlen the offsets below, are all
//                 its work)
//   fused:        varlen: the running maximum of cu_seqlens_q and of cu_seqlens_k, 4 * (batch + 1)
//                 each (see attention_varlen); then the dQ accumulator, 4 * head_dim per query row,
//                 unless backward.deterministic
//   naive/cublas: dK and dV accumulators, 4 * (head_dim + head_dim_v) per key row (batch * kv_heads * seq_k),
//                 then the score rows of a chunk of query rows: 2 * 4 * round_up(seq_k, 4) per row
//                 (S/P and dP/dS in fp32), on cublas for f16/bf16 plus 2 * 2 * round_up(seq_k, 8)
//                 (P and dS in that dtype); as many rows as fit, WorkspaceTooSmall when one does not.
void attention_backward(Context& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const TensorView& dout, const float* lse, const TensorView& dq,
                        const TensorView& dk, const TensorView& dv, const AttentionOptions& options = {},
                        const BackwardOptions& backward = {});

// The backward of attention_varlen(): views packed as there ([1, heads, total_q, head_dim] for q,
// out, dout, dq; [1, kv_heads, total_k, head_dim] for k, v, dk, dv), lse [heads, total_q]. Rows of
// dq outside every sequence and key rows of dk/dv outside every sequence are written as 0. The
// fused path reads cu_seqlens as attention_varlen's does (on the device, their running maximum).
void attention_varlen_backward(Context& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& out, const TensorView& dout, const float* lse, const TensorView& dq,
                               const TensorView& dk, const TensorView& dv, const int32_t* cu_seqlens_q,
                               const int32_t* cu_seqlens_k, int batch, int max_seqlen_q, int max_seqlen_k,
                               const AttentionOptions& options = {}, const BackwardOptions& backward = {});

}  // namespace selfattn
