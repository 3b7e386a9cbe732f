#pragma once
#include <cstdint>
#include <optional>

#include "selfattn/context.h"
#include "selfattn/mask_options.h"
#include "selfattn/tensor.h"
#include "selfattn/types.h"

namespace selfattn {

// The options of attention(), attention_varlen(), attention_probabilities() and the backward. The
// masks and score modifiers (key_start, q_offset, window, softcap, ALiBi, bias, sinks) are the
// MaskOptions it derives from (mask_options.h), shared with the KV-cache calls. Here row i's
// position i' is its place under the causal mask in force (types.h): i' = i under top_left,
// i + (len_k - seq_q) under bottom_right AND under none (a window or ALiBi without a causal mask is
// aligned at the last key, FlashAttention's convention); q_offset sets it instead, and key_start
// moves the first key (positions count from it; the bias is still indexed by the key's row j).
struct AttentionOptions : MaskOptions {
  Path path = Path::automatic;
  Causal causal = Causal::none;            // see Causal in types.h for which rows see which keys
  std::optional<float> scale;              // default 1/sqrt(head_dim)
  // Device memory, int32 [batch]: batch b uses keys [0, key_lengths[b]) only (padding). Values are
  // clamped to [0, seq_k]. A length of 0 gives output rows of 0 and LSE -inf.
  const int32_t* key_lengths = nullptr;
  // Device memory, fp32 [batch, heads, seq_q] contiguous: log(sum_j exp(s_j)) per row over the
  // scores s_j the softmax takes (natural log), -inf for a row that sees no key. Not written when null.
  float* lse = nullptr;

  // ---- Dropout on the attention weights (FlashAttention-2's and SDPA's dropout_p), every path of
  // attention(), attention_varlen() and their backward. After the softmax above (its LSE is the one
  // written, taken before dropout), each probability P[b, h, i, j] is kept with probability
  // 1 - dropout_p and then scaled by 1 / (1 - dropout_p), else zeroed; out = (P * M / (1 - p)) V.
  // The sink (above) is not a key: its share of the softmax is never dropped. Whether an element is
  // kept is a pure function of (dropout_seed, dropout_offset, b, h, i, j) (Philox4x32-10, PyTorch's
  // and cuRAND's generator; kernels/common/dropout.cuh has the exact rule): the same seed and
  // offset give bitwise the same mask on every path, tiling and run, and the backward regenerates
  // it when given the same options. b is the batch (varlen: the sequence), i and j the query row
  // and key counted within it from 0. dropout_offset is PyTorch's philox offset: calls sharing a
  // seed draw independent masks when their offsets differ by at least batch * heads.
  // reference::dropout_keep_mask() gives the mask on the host. 0 <= dropout_p < 1, finite; 0 (the
  // default) is no dropout: the kernels test one uniform flag and compute what they did without
  // it. The Hopper kernel has none: calls with dropout run the mma.sync fused kernel there.
  float dropout_p = 0.0f;
  uint64_t dropout_seed = 0;
  uint64_t dropout_offset = 0;

  // ---- FP8 inputs (FlashAttention-3's FP8 forward). q, k and v may all be e4m3, or all e5m2; out
  // is then f16, bf16 or f32 (the result's dtype; a bias in q's dtype means out's). Each input's
  // real value is its stored value times a descale factor per (batch, kv head):
  //   q[b, h, i, c] = stored x q_descale[b, h / (heads / kv_heads)]
  //   k[b, g, j, c] = stored x k_descale[b, g],   v[b, g, j, c] = stored x v_descale[b, g]
  // Each is device fp32 [batch, kv_heads] contiguous (varlen: a row per sequence), finite and > 0
  // (device memory: not checked), or null for 1. Given with 16- or 32-bit inputs they are refused.
  // How it runs: on a 9.0 device the fused path's Hopper FP8 kernel takes e4m3 at head_dim 128 and
  // 256 with f16/bf16 out and rows on 16 bytes (scores from the stored values in fp32, then
  // descaled; P rounded to e4m3 for P V, as FlashAttention-3 does), not varlen, without key_start
  // or dropout; it takes V^T (head_dim x seq_k bytes per (batch, kv head)) in the workspace. Every
  // other call - e5m2, other head dims, GPUs, paths, options - dequantizes q, k and v into out's
  // dtype in the workspace (stored x descale, rounded once) and runs that path's 16-bit or fp32
  // kernels. The backward does not take FP8 inputs.
  const float* q_descale = nullptr;
  const float* k_descale = nullptr;
  const float* v_descale = nullptr;
};

// out = softmax(mods(scale * q k^T) + mask) v, per (batch, head) (mods: see AttentionOptions).
//   q:   [batch, heads,    seq_q, head_dim]
//   k:   [batch, kv_heads, seq_k, head_dim]    kv_heads divides heads (GQA/MQA: head h reads kv head h / (heads/kv_heads))
//   v:   [batch, kv_heads, seq_k, head_dim_v]
//   out: [batch, heads,    seq_q, head_dim_v]  same dtype as q (FP8 q: f16, bf16 or f32)
// head_dim_v is v's own head dim, head_dim (q's and k's) in most models; MLA's prefill has 192 and
// 128. The naive and cublas paths take any head_dim_v, forward and backward; the fused forward
// and backward take (192, 128) beside equal pairs (other pairs throw NotAvailable saying so); KV
// caches take two head dims too (kv_cache.h). The default scale is 1/sqrt(head_dim).
// q, k, v, out share one dtype (or q, k, v one FP8 format: AttentionOptions::q_descale); the last
// dimension's stride must be 1; out must not overlap an input.
// Runs on the context's stream (asynchronously on cuda). Throws InvalidArgument / NotAvailable /
// WorkspaceTooSmall (see ContextOptions::workspace_limit), their messages starting with the
// function called, or BackendError naming the failed CUDA/cuBLAS/sim call. Every check that can
// throw runs before anything is written: on the first three, out and lse are untouched (a
// BackendError from a failed kernel or GEMM may come after part of out was written).
// Sizes: none may be negative or above 2^31 - 2^16 (the kernels' int loops over keys must not wrap).
// No query rows (batch, heads or seq_q of 0) writes nothing; no keys
// (seq_k == 0) writes rows of 0 and LSE -inf without running a path. head_dim and head_dim_v must
// be >= 1 when there are query rows. Data pointers may be null only for views with no elements.
// options.path: automatic tries fused, then cublas (cuda) or naive (sim), then the other; an
// explicit path that does not support the call throws NotAvailable with its reason.
void attention(Context& ctx, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
               const AttentionOptions& options = {});

// Variable-length batches, packed without padding (FlashAttention's varlen layout): q and out are
// [1, heads, total_q, head_dim (out: head_dim_v)], k and v [1, kv_heads, total_k, head_dim (v:
// head_dim_v)]; sequence b owns query
// rows [cu_seqlens_q[b], cu_seqlens_q[b+1]) and key rows [cu_seqlens_k[b], cu_seqlens_k[b+1]).
// cu_seqlens_* are device int32 arrays of batch+1 entries starting at 0; max_seqlen_* bound the
// per-sequence lengths. options.key_lengths, when set, holds one entry per sequence: sequence b
// uses its first key_lengths[b] keys only (FlashAttention's seqused_k; clamped to its keys), as do
// key_start and q_offset, counted within it. options.lse, when set, is [heads, total_q].
// max_seqlen_k = 0 (or total_k = 0) says no sequence has a key: out is zeroed and lse set to -inf
// without cu_seqlens being read; max_seqlen_q = 0 says no sequence has a query row: nothing is written.
// The naive and cublas paths read cu_seqlens back to the host (synchronizing the stream) and check
// every sequence, and its workspace need, before the first one runs. Rows of out and lse that no
// sequence owns (from cu_seqlens_q[batch] on) are not written. The fused path reads cu_seqlens on
// the device only (no synchronisation; graph-safe once the workspace is warm): it takes their
// running maximum (one small kernel; 2 x 256-byte-rounded (batch + 1) int32 of workspace) and
// clamps each entry into the views, so wrong offsets give wrong rows but never an access outside
// q, k, v, out or lse, and offsets out of order give empty sequences, never two sequences sharing a
// row. Rows of out and lse no sequence then owns are not written.
void attention_varlen(Context& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                      const TensorView& out, const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k, int batch,
                      int max_seqlen_q, int max_seqlen_k, const AttentionOptions& options = {});

// The attention probabilities of attention(ctx, q, k, v, out, options), for inspection and tests
// (FlashAttention's S_dmask): probs[b, h, i, j] = the softmax's weight of key j in row i after every
// mask and modifier, exp(s_ij - lse_i), 0 for a key the row does not see (a row's weights sum to 1,
// or to less with a sink; a row that sees no key is 0), in fp32, as the naive path forms them. With
// dropout (options.dropout_p > 0) a weight that dropout drops is written negated (-P; -0.0 where P
// is 0) and a kept one as it is, unscaled: attention()'s weight is P / (1 - dropout_p) where
// probs[b, h, i, j] has its sign bit clear, else 0. Keys a row does not see are +0 either way.
//   probs: contiguous fp32 [batch, heads, seq_q, seq_k], apart from every input.
// q, k, v and options are validated as attention() validates them; v is not read. options.lse must
// be null and options.path automatic or naive (the naive path's kernels form P on every backend);
// FP8 inputs are refused (NotAvailable). The scores of a chunk of rows pass through the workspace,
// as in the naive path. Cost: the naive path's Q K^T and softmax, and batch x heads x seq_q x seq_k
// floats written; throws as attention() does, with nothing written.
void attention_probabilities(Context& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                             const TensorView& probs, const AttentionOptions& options = {});
// The same for attention_varlen()'s arguments: probs is contiguous fp32 [batch, heads, max_seqlen_q,
// max_seqlen_k], sequence b's rows and keys counted from 0 in its slice; entries no sequence's row
// and key own are 0. cu_seqlens are read back to the host (synchronizing the stream) and checked,
// as the naive path does.
void attention_probabilities_varlen(Context& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                                    const TensorView& probs, const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k,
                                    int batch, int max_seqlen_q, int max_seqlen_k, const AttentionOptions& options = {});

// The path attention() would run for this call: options.path if it supports the call, the choice
// of `automatic` otherwise. Throws as attention() would (InvalidArgument, NotAvailable).
Path resolve_path(Context& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                  const AttentionOptions& options = {});
// Whether this build and backend provide `path` at all.
bool path_available(const Context& ctx, Path path);

// The seed's whole picture, for users who start from embeddings:
//   Q = X W^Q, K = X W^K, V = X W^V (per token), split into heads, then attention().
//   x:  [batch, 1, seq, d_model]  (a TensorView with heads = 1)
//   wq: [d_model, heads * head_dim]; wk, wv: [d_model, kv_heads * head_dim] (kv_heads from their width)
//   out: [batch, heads, seq, head_dim] without wo; with wo ([heads * head_dim, d_out]) out is
//        [batch, 1, seq, d_out] = concat_heads(attention) W^O.
// Intermediate Q, K, V (and, with wo, the attention output) live in the context's workspace beside
// the attention step's scores; workspace_limit counts both (ContextOptions::workspace_limit).
// Every check, the attention step's included, runs before the first GEMM. x, the weights and out
// share one dtype; out and options.lse must not overlap x, a weight or each other.
void self_attention(Context& ctx, const TensorView& x, const MatrixView& wq, const MatrixView& wk,
                    const MatrixView& wv, int heads, const TensorView& out, const AttentionOptions& options = {},
                    const MatrixView* wo = nullptr);

}  // namespace selfattn
