#pragma once
// The validated attention call: what validation/ makes of a caller's arguments and every path of
// forward/, backward/ and kv_cache/ runs. Its own home below them all, so validation and the
// runtime name it without including a family's headers.
#include <cstdint>
#include <optional>

#include "selfattn/attention.h"
#include "selfattn/tensor.h"
#include "selfattn/types.h"

namespace selfattn::detail {

// A call that passed validation: shapes agree, dtypes match, head_dim stride is 1, out does not
// overlap an input. For varlen calls, cu_seqlens_q/k are set, batch is the number of sequences,
// seq_q/seq_k are the max lengths, and q/k/v/out are [1, heads, total, d] views.
// Two head dims: q and k share head_dim_qk (the dot product's length, and the default scale's),
// v and out share head_dim_v. A path that needs them equal says so in its supports().
struct AttentionCall {
  TensorView q, k, v, out;
  DType dtype = DType::f32;
  int batch = 0, heads = 0, kv_heads = 0, seq_q = 0, seq_k = 0;
  int head_dim_qk = 0, head_dim_v = 0;
  Causal causal = Causal::none;
  float scale = 1.0f;
  const int32_t* key_lengths = nullptr;   // device, [batch] or null
  const int32_t* key_start = nullptr;     // device, [batch] or null (AttentionOptions::key_start)
  const int32_t* q_offset = nullptr;      // device, [batch] or null
  float* lse = nullptr;                   // device, [batch, heads, seq_q] (varlen: [heads, total_q]) or null
  const int32_t* cu_seqlens_q = nullptr;  // device, [batch + 1]; varlen only
  const int32_t* cu_seqlens_k = nullptr;
  // Masks and score modifiers (AttentionOptions), validated. bias, when present, is normalised to
  // the call's full extent [batch, heads, seq_q, seq_k] (varlen: max lengths) with stride 0 on every
  // broadcast dimension; alibi_stride_batch is heads for [batch, heads] slopes, 0 for [heads].
  int window_left = -1, window_right = -1;
  float softcap = 0;  // 0: none
  const float* alibi_slopes = nullptr;
  int64_t alibi_stride_batch = 0;
  std::optional<TensorView> bias;
  const float* sinks = nullptr;  // device, [heads] or null
  // Dropout (AttentionOptions::dropout_p), validated: 0 is off. dropout_batch_base is the sequence
  // a per-sequence call of a varlen call (batch 1) stands for, so its mask is the sequence's.
  float dropout_p = 0;
  uint64_t dropout_seed = 0, dropout_offset = 0;
  int dropout_batch_base = 0;
  // FP8 inputs (AttentionOptions::q_descale): dtype is q's FP8 format and out is f16/bf16/f32; the
  // descales are device fp32 [batch, kv_heads] or null (1). Null for 16- and 32-bit calls.
  const float* q_descale = nullptr;
  const float* k_descale = nullptr;
  const float* v_descale = nullptr;
  bool fp8() const { return is_fp8(dtype); }
  bool varlen() const { return cu_seqlens_q != nullptr; }
  bool equal_head_dims() const { return head_dim_qk == head_dim_v; }
  // Whether which keys a row sees depends on per-batch device data (lengths, starts, offsets).
  bool per_batch_keys() const { return key_lengths != nullptr || key_start != nullptr || q_offset != nullptr; }
};

}  // namespace selfattn::detail
