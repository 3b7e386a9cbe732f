#pragma once
// Argument checking for the KV-cache calls (kv_cache.h): every rule in one place, each failure an
// InvalidArgument naming the argument, what was expected and what was given. Nothing here reads
// device memory except check_metadata (options.validate_metadata) and check_offsets_read_back.
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/context_state.h"
#include "core/attention_call.h"
#include "selfattn/attention.h"
#include "selfattn/kv_cache.h"

namespace selfattn::detail {

// The cache's shape as validated: kv_heads, head dims, page size and count, capacity per sequence.
// K's rows are head_dim_qk long (q's), V's head_dim_v (out's); v_in_k: V is a view of K's leading
// columns (a latent cache, kv_cache.h), written with K.
struct CacheShape {
  int batch = 0, kv_heads = 0, head_dim_qk = 0, head_dim_v = 0;
  bool v_in_k = false;
  int num_pages = 0, page_size = 0, max_pages_per_seq = 0;
  int capacity = 0;
};

// A packed call's row offsets (kv_cache.h, "Packed calls"): the dense calls pass null.
struct PackedRows {
  const int32_t* cu_seqlens = nullptr;  // device [batch + 1]
  int max_seqlen = 0;
};

CacheShape validate_append_kv(const KvCache& cache, const TensorView& k_new, const TensorView& v_new,
                              const AppendKvOptions& options, const PackedRows* packed = nullptr);
// The attention() options a cache call amounts to over the cache's K/V viewed as a padded batch
// [batch, kv_heads, capacity, d] with key_lengths = cache.lengths (bottom-right alignment then puts
// row i at position lengths[b] - seq_q + i): path, causal, scale, lse and the score modifiers.
AttentionOptions attention_options_of(const KvAttentionOptions& options, const KvCache& cache);

// Validates the call; `score_mods` receives its masks and modifiers (window, softcap, ALiBi, bias
// over [batch, heads, seq_q, capacity]), checked by the same rule as attention()'s.
// Packed calls check the bias as [batch, heads, max_seqlen_q, capacity] and lse as [heads, total_q].
CacheShape validate_attention_with_kv_cache(const TensorView& q, const KvCache& cache, const TensorView& out,
                                            const KvAttentionOptions& options, AttentionCall& score_mods,
                                            const PackedRows* packed = nullptr);
void validate_merge_states(const TensorView& out_a, const float* lse_a, const TensorView& out_b, const float* lse_b,
                           const TensorView& out, const float* lse_out);

void validate_cu_seqlens_from_lengths(const int32_t* lengths, int batch, const int32_t* cu_seqlens);

void validate_rotary_embedding(const TensorView& x, const TensorView& out, const Rotary& rotary);

// options.validate_metadata (kv_metadata_validation.cpp): copies lengths and block table to the host
// (synchronously) and throws InvalidArgument naming the first entry that would put a sequence's
// tokens [0, lengths[b] + extra_tokens) outside [0, capacity) or in a page outside [0, num_pages).
// A packed call's cu_seqlens (`packed`, over `total` rows) is checked too (check_packed_offsets);
// with `appending`, sequence b's extra tokens are its n_b (extra_tokens is then ignored). Each
// message also says what the kernels do with the entry when validate_metadata is not set.
void check_metadata(const char* function, ContextState& ctx, const KvCache& cache, const CacheShape& shape,
                    int extra_tokens, const PackedRows* packed = nullptr, int64_t total = 0, bool appending = false);

// A packed call's offsets, already on the host: offsets[0] == 0, then for each sequence b,
// offsets[b] <= offsets[b + 1] <= total and offsets[b + 1] - offsets[b] <= packed.max_seqlen, else
// InvalidArgument naming cu_seqlens_q (cu_seqlens_new when appending), the entry and the sequence,
// with `consequence` (what happens to such offsets elsewhere) in parentheses at the end.
void check_packed_offsets(const char* function, const std::vector<int32_t>& offsets, const PackedRows& packed,
                          int64_t total, bool appending, const std::string& consequence);

// The naive and cublas paths of attention_with_kv_cache_varlen: cu_seqlens_q read back to the host
// (synchronously, as attention_varlen() reads it there anyway) and checked as above, so that a bad
// entry is named as the caller passed it, not as the gathered keys attention_varlen() would see.
void check_offsets_read_back(const char* function, ContextState& ctx, const PackedRows& packed, int batch,
                             int64_t total);

}  // namespace selfattn::detail
