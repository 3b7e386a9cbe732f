#pragma once
// The masks and score modifiers, one bundle for every attention call: AttentionOptions
// (attention(), attention_varlen(), attention_probabilities() and their backward) and
// KvAttentionOptions (the KV-cache calls) both derive from it, so a field is written once and reads
// the same in both (options.softcap, options.bias, ...). What each call aligns a row at is its own
// header's: attention.h for the forward, kv_cache.h for the cache.
#include <cstdint>
#include <optional>

#include "selfattn/tensor.h"

namespace selfattn {

// For query row i and key j the softmax takes s = scale * q_i.k_j, then, in this order:
//   softcap  s = softcap * tanh(s / softcap)
//   ALiBi    s = s - slope[b, h] * |i' - j|
//   bias     s = s + bias[b, h, i, j]            (-inf masks the key)
// over the keys the causal mask, key lengths, key_start and the sliding window leave visible. i' is
// row i's position among the keys (the causal mask's alignment, or q_offset: attention.h, kv_cache.h).
// A row left with no key, or whose every visible key the bias masks, outputs 0 and LSE -inf (with a
// sink: sink[h], below). A modified score at or below -1e38 masks its key as -inf does (so a mask
// written as -FLT_MAX, torch.finfo(dtype).min, masks on every path, also a row of nothing else),
// and one above 1e38 is clamped to 1e38: the fused kernels scale scores by log2(e), past which fp32
// overflows (reference::limit_score). Any combination runs on every path and entry point.
struct MaskOptions {
  // Device memory, int32 [batch] each (varlen: one entry per sequence, counted within it), null: off.
  // key_start[b]: batch b's keys before key_start[b] are padding (left padding; FlashAttention's
  // cache_leftpad): never seen and never read, so they may hold anything. Key positions count from
  // it: with it, the causal alignments and the window treat key key_start[b] as the sequence's first.
  // q_offset[b]: the position of query row 0 among the keys, counted from key_start[b]: row i sits at
  // i' = q_offset[b] + i, which then places the causal mask (row i sees keys at positions <= i'
  // under top_left or bottom_right alike), the window and ALiBi, whatever the lengths (a static
  // cache: every slot handed over, the new rows at the positions they hold). Device data, clamped:
  // key_start to [0, the batch's key length], q_offset to [0, 2^31 - 2^16]. With key lengths, batch
  // b's keys are [key_start[b], key_lengths[b]). The fused kernels skip whole key tiles both rule out.
  const int32_t* key_start = nullptr;
  const int32_t* q_offset = nullptr;

  // Sliding window: row i sees key j only when i' - window_left <= j <= i' + window_right; -1 means
  // unbounded on that side (the default: no window). (0, 0) sees key i' alone; with top_left or
  // bottom_right causal, window_right beyond 0 changes nothing. The fused path skips whole key
  // tiles outside the window: its cost grows with the window, not with seq_k.
  int window_left = -1, window_right = -1;
  // Logit soft-capping (Gemma 2, Grok): when set, a finite value > 0.
  std::optional<float> softcap;
  // ALiBi: device fp32 slopes, alibi_slopes_count of them: heads ([heads], shared by the batch) or
  // batch * heads ([batch, heads]; varlen: one row per sequence). Adds -slope * |i' - j|
  // (FlashAttention's convention: a positive slope penalises distance). Null: no ALiBi.
  const float* alibi_slopes = nullptr;
  int64_t alibi_slopes_count = 0;
  // Additive bias: a device view [batch, heads, seq_q, seq_k] (varlen: [batch, heads, max_seqlen_q,
  // max_seqlen_k], sequence b's rows and keys counted from 0; the KV cache: [batch, heads, seq_q,
  // capacity], keys by cache position) in fp32, q's dtype, or b8: a boolean mask (SDPA's attn_mask),
  // read by the kernels as bytes, nonzero where a key may be seen (adds 0), 0 where not (-inf). A
  // dimension of extent 1 broadcasts, and so does any stride of 0: [1, heads, q, k], [batch, 1, q,
  // k] and [1, 1, q, k] (or the full shape with stride 0) are views of one copy. Entries are finite
  // or -inf. Any strides >= 0; 64-bit offsets. Must not overlap out or lse.
  std::optional<TensorView> bias;
  // Attention sinks (gpt-oss; StreamingLLM's learned variant): device fp32 [heads], one logit per
  // query head that joins every row's softmax as one more key whose value row is 0, taken as it is
  // (not scaled, capped, distance-penalised or biased):
  //   out_i = sum_j e^(s_ij) v_j / (e^(sink[h]) + sum_j e^(s_ij)),  lse_i = log(e^(sink[h]) + sum_j e^(s_ij))
  // over row i's visible keys. A row that sees no key outputs 0 and LSE sink[h]. Values are finite,
  // or -inf for a head without a sink (not checked: device memory). Must not overlap out or lse.
  // Null: no sinks. The backward's gradient for them is BackwardOptions::dsinks.
  const float* sinks = nullptr;
};

}  // namespace selfattn
