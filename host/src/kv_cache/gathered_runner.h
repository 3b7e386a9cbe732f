#pragma once
// The naive and cublas paths of attention over a KV cache: kv_gather copies each sequence's K/V
// (from pages or a strided contiguous cache; an FP8 cache dequantized on the way) into dense
// buffers in the workspace, and attention() runs on them with key_lengths = cache.lengths, which
// gives exactly the bottom-right alignment of new rows at the end of each sequence. A packed
// call's gathered cache is laid out [batch, capacity, kv_heads, d], which attention_varlen() reads
// as packed keys, sequence b's at rows [b * capacity, (b + 1) * capacity).
#include "kv_cache/cache_launch.h"

namespace selfattn::detail {

// Everything that can throw (the path, a packed call's cu_seqlens, the workspace) before the first
// kernel. Needs at least one cache slot and one kv head (kv_cache.cpp serves the call without).
void attend_gathered(ContextState& state, const StagedQuery& staged, const TensorView& out,
                     const KvAttentionOptions& options);

}  // namespace selfattn::detail
