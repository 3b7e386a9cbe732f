// The module's entry points, one per library function, as selfattn_ext.cpp binds them (its m.def
// calls name their arguments). By family, as host/src has them: call_forward.cpp, call_backward.cpp
// and call_kv_cache.cpp define them; call.h is the translation they share.
#pragma once

#include <optional>
#include <string>

#include "call.h"

namespace selfattn_python {

// call_forward.cpp
void attention(BoundContext& context, InArray q, InArray k, InArray v, OutArray out, std::optional<std::string> causal,
               std::optional<float> scale, std::string path, std::optional<InArray> key_lengths,
               std::optional<OutArray> lse, const MaskArgs& masks, bool bf16_as_uint16, float dropout_p,
               uint64_t dropout_seed, uint64_t dropout_offset, std::optional<std::string> fp8,
               std::optional<InArray> q_descale, std::optional<InArray> k_descale, std::optional<InArray> v_descale);
void attention_varlen(BoundContext& context, InArray q, InArray k, InArray v, OutArray out, InArray cu_seqlens_q,
                      InArray cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, std::optional<std::string> causal,
                      std::optional<float> scale, std::string path, std::optional<InArray> key_lengths,
                      std::optional<OutArray> lse, const MaskArgs& masks, bool bf16_as_uint16,
                      float dropout_p, uint64_t dropout_seed, uint64_t dropout_offset, std::optional<std::string> fp8,
                      std::optional<InArray> q_descale, std::optional<InArray> k_descale,
                      std::optional<InArray> v_descale);
// cu_seqlens_q and cu_seqlens_k given: the varlen form (q, k, v [1, heads, total, head_dim] views).
void attention_probabilities(BoundContext& context, InArray q, InArray k, InArray v, OutArray probs,
                             std::optional<InArray> cu_seqlens_q, std::optional<InArray> cu_seqlens_k,
                             int max_seqlen_q, int max_seqlen_k, std::optional<std::string> causal,
                             std::optional<float> scale, std::string path, std::optional<InArray> key_lengths,
                             const MaskArgs& masks, bool bf16_as_uint16, float dropout_p,
                             uint64_t dropout_seed, uint64_t dropout_offset);
void self_attention(BoundContext& context, InArray x, InArray wq, InArray wk, InArray wv, int heads, OutArray out,
                    std::optional<InArray> wo, std::optional<std::string> causal, std::optional<float> scale,
                    std::string path, std::optional<InArray> key_lengths, const MaskArgs& masks,
                    bool bf16_as_uint16);

// call_backward.cpp
void attention_backward(BoundContext& context, InArray q, InArray k, InArray v, InArray out, InArray dout, InArray lse,
                        OutArray dq, OutArray dk, OutArray dv, std::optional<std::string> causal,
                        std::optional<float> scale, std::string path, std::optional<InArray> key_lengths,
                        const MaskArgs& masks, bool deterministic,
                        std::optional<InArray> dlse, std::optional<OutArray> dsinks, bool bf16_as_uint16,
                        float dropout_p, uint64_t dropout_seed, uint64_t dropout_offset);
void attention_varlen_backward(BoundContext& context, InArray q, InArray k, InArray v, InArray out, InArray dout,
                               InArray lse, OutArray dq, OutArray dk, OutArray dv, InArray cu_seqlens_q,
                               InArray cu_seqlens_k, int max_seqlen_q, int max_seqlen_k,
                               std::optional<std::string> causal, std::optional<float> scale, std::string path,
                               std::optional<InArray> key_lengths, const MaskArgs& masks, bool deterministic,
                               std::optional<InArray> dlse, std::optional<OutArray> dsinks, bool bf16_as_uint16,
                               float dropout_p, uint64_t dropout_seed, uint64_t dropout_offset);

// call_kv_cache.cpp
void append_kv(BoundContext& context, OutArray k_cache, OutArray v_cache, InArray lengths,
               std::optional<InArray> block_table, std::optional<InArray> batch_index, InArray k_new, InArray v_new,
               std::optional<InArray> rotary_cos, std::optional<InArray> rotary_sin, bool rotary_interleaved,
               std::optional<InArray> rotary_positions, int rotary_position_step,
               std::optional<OutArray> updated_lengths, bool validate_metadata, std::optional<InArray> cu_seqlens_new,
               int max_seqlen_new, bool bf16_as_uint16, std::optional<std::string> fp8,
               std::optional<InArray> k_scale, std::optional<InArray> v_scale, int rotary_first_dim);
void attention_with_kv_cache(BoundContext& context, InArray q, InArray k_cache, InArray v_cache, InArray lengths,
                             std::optional<InArray> block_table, std::optional<InArray> batch_index, OutArray out,
                             std::optional<std::string> causal, std::optional<float> scale, std::string path,
                             std::optional<OutArray> lse, std::optional<InArray> rotary_cos,
                             std::optional<InArray> rotary_sin, bool rotary_interleaved,
                             std::optional<InArray> rotary_positions, int rotary_position_step, int num_splits,
                             const MaskArgs& masks, bool validate_metadata,
                             std::optional<InArray> cu_seqlens_q, int max_seqlen_q, bool bf16_as_uint16,
                             std::optional<std::string> fp8, std::optional<InArray> k_scale,
                             std::optional<InArray> v_scale, int rotary_first_dim);
void rotary_embedding(BoundContext& context, InArray x, OutArray out, InArray rotary_cos, InArray rotary_sin,
                      bool rotary_interleaved, std::optional<InArray> rotary_positions, int rotary_position_step,
                      bool bf16_as_uint16, int rotary_first_dim);
void merge_states(BoundContext& context, InArray out_a, InArray lse_a, InArray out_b, InArray lse_b, OutArray out,
                  std::optional<OutArray> lse_out, bool bf16_as_uint16);
void cu_seqlens_from_lengths(BoundContext& context, InArray lengths, OutArray cu_seqlens);

}  // namespace selfattn_python
