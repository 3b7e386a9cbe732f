// The split-KV decode, the fused path of attention over a KV cache (split_kv_runner.h): which
// kernel, how many splits, and the launches of decode_split_kv and decode_combine.
#include "kv_cache/split_kv_runner.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "kv_cache/split_heuristic.h"
#include "selfattn/error.h"

namespace selfattn::detail {
namespace {

constexpr int kKeysPerSplitTile = 32;   // decode_split_kv's key tile
constexpr int kMinTilesPerSplit = 4;    // a split below 128 keys costs more in combine than it saves
constexpr int kMaxAutomaticSplits = 64;
// Partials may add at most 1 / kPartialShare to the cache's bytes (one wave permitting): the
// decode is DRAM-bound, and extra bytes are extra time. Wide V and many rows per block make them
// count: DeepSeek's latent cache at 16 heads writes and reads 16 x 513 fp32 per split against 1152
// bytes per key, 23% of 4096 keys' bytes at the two waves' 17 splits.
constexpr int kPartialShare = 8;

// Whether every row of the view starts on `bytes` bytes and holds whole chunks of that size (the
// split-KV kernels then stage K/V with 16-byte loads, or the tensor-core kernel an FP8 cache's
// 8-value chunks with 8-byte loads).
bool rows_on_bytes(const TensorView& view, int64_t bytes) {
  const int64_t element = int64_t(dtype_size(view.dtype));
  if (reinterpret_cast<uintptr_t>(view.data) % bytes != 0 || (view.head_dim() * element) % bytes != 0) return false;
  for (int i = 0; i < 3; ++i)
    if ((view.strides[i] * element) % bytes != 0) return false;
  return true;
}
bool rows_on_16_bytes(const TensorView& view) { return rows_on_bytes(view, 16); }

DecodeKernel split_kv_kernel(const ContextState& state, DType dtype, const CacheShape& shape) {
  return SELFATTN_KERNEL_FOR(state.device->backend(),
                             decode_split_kv_instance(detail::element_of(dtype), shape.head_dim_qk, shape.head_dim_v));
}

// The split-KV kernel for this call: the tensor-core one where it has an instance (q f16/bf16,
// head dims 64 and 128, K's and V's alike) and q's rows are on 16 bytes and K's and V's on 16 (an
// FP8 cache: 8, its 8-value chunks); the SIMT one otherwise. Each over the cache's element.
DecodeKernel split_kv_kernel_for(const ContextState& state, const TensorView& q, const KvCache& cache,
                                 const CacheShape& shape) {
  const int head_dim = shape.head_dim_qk;
  const bool one_head_dim = shape.head_dim_v == head_dim;
  if (is_fp8(cache.k.dtype)) {
    if (one_head_dim && q.dtype != DType::f32 && rows_on_16_bytes(q) && rows_on_bytes(cache.k, 8) &&
        rows_on_bytes(cache.v, 8)) {
      const DecodeKernel mma = SELFATTN_KERNEL_FOR(
          state.device->backend(), decode_split_kv_mma_fp8_instance(detail::element_of(q.dtype),
                                                                    detail::cache_element_of(cache.k.dtype), head_dim));
      if (mma.kernel) return mma;
    }
    return available(SELFATTN_KERNEL_FOR(state.device->backend(),
                                         decode_split_kv_fp8_instance(detail::element_of(q.dtype),
                                                                      detail::cache_element_of(cache.k.dtype),
                                                                      head_dim, shape.head_dim_v)));
  }
  const bool rows_on_16 = rows_on_16_bytes(q) && rows_on_16_bytes(cache.k) && rows_on_16_bytes(cache.v);
  if (one_head_dim && q.dtype != DType::f32 && rows_on_16) {
    const DecodeKernel mma =
        SELFATTN_KERNEL_FOR(state.device->backend(), decode_split_kv_mma_instance(detail::element_of(q.dtype), head_dim));
    if (mma.kernel) return mma;
  }
  return split_kv_kernel(state, q.dtype, shape);
}

// The latent kernel (decode_latent_mma.cuh) where it takes the call: V a view of K's leading
// columns at head dims (576, 512), q f16/bf16 on 16 bytes, K's rows on 16 bytes (an FP8 cache: 8);
// empty otherwise.
DecodeKernel latent_kernel_for(const ContextState& state, const TensorView& q, const KvCache& cache,
                               const CacheShape& shape) {
  if (!shape.v_in_k || q.dtype == DType::f32 || !rows_on_16_bytes(q)) return {};
  if (is_fp8(cache.k.dtype)) {
    if (!rows_on_bytes(cache.k, 8)) return {};
    return SELFATTN_KERNEL_FOR(state.device->backend(),
                               decode_latent_mma_fp8_instance(detail::element_of(q.dtype),
                                                              detail::cache_element_of(cache.k.dtype),
                                                              shape.head_dim_qk, shape.head_dim_v));
  }
  if (!rows_on_16_bytes(cache.k)) return {};
  return SELFATTN_KERNEL_FOR(state.device->backend(), decode_latent_mma_instance(detail::element_of(q.dtype),
                                                                                 shape.head_dim_qk, shape.head_dim_v));
}

// Whether this call runs the SIMT or tensor-core split-KV kernel: path fused, or automatic where
// the kernel takes the head dims; an explicit fused path that cannot run throws NotAvailable
// before anything is written.
bool use_split_kv(const ContextState& state, Path path, const CacheShape& shape, const char* function) {
  if (path != Path::fused && path != Path::automatic) return false;
  const DecodeKernel kernel = split_kv_kernel(state, DType::f32, shape);
  std::string reason;
  if (!kernel.kernel) {
    reason = "this build has no split-KV decode kernel for the backend";
  } else if (shape.head_dim_qk > kernel.max_head_dim || shape.head_dim_v > kernel.max_head_dim) {
    reason = "the split-KV kernels take head_dim and head_dim_v up to " + std::to_string(kernel.max_head_dim) +
             ", got (" + std::to_string(shape.head_dim_qk) + ", " + std::to_string(shape.head_dim_v) +
             "), and the latent kernel (576, 512) with V a view of K's leading columns, q f16 or bf16 (over "
             "an FP8 cache: bf16 q, e4m3) and rows on 16 bytes (FP8: 8); the naive and cublas paths take any";
  }
  if (reason.empty()) return true;
  if (path == Path::fused) throw NotAvailable(std::string(function) + ": path fused: " + reason);
  return false;
}

// Row blocks per (sequence, kv head) group of up to `seq_q` rows per query head.
int64_t group_row_blocks(const TensorView& q, int64_t seq_q, const CacheShape& shape, const DecodeKernel& kernel) {
  const int64_t group_rows = q.heads() / shape.kv_heads * seq_q;
  return (group_rows + kernel.rows_per_block - 1) / kernel.rows_per_block;
}

// grid.x holds splits x row blocks: at most 2^31 - 1 (only a huge seq_q with many splits gets near).
int fit_grid(int splits, int64_t row_blocks) {
  return int(std::max<int64_t>(1, std::min<int64_t>(splits, (int64_t(1) << 31) / std::max<int64_t>(row_blocks, 1) - 1)));
}

// The splits' partial O (out's head_dim_v columns) and LSE.
size_t partial_out_bytes(int splits, const TensorView& q, int head_dim_v) {
  const size_t rows = size_t(q.batch()) * size_t(q.heads()) * size_t(q.seq());
  return aligned(size_t(splits) * rows * size_t(head_dim_v) * sizeof(float));
}
size_t partial_bytes(int splits, const TensorView& q, int head_dim_v) {
  if (splits <= 1) return 0;
  const size_t rows = size_t(q.batch()) * size_t(q.heads()) * size_t(q.seq());
  return partial_out_bytes(splits, q, head_dim_v) + aligned(size_t(splits) * rows * sizeof(float));
}

}  // namespace

// Enough (sequence, kv head, row block, split) blocks for two waves over the device's SMs (the
// Device reads the count once, so a call never touches the driver; the override is
// options.num_splits), each split at least kMinTilesPerSplit key tiles of the capacity (the
// lengths are device data, not read here).
int choose_splits(int requested, int64_t blocks, int64_t capacity, int multiprocessors, SplitBytes bytes) {
  if (requested > 0) return requested;
  const int64_t sms = std::max(multiprocessors, 1);
  blocks = std::max<int64_t>(blocks, 1);
  const int64_t wanted = (2 * sms + blocks - 1) / blocks;
  const int64_t tiles = (capacity + kKeysPerSplitTile - 1) / kKeysPerSplitTile;
  int64_t most = std::max<int64_t>(1, tiles / kMinTilesPerSplit);
  if (bytes.cache > 0 && bytes.partials_per_split > 0) {
    const int64_t within_share = bytes.cache / (kPartialShare * bytes.partials_per_split);
    const int64_t one_wave = (sms + blocks - 1) / blocks;
    most = std::min(most, std::max(within_share, one_wave));
  }
  return int(std::clamp<int64_t>(std::min(wanted, most), 1, kMaxAutomaticSplits));
}

std::optional<SplitKvPlan> plan_split_kv(const ContextState& state, const TensorView& q, int seq_q, const KvCache& cache,
                                         const CacheShape& shape, const KvAttentionOptions& options,
                                         const char* function) {
  if (options.path != Path::fused && options.path != Path::automatic) return std::nullopt;
  const DecodeKernel latent = latent_kernel_for(state, q, cache, shape);
  if (!latent.kernel && !use_split_kv(state, options.path, shape, function)) return std::nullopt;
  SplitKvPlan plan;
  plan.kernel = latent.kernel ? latent : split_kv_kernel_for(state, q, cache, shape);
  const int64_t row_blocks = group_row_blocks(q, seq_q, shape, plan.kernel);
  // Per block: the cache's K and V bytes (a latent cache's V is read with K) and one split's
  // partials, written and read back, for the block's rows.
  SplitBytes bytes;
  const int64_t row_bytes = int64_t(shape.head_dim_qk) * int64_t(dtype_size(cache.k.dtype)) +
                            (shape.v_in_k ? 0 : int64_t(shape.head_dim_v) * int64_t(dtype_size(cache.v.dtype)));
  bytes.cache = int64_t(shape.capacity) * row_bytes;
  const int64_t block_rows = std::min<int64_t>(plan.kernel.rows_per_block, int64_t(q.heads() / shape.kv_heads) * seq_q);
  bytes.partials_per_split = 2 * block_rows * (shape.head_dim_v + 1) * int64_t(sizeof(float));
  plan.splits = fit_grid(choose_splits(options.num_splits, int64_t(shape.batch) * shape.kv_heads * row_blocks,
                                       shape.capacity, state.device->multiprocessor_count(), bytes),
                         row_blocks);
  plan.workspace_bytes = partial_bytes(plan.splits, q, shape.head_dim_v);
  return plan;
}

void run_split_kv(ContextState& state, const SplitKvPlan& plan, const TensorView& q, const kernels::NewRows& q_rows,
                  const KvCache& cache, const CacheShape& shape, const TensorView& out,
                  const KvAttentionOptions& options, const kernels::ScoreMods& mods, unsigned char* work) {
  const DecodeKernel& kernel = plan.kernel;
  const int splits = plan.splits;
  const float scale = options.scale ? *options.scale : 1.0f / std::sqrt(float(shape.head_dim_qk));
  float* lse = options.lse;
  kernels::DecodeSplitKvParams params{};
  params.cache = pages_view(cache, shape);
  params.q = q.data;
  params.out = out.data;
  params.q_stride_batch = q.strides[0];
  params.q_stride_head = q.strides[1];
  params.q_stride_row = q.strides[2];
  params.out_stride_batch = out.strides[0];
  params.out_stride_head = out.strides[1];
  params.out_stride_row = out.strides[2];
  params.lse = lse;
  params.rows = q.batch() * q.heads() * q.seq();
  params.partial_out = splits > 1 ? reinterpret_cast<float*>(work) : nullptr;
  params.partial_lse =
      splits > 1 ? reinterpret_cast<float*>(work + partial_out_bytes(splits, q, shape.head_dim_v)) : nullptr;
  params.q_rows = q_rows;
  params.heads = int(q.heads());
  params.head_dim = shape.head_dim_qk;  // V's: params.cache.head_dim_v
  params.heads_per_kv = int(q.heads()) / shape.kv_heads;
  params.num_splits = splits;
  params.row_blocks = int(group_row_blocks(q, q_rows.seq, shape, kernel));
  params.scale = scale;
  params.scale_log2 = float(double(scale) * 1.4426950408889634);
  params.mods = mods;
  params.causal = detail::causal_mask_of(options.causal);
  params.key_start = options.key_start;
  params.q_offset = options.q_offset;
  params.vector_loads = rows_on_16_bytes(cache.k) && rows_on_16_bytes(cache.v);
  kernels::LaunchShape launch;
  launch.grid = dim3(unsigned(int64_t(splits) * params.row_blocks), unsigned(shape.kv_heads), unsigned(shape.batch));
  launch.block = dim3(unsigned(kernel.threads));
  launch.dynamic_smem_bytes = kernel.smem_bytes;
  state.device->launch(kernel.kernel, launch, &params);
  if (splits == 1) return;  // the block wrote out and lse itself

  const DecodeKernel combine = SELFATTN_DECODE_KERNEL(state, decode_combine_instance, q.dtype);
  kernels::DecodeCombineParams merge{};
  merge.partial_out = params.partial_out;
  merge.partial_lse = params.partial_lse;
  merge.out = out.data;
  merge.out_stride_batch = out.strides[0];
  merge.out_stride_head = out.strides[1];
  merge.out_stride_row = out.strides[2];
  merge.lse = lse;
  merge.sinks = params.mods.sinks;
  merge.rows = params.rows;
  merge.q_rows = q_rows;
  merge.batch = shape.batch;
  merge.heads = params.heads;
  merge.head_dim = shape.head_dim_v;
  merge.num_splits = splits;
  kernels::LaunchShape combine_launch;
  // At most state.decode_combine_max_blocks (2^20) blocks: decode_combine strides over the rest.
  combine_launch.grid = dim3(unsigned(std::min<int64_t>(params.rows, std::max<int64_t>(state.decode_combine_max_blocks, 1))));
  combine_launch.block = dim3(unsigned(combine.threads));
  combine_launch.dynamic_smem_bytes = combine.smem_bytes;
  state.device->launch(combine.kernel, combine_launch, &merge);
}

}  // namespace selfattn::detail
