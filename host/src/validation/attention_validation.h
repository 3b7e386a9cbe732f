#pragma once
// Argument checking for attention(), attention_varlen() and self_attention(): every rule in one
// place, each failure an InvalidArgument naming the argument, what was expected and what was given.
#include <cstdint>
#include <string>

#include "core/attention_call.h"

namespace selfattn::detail {

// Validates a padded-batch call; messages start with `function` (the entry point the user called).
// check_out_overlap is false only for the calls without an out (resolve_path(), attention_probabilities()).
AttentionCall validate_attention(const char* function, const TensorView& q, const TensorView& k, const TensorView& v,
                                 const TensorView& out, const AttentionOptions& options, bool check_out_overlap = true);

AttentionCall validate_attention_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                                        const TensorView& out, const int32_t* cu_seqlens_q,
                                        const int32_t* cu_seqlens_k, int batch, int max_seqlen_q, int max_seqlen_k,
                                        const AttentionOptions& options, const char* function = "attention_varlen",
                                        bool check_out_overlap = true);

// The window, softcap, ALiBi and bias of a call whose logical extent is [batch, heads, seq_q, seq_k]
// (varlen: sequences and max lengths; KV cache: seq_k is the capacity), checked and stored in
// `call`. Slopes and bias are read while out and lse (lse_rows floats) are written: neither may
// overlap them. seq_k_name names the key dimension in messages.
void check_score_mods(const char* function, const AttentionOptions& options, int64_t batch, int64_t heads,
                      int64_t seq_q, int64_t seq_k, const TensorView& q, const TensorView& out, int64_t lse_rows,
                      bool check_out_overlap, AttentionCall& call, const char* seq_k_name = "seq_k");

// The largest size of any dimension (sequence lengths above all; a KV cache's capacity too), 2^31 -
// 2^16: the kernels' int loops that step over a dimension by up to a block of threads (1024) or
// round it up to a tile (256) then stay below INT_MAX instead of wrapping.
constexpr int64_t kMaxExtent = (int64_t(1) << 31) - (int64_t(1) << 16);

// Checks one view on its own: sizes >= 0 and at most kMaxExtent, strides >= 0, head_dim stride 1,
// data non-null and aligned to its element size when it has elements, a known dtype.
void check_view(const char* function, const char* name, const TensorView& view);
// The same, also taking the FP8 dtypes (e4m3, e5m2) when `fp8` (a KV cache's K and V).
void check_view(const char* function, const char* name, const TensorView& view, bool fp8);

// For a view the call writes (after check_view and the shape checks): no two of its elements at the
// same address (a stride of 0, or strides that interleave, would have blocks race on one element).
void expect_distinct_addresses(const char* function, const char* name, const TensorView& view);

// Device metadata and LSE pointers are loaded as whole elements: an address that is not a multiple
// of `alignment` faults on the GPU, so it is refused here, naming the argument.
void expect_aligned(const char* function, const char* name, const void* data, size_t alignment);

// Whether the view's elements fill one contiguous byte range with no gaps (any order of dims).
bool is_dense(const TensorView& view);

// Byte range [begin, end) the view's elements lie in (empty for an empty view).
struct ByteRange {
  uintptr_t begin = 0, end = 0;
  bool overlaps(const ByteRange& other) const { return begin < other.end && other.begin < end; }
};
ByteRange byte_range(const TensorView& view);
ByteRange byte_range(const void* data, size_t bytes);

// Throws InvalidArgument "<function>: <name> expected not to overlap <other_name>, ..." when the
// ranges intersect (shared with the KV-cache calls' validation).
void expect_disjoint(const char* function, const char* name, const ByteRange& range, const char* other_name,
                     const ByteRange& other);

// "f16 b2 h4/2 q113 k64 d32 causal=top_left" (for messages).
std::string describe(const AttentionCall& call);

}  // namespace selfattn::detail
