#pragma once
// The split-KV decode's automatic split count (attention_with_kv_cache, fused path, num_splits 0),
// defined in kv_cache.cpp; declared here so tests can pin its output.
#include <cstdint>

namespace selfattn::detail {

// `requested` when positive; else enough blocks for two waves over `multiprocessors` SMs given
// `blocks` (sequence, kv head, row block) blocks without splitting, each split keeping at least four
// 32-key tiles of `capacity`, between 1 and 64.
int choose_splits(int requested, int64_t blocks, int64_t capacity, int multiprocessors);

}  // namespace selfattn::detail
