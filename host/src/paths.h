#pragma once
// The attention paths behind attention(): each says whether it supports a validated call and runs
// it. attention.cpp validates arguments once, resolves `automatic`, and calls one of these.
#include <cstdint>

#include "context_state.h"
#include "selfattn/attention.h"

namespace selfattn::detail {

// A call that passed validation: shapes agree, dtypes match, head_dim stride is 1, out does not
// overlap an input. For varlen calls, cu_seqlens_q/k are set, batch is the number of sequences,
// seq_q/seq_k are the max lengths, and q/k/v/out are [1, heads, total, head_dim] views.
struct AttentionCall {
  TensorView q, k, v, out;
  DType dtype = DType::f32;
  int batch = 0, heads = 0, kv_heads = 0, seq_q = 0, seq_k = 0, head_dim = 0;
  Causal causal = Causal::none;
  float scale = 1.0f;
  const int32_t* key_lengths = nullptr;   // device, [batch] or null
  float* lse = nullptr;                   // device, [batch, heads, seq_q] (varlen: [heads, total_q]) or null
  const int32_t* cu_seqlens_q = nullptr;  // device, [batch + 1]; varlen only
  const int32_t* cu_seqlens_k = nullptr;
  bool varlen() const { return cu_seqlens_q != nullptr; }
};

// Each returns nullptr when supported, else a reason ("head_dim 7 needs the naive or cublas path").
const char* naive_unsupported(const ContextState& ctx, const AttentionCall& call);
const char* cublas_unsupported(const ContextState& ctx, const AttentionCall& call);
const char* fused_unsupported(const ContextState& ctx, const AttentionCall& call);

void run_naive(ContextState& ctx, const AttentionCall& call);
void run_cublas(ContextState& ctx, const AttentionCall& call);
void run_fused(ContextState& ctx, const AttentionCall& call);

}  // namespace selfattn::detail
