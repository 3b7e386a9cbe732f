#pragma once
// The split-KV decode's automatic split count (attention_with_kv_cache, fused path, num_splits 0),
// defined in kv_cache.cpp; declared here so tests can pin its output.
#include <cstdint>

namespace selfattn::detail {

// The bytes a split count trades (both per block: one (sequence, kv head, row block)): the cache's
// K and V over the whole capacity, and what one split adds, its fp32 partial O and LSE written by
// decode_split_kv and read back by decode_combine. Zero: not weighed.
struct SplitBytes {
  int64_t cache = 0;
  int64_t partials_per_split = 0;
};

// `requested` when positive; else enough blocks for two waves over `multiprocessors` SMs given
// `blocks` (sequence, kv head, row block) blocks without splitting, each split keeping at least four
// 32-key tiles of `capacity`, and no more splits than keep the partials' bytes within an eighth of
// the cache's unless that leaves an SM without a block; between 1 and 64.
int choose_splits(int requested, int64_t blocks, int64_t capacity, int multiprocessors, SplitBytes bytes = {});

}  // namespace selfattn::detail
