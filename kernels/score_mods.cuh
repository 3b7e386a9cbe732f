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
#include "common/compat.h"
#include "params.h"

SELFATTN_KERNELS_BEGIN

// The modifiers of one (batch, head): its ALiBi slope and the start of its bias rows, looked up
// once per block rather than per score.
struct HeadScoreMods {
  float softcap;
  float slope;       // 0 without ALiBi
  const void* bias;  // this head's bias, or null
  Element bias_element;
  int64_t bias_stride_row, bias_stride_key;
  int bias_rows, bias_keys;
  bool changes_values;
};

__host__ __device__ inline HeadScoreMods head_score_mods(const ScoreMods& m, int batch, int head) {
  HeadScoreMods h;
  h.softcap = m.softcap;
  h.slope = m.alibi_slopes != nullptr ? m.alibi_slopes[batch * m.alibi_stride_batch + head] : 0.0f;
  h.bias_element = m.bias_element;
  h.bias = nullptr;
  if (m.bias != nullptr) {
    const int64_t offset = batch * m.bias_stride_batch + head * m.bias_stride_head;
    const int element_bytes = m.bias_element == Element::f32 ? 4 : 2;
    h.bias = static_cast<const unsigned char*>(m.bias) + offset * element_bytes;
  }
  h.bias_stride_row = m.bias_stride_row;
  h.bias_stride_key = m.bias_stride_key;
  h.bias_rows = m.bias_rows;
  h.bias_keys = m.bias_keys;
  h.changes_values = m.changes_values;
  return h;
}

__device__ inline float load_bias(const HeadScoreMods& h, int64_t offset) {
  switch (h.bias_element) {
    case Element::f16: return __half2float(static_cast<const __half*>(h.bias)[offset]);
    case Element::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(h.bias)[offset]);
    case Element::f32: break;
  }
  return static_cast<const float*>(h.bias)[offset];
}

// The score of query `row` (aligned position `aligned`) and key `key` after the modifiers, from
// its scaled score (natural-log units). -INFINITY when the bias masks the key, and for a row or
// key outside the bias's extent (only wrong varlen metadata gets there; nothing is read).
__device__ inline float modified_score(const HeadScoreMods& h, float scaled, int row, int aligned, int key) {
  float s = scaled;
  if (h.softcap > 0.0f) s = h.softcap * tanhf(s / h.softcap);
  if (h.slope != 0.0f) s -= h.slope * fabsf(float(aligned - key));
  if (h.bias != nullptr) {
    if (row >= h.bias_rows || key >= h.bias_keys) return -INFINITY;
    s += load_bias(h, row * h.bias_stride_row + key * h.bias_stride_key);
  }
  return s;
}

SELFATTN_KERNELS_END
