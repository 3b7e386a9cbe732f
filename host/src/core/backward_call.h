#pragma once
// The validated backward call (attention_backward()): what validation/ makes of its arguments and
// every backward path runs; beside the forward's call in the core home (attention_call.h).
#include <cstdint>

#include "core/attention_call.h"
#include "selfattn/backward.h"
#include "selfattn/tensor.h"

namespace selfattn::detail {

// A validated backward call. `forward` is the forward call it differentiates (its out is the
// forward's output; its lse is null); the rest are the backward's own arguments.
// Paths only see calls with at least one query row and one key (attention_backward.cpp).
struct BackwardCall {
  AttentionCall forward;
  TensorView dout;        // q's shape and dtype
  const float* lse;       // [batch, heads, seq_q] (varlen: [heads, total_q]), fp32, device
  TensorView dq, dk, dv;  // dq like q, dk/dv like k; each q's dtype or f32
  bool deterministic = false;
  const float* dlse = nullptr;  // BackwardOptions::dlse, lse's layout, or null
  float* dsinks = nullptr;      // BackwardOptions::dsinks, [heads], or null
};

// Query rows of the LSE/D layout: batch * heads * seq_q, or heads * total_q for varlen.
inline int64_t backward_query_rows(const BackwardCall& call) {
  const AttentionCall& f = call.forward;
  return f.varlen() ? int64_t(f.heads) * f.q.seq() : int64_t(f.batch) * f.heads * f.seq_q;
}

}  // namespace selfattn::detail
