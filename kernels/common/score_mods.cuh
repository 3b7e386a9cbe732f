#pragma once
// The score modifiers in one place for every kernel (the softmax of the naive and cublas paths,
// both fused kernels): what happens to a scaled score s = scale * q.k before the softmax. The rule,
// as selfattn::reference applies it in double (attention.h, AttentionOptions):
//   s = softcap * tanh(s / softcap)            when softcap > 0
//   s = s - slope(b, h) * |i' - key|           with ALiBi; i' = aligned_row(row) (causal_mask.cuh)
//   s = s + bias(b, h, row, key)               with a bias; -inf masks the key
// Which keys a row sees at all (causal mask, key lengths, sliding window) is visible_key_range()
// in causal_mask.cuh; a key outside it never reaches modified_score().
#include <cstdint>

#include "causal_mask.cuh"
#include "compat.h"
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
};

__host__ __device__ inline HeadScoreMods head_score_mods(const ScoreMods& m, int batch, int head) {
  HeadScoreMods h{0.0f, nullptr};
  if (m.alibi_slopes != nullptr) h.slope = m.alibi_slopes[batch * m.alibi_stride_batch + head];
  if (m.bias != nullptr) {
    const int64_t offset = batch * m.bias_stride_batch + head * m.bias_stride_head;
    const int element_bytes = m.bias_element == Element::f32 ? 4 : 2;
    h.bias = static_cast<const unsigned char*>(m.bias) + offset * element_bytes;
  }
  return h;
}

__device__ inline float load_bias(Element element, const void* bias, int64_t offset) {
  switch (element) {
    case Element::f16: return __half2float(static_cast<const __half*>(bias)[offset]);
    case Element::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(bias)[offset]);
    case Element::f32: break;
  }
  return static_cast<const float*>(bias)[offset];
}

// The score of query `row` (aligned position `aligned`) and key `key` after the modifiers, from
// its scaled score (natural-log units). -INFINITY when the bias masks the key, and for a row or
// key outside the bias's extent (only wrong varlen metadata gets there; nothing is read).
__device__ inline float modified_score(const ScoreMods& m, const HeadScoreMods& h, float scaled, int row, int aligned,
                                       int key) {
  float s = scaled;
  if (m.softcap > 0.0f) s = m.softcap * tanhf(s / m.softcap);
  if (h.slope != 0.0f) s -= h.slope * fabsf(float(aligned - key));
  if (h.bias != nullptr) {
    if (row >= m.bias_rows || key >= m.bias_keys) return -INFINITY;
    s += load_bias(m.bias_element, h.bias, row * m.bias_stride_row + key * m.bias_stride_key);
  }
  return s;
}

SELFATTN_KERNELS_END
