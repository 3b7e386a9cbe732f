#pragma once
// The fused path of attention over a KV cache: the split-KV decode kernel reads the cache in place,
// each (sequence, kv head, row block) over `splits` blocks of keys, then decode_combine merges the
// partial results (none with one split: the blocks write out and lse themselves).
#include <cstddef>
#include <optional>

#include "kv_cache/cache_launch.h"

namespace selfattn::detail {

struct SplitKvPlan {
  DecodeKernel kernel;         // tensor-core or SIMT, over the cache's element (split_kv_runner.cpp)
  int splits = 1;              // options.num_splits, or the library's choice (split_heuristic.h)
  size_t workspace_bytes = 0;  // the partial results: splits * rows * (head_dim + 1) floats, 0 with one split
};

// The plan when this call runs the split-KV kernel (path fused, or automatic where the kernel takes
// the head_dim), else nullopt (the gathered runner's); an explicit fused path that cannot run
// throws NotAvailable before anything is written. seq_q: the most rows a sequence has.
std::optional<SplitKvPlan> plan_split_kv(const ContextState& state, const TensorView& q, int seq_q, const KvCache& cache,
                                         const CacheShape& shape, const KvAttentionOptions& options,
                                         const char* function);

// Runs the plan over q (rotated already, where asked) into out and options.lse; `work`: the plan's
// workspace_bytes.
void run_split_kv(ContextState& state, const SplitKvPlan& plan, const TensorView& q, const kernels::NewRows& q_rows,
                  const KvCache& cache, const CacheShape& shape, const TensorView& out,
                  const KvAttentionOptions& options, const kernels::ScoreMods& mods, unsigned char* work);

}  // namespace selfattn::detail
