#pragma once
// What the KV-cache calls' runners share (kv_cache.cpp, split_kv_runner.cpp, gathered_runner.cpp):
// the decode kernels' lookup, the cache as the kernels see it (pages_view), the launch grid over new
// rows, a packed call's ordered offsets in the workspace, and the rotation of new rows.
#include <cstddef>
#include <cstdint>
#include <optional>

#include "forward/kernel_args.h"
#include "runtime/backend_kernels.h"
#include "runtime/context_state.h"
#include "selfattn/kv_cache.h"
#include "validation/kv_cache_validation.h"

namespace selfattn::detail {

using kernels::DecodeKernel;

// A decode kernel the backend has, or NotAvailable.
DecodeKernel available(DecodeKernel kernel);
// One decode family's instance (registry.inc: FAMILY(kernels::Element)) for the context's backend.
#define SELFATTN_DECODE_KERNEL(state, family, dtype) \
  available(SELFATTN_KERNEL_FOR((state).device->backend(), family(detail::element_of(dtype))))

kernels::KvPagesView pages_view(const KvCache& cache, const CacheShape& shape);
kernels::RotaryTables rotary_tables(const std::optional<Rotary>& rotary);
// One block per kernel.rows_per_block rows, per head, per sequence.
kernels::LaunchShape rows_grid(const DecodeKernel& kernel, int64_t rows, int64_t heads, int64_t batch);
// Workspace pieces are rounded up to 256 bytes (kv_cache.h's workspace sizes).
size_t aligned(size_t bytes);

// A call's new rows for the kernels: `view`'s own (dense), or packed through offsets already
// ordered (ordered_offsets) with at most max_seqlen rows per sequence.
kernels::NewRows new_rows(const TensorView& view, const int32_t* ordered_offsets, int max_seqlen);

// A packed call's offsets made non-decreasing in `workspace` (offsets_bytes of it), for the kernels.
size_t offsets_bytes(const PackedRows* packed, int batch);
const int32_t* ordered_offsets(ContextState& state, const PackedRows* packed, int batch, unsigned char* workspace,
                               const char* function);

// `in` rotated into `out` by rotary_rows: row s of sequence b at lengths[b] - n_b + s, its place
// among the sequence's last n_b tokens (lengths null: at s), unless rotary.positions places it.
void rotate_rows(ContextState& state, const TensorView& in, const TensorView& out, const int32_t* lengths,
                 const kernels::NewRows& rows, int batch, const Rotary& rotary);

// The query side of an attention over a cache, as both runners stage it. The call's workspace
// begins with a packed call's ordered offsets (order_bytes), then q rotated there when
// rotary is set (q_bytes); the runner's own part follows at prefix_bytes().
struct StagedQuery {
  const TensorView& q;
  const PackedRows* packed;  // a packed call's offsets, else null
  const KvCache& cache;
  const CacheShape& shape;
  const std::optional<Rotary>& rotary;
  int seq_q;  // every sequence's rows (dense), at most (packed)
  const char* function;
  size_t order_bytes = 0, q_bytes = 0;

  StagedQuery(const TensorView& q, const PackedRows* packed, const KvCache& cache, const CacheShape& shape,
              const std::optional<Rotary>& rotary, int seq_q, const char* function);
  size_t prefix_bytes() const { return order_bytes + q_bytes; }
  // The q the kernels read: q itself, or its rotated copy in the workspace at `base`.
  TensorView at(unsigned char* base) const;
  // Orders a packed call's offsets and rotates q (when asked) into the workspace at `base`;
  // returns q's rows for the kernels.
  kernels::NewRows stage(ContextState& state, unsigned char* base) const;
};

}  // namespace selfattn::detail
