#pragma once
// Argument checking for attention_backward() and attention_varlen_backward(): the forward's rules
// (attention_validation.h) for q, k, v, out and the options, then the backward's own arguments.
#include "core/backward_call.h"

namespace selfattn::detail {

BackwardCall validate_backward(const char* function, const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& out, const TensorView& dout, const float* lse, const TensorView& dq,
                               const TensorView& dk, const TensorView& dv, const AttentionOptions& options,
                               const BackwardOptions& backward);

BackwardCall validate_varlen_backward(const char* function, const TensorView& q, const TensorView& k,
                                      const TensorView& v, const TensorView& out, const TensorView& dout,
                                      const float* lse, const TensorView& dq, const TensorView& dk,
                                      const TensorView& dv, const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k,
                                      int batch, int max_seqlen_q, int max_seqlen_k, const AttentionOptions& options,
                                      const BackwardOptions& backward);

}  // namespace selfattn::detail
