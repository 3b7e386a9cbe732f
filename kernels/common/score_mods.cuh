#pragma once
// The score modifiers in one place for every kernel (the softmax of the naive and cublas paths,
// both fused kernels): what happens to a scaled score s = scale * q.k before the softmax. The rule,
// as selfattn::reference applies it in double (attention.h, AttentionOptions):
//   s = softcap * tanh(s / softcap)            when softcap > 0
//   s = s - slope(b, h) * |i' - key|           with ALiBi; i' = aligned_row(row) (causal_mask.cuh)
//   s = s + bias(b, h, row, key)               with a bias; -inf masks the key
// Which keys a row sees at all (causal mask, key lengths, sliding window) is visible_key_range()
// in causal_mask.cuh; a key outside it never reaches modified_score(). The result is then kept in
// fp32's exp2-domain range (limit_score).
// An attention sink (a head's logit that joins every row's softmax as a key whose value is 0) does
// not change any score: it enters where a row's softmax ends, in softmax_row_end(). Dropout
// (dropout.cuh) acts on the probabilities after the softmax, never on a score.
#include <cstdint>

#include "causal_mask.cuh"
#include "compat.h"
#include "dropout.cuh"
#include "../params.h"

SELFATTN_KERNELS_BEGIN

// log2(e): the fused kernels keep scores in log2 units (one exp2 per probability), so a modified
// score, computed in natural-log units, is converted with it.
constexpr float kLog2e = 1.4426950408889634f;

// What one (batch, head) adds to the call's ScoreMods: its ALiBi slope and the start of its bias,
// looked up once per block. Everything else is read from the kernel's parameters where used, so the
// fused kernels hold two values in registers for it, not the whole struct.
struct HeadScoreMods {
  float slope;       // 0 without ALiBi
  const void* bias;  // this head's bias, or null
  float sink;        // this head's sink logit (natural log), -inf without one
  uint32_t dropout_stream;  // dropout.cuh's b * heads + h (unused without dropout)
};

// A head's sink logit, -inf without sinks. The fused kernels read it in their epilogue rather than
// hold it in a register across the key loop.
__host__ __device__ inline float head_sink(const ScoreMods& m, int head) {
  return m.sinks != nullptr ? m.sinks[head] : -INFINITY;
}

__host__ __device__ inline HeadScoreMods head_score_mods(const ScoreMods& m, int batch, int head) {
  HeadScoreMods h{0.0f, nullptr, head_sink(m, head), dropout_stream(m, batch, head)};
  if (m.alibi_slopes != nullptr) h.slope = m.alibi_slopes[batch * m.alibi_stride_batch + head];
  if (m.bias != nullptr) {
    const int64_t offset = batch * m.bias_stride_batch + head * m.bias_stride_head;
    const int element_bytes = m.bias_element == BiasElement::f32 ? 4 : m.bias_element == BiasElement::b8 ? 1 : 2;
    h.bias = static_cast<const unsigned char*>(m.bias) + offset * element_bytes;
  }
  return h;
}

// A boolean bias reads as the additive mask it stands for: 0 where true, -inf where false.
__device__ inline float load_bias(BiasElement element, const void* bias, int64_t offset) {
  switch (element) {
    case BiasElement::f16: return __half2float(static_cast<const __half*>(bias)[offset]);
    case BiasElement::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(bias)[offset]);
    case BiasElement::b8: return static_cast<const unsigned char*>(bias)[offset] != 0 ? 0.0f : -INFINITY;
    case BiasElement::f32: break;
  }
  return static_cast<const float*>(bias)[offset];
}

// The score of query `row` (aligned position `aligned`) and key `key` after the modifiers, from
// its scaled score (natural-log units). -INFINITY when the bias masks the key, and for a row or
// key outside the bias's extent (only wrong varlen metadata gets there; nothing is read).
// The largest magnitude a modified score keeps: the fused kernels scale scores by log2(e), and a
// finite score beyond FLT_MAX / log2(e) would become inf there (and a row's max - max NaN). So a
// score at or below -kScoreLimit masks its key as -inf does (an additive mask written as -FLT_MAX,
// as torch.finfo(dtype).min is, then masks on every path), one above +kScoreLimit is clamped to it,
// NaN stays NaN. reference::limit_score is the host twin.
constexpr float kScoreLimit = 1e38f;

__device__ inline float limit_score(float s) {
  if (s <= -kScoreLimit) return -INFINITY;
  return s > kScoreLimit ? kScoreLimit : s;
}

__device__ inline float modified_score(const ScoreMods& m, const HeadScoreMods& h, float scaled, int row, int aligned,
                                       int key) {
  float s = scaled;
  if (m.softcap > 0.0f) s = m.softcap * tanhf(s / m.softcap);
  if (h.slope != 0.0f) s -= h.slope * fabsf(float(aligned - key));
  if (h.bias != nullptr) {
    if (row >= m.bias_rows || key >= m.bias_keys) return -INFINITY;
    s += load_bias(m.bias_element, h.bias, row * m.bias_stride_row + key * m.bias_stride_key);
  }
  return limit_score(s);
}

// How a row's softmax ends: what its unnormalised output sum_j e^(s_j - max) v_j is multiplied by,
// and its LSE (natural log).
struct SoftmaxRowEnd {
  float inverse;
  float lse;
};

// The end of one row's softmax from its largest score `max` (-inf: no key) and `sum` = sum_j
// e^(s_j - max) over its keys (0: none), both in log2 units when Log2 (the fused kernels' exp2
// domain) or natural ones, and the head's sink logit (natural log, -inf: none). Without a sink:
// 1 / sum and max + log(sum), a row without keys 0 and -inf. A sink adds e^(sink - max) to the sum,
// shifted by max(max, sink) so that neither term overflows; a row without keys then gets inverse 0
// and LSE sink. That branch works in natural units: converting the row's max rounds differently
// row by row, where converting the sink would give every row of a head the same error (and a
// leading sink enters the LSE exactly).
template <bool Log2>
__device__ __forceinline__ SoftmaxRowEnd softmax_row_end(float max, float sum, float sink) {
  constexpr float kLn2 = 0.69314718055994531f;
  if (sink == -INFINITY) {
    if (!(sum > 0.0f)) return {0.0f, -INFINITY};
    return {1.0f / sum, Log2 ? (max + log2f(sum)) * kLn2 : max + logf(sum)};
  }
  const float row_max = Log2 ? max * kLn2 : max;
  const float shift = fmaxf(row_max, sink);
  // e^(row_max - shift) is 0 for a row without keys (max = -inf): its sum is 0 too.
  const float keys_share = expf(row_max - shift);
  const float total = sum * keys_share + expf(sink - shift);
  return {keys_share / total, shift + logf(total)};
}

SELFATTN_KERNELS_END
