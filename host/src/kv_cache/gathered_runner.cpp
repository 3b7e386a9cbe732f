// The naive and cublas paths of attention over a KV cache (gathered_runner.h).
#include "kv_cache/gathered_runner.h"

#include <string>
#include <vector>

#include "forward/paths.h"
#include "selfattn/error.h"
#include "validation/attention_validation.h"

namespace selfattn::detail {

void attend_gathered(ContextState& state, const StagedQuery& staged, const TensorView& out,
                     const KvAttentionOptions& options) {
  const TensorView& q = staged.q;
  const PackedRows* packed = staged.packed;
  const KvCache& cache = staged.cache;
  const CacheShape& shape = staged.shape;
  const char* function = staged.function;
  const int seq_q = staged.seq_q;
  // The same call as attention() (attention_varlen() when packed) over the gathered cache
  // (kv_cache_validation.h), modifiers included.
  const AttentionOptions attention_options = attention_options_of(options, cache);
  // Workspace: after the staged q, the gathered K and V and a packed call's key offsets, then the
  // attention step's scores after them, as self_attention() does.
  // K's gathered rows are head_dim_qk long, V's head_dim_v (a V that is a view of K is gathered on its own).
  const size_t rows_bytes = size_t(shape.batch) * shape.kv_heads * size_t(shape.capacity) * dtype_size(q.dtype);
  const size_t k_bytes = aligned(rows_bytes * shape.head_dim_qk), v_bytes = aligned(rows_bytes * shape.head_dim_v);
  const size_t reserved = staged.prefix_bytes() + k_bytes + v_bytes + offsets_bytes(packed, shape.batch);
  auto* workspace = static_cast<unsigned char*>(
      state.workspace.reserve(reserved, std::string(function) + ": rotated q and gathered K/V"));

  // Gathered K and V, then attention() (packed: attention_varlen()) on them. Everything that can
  // throw (the path, a packed call's cu_seqlens, the scores' workspace) is planned before the first
  // kernel; the plan's views lie in the workspace, so plan again if growing it for the scores moved
  // it. A packed call's gathered layout is [batch, capacity, kv_heads, d], its sequences' keys
  // packed at rows b * capacity of [1, kv_heads, batch * capacity, d].
  const int64_t gathered_keys = int64_t(shape.batch) * shape.capacity;
  if (packed && gathered_keys > kMaxExtent) {
    throw NotAvailable(std::string(function) + ": the naive and cublas paths gather batch * capacity = " +
                       std::to_string(gathered_keys) + " keys, above " + std::to_string(kMaxExtent) +
                       "; the fused path reads the cache in place");
  }
  // attention_varlen() reads cu_seqlens_q back anyway and would name what it sees, the gathered keys'
  // offsets among them: read back here first, its entries are named as the caller passed them.
  if (packed && !options.validate_metadata) {
    check_offsets_read_back(function, state, *packed, shape.batch, q.seq());
  }
  const size_t gathered_offset = staged.prefix_bytes();
  // The gathered K (offset 0, head_dim_qk) or V (offset k_bytes, head_dim_v).
  const auto gathered_at = [&](unsigned char* base, size_t offset) {
    unsigned char* data = base + gathered_offset + offset;
    const int d = offset == 0 ? shape.head_dim_qk : shape.head_dim_v;
    if (!packed) return TensorView::bhsd(data, q.dtype, shape.batch, shape.kv_heads, shape.capacity, d);
    return TensorView::bshd(data, q.dtype, 1, shape.kv_heads, gathered_keys, d);
  };
  std::vector<int32_t> key_offsets;
  if (packed) {
    for (int b = 0; b <= shape.batch; ++b) key_offsets.push_back(int32_t(int64_t(b) * shape.capacity));
  }
  const auto plan_at = [&](unsigned char* base) {
    if (!packed) {
      const AttentionCall call = validate_attention(
          function, staged.at(base), gathered_at(base, 0), gathered_at(base, k_bytes), out, attention_options);
      return plan_attention(state, call, options.path, function, reserved);
    }
    // The key offsets go to the device first: planning reads them back with cu_seqlens_q.
    auto* key_offsets_at = reinterpret_cast<int32_t*>(base + gathered_offset + k_bytes + v_bytes);
    state.device->copy(key_offsets_at, key_offsets.data(), key_offsets.size() * sizeof(int32_t), /*async=*/false);
    const AttentionCall call = validate_attention_varlen(
        staged.at(base), gathered_at(base, 0), gathered_at(base, k_bytes), out, packed->cu_seqlens, key_offsets_at,
        shape.batch, seq_q, shape.capacity, attention_options);
    return plan_attention(state, call, options.path, function, reserved);
  };
  PlannedAttention planned = plan_at(workspace);
  auto* sized = static_cast<unsigned char*>(state.workspace.reserve(
      reserved + planned.workspace_bytes(), std::string(function) + ": gathered K/V and scores"));
  if (sized != workspace) planned = plan_at(workspace = sized);

  staged.stage(state, workspace);
  // Gathered in q's dtype; an FP8 cache dequantized on the way.
  const DecodeKernel gather =
      is_fp8(cache.k.dtype)
          ? available(SELFATTN_KERNEL_FOR(
                state.device->backend(),
                kv_gather_fp8_instance(element_of(q.dtype), cache_element_of(cache.k.dtype))))
          : SELFATTN_DECODE_KERNEL(state, kv_gather_instance, q.dtype);
  const TensorView gathered_k = gathered_at(workspace, 0), gathered_v = gathered_at(workspace, k_bytes);
  // [batch, kv_heads, capacity, d], or [batch, capacity, kv_heads, d] (packed): batch b's keys start
  // capacity rows further on.
  const auto stride_batch = [&](const TensorView& gathered) {
    return packed ? shape.capacity * gathered.strides[2] : gathered.strides[0];
  };
  kernels::KvGatherParams params{};
  params.cache = pages_view(cache, shape);
  params.k_out = gathered_k.data;
  params.v_out = gathered_v.data;
  params.k_out_stride_batch = stride_batch(gathered_k);
  params.k_out_stride_head = gathered_k.strides[1];
  params.k_out_stride_row = gathered_k.strides[2];
  params.v_out_stride_batch = stride_batch(gathered_v);
  params.v_out_stride_head = gathered_v.strides[1];
  params.v_out_stride_row = gathered_v.strides[2];
  params.capacity = shape.capacity;
  state.device->launch(gather.kernel, rows_grid(gather, shape.capacity, shape.kv_heads, shape.batch), &params);
  run_planned(state, planned, workspace + reserved);
}

}  // namespace selfattn::detail
