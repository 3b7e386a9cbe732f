// append_kv, attention_with_kv_cache and merge_states (kv_cache.h): validate everything first
// (kv_cache_validation.cpp), then launch the kernels of kernels/decode/.
//
// Attention over a cache: the fused path is the split-KV decode kernel (decode_split_kv, then
// decode_combine when there is more than one split), reading the cache in place. The naive and
// cublas paths run as they do on any padded batch: kv_gather copies each sequence's K/V (from pages
// or a strided contiguous cache) into dense [batch, kv_heads, capacity, d] buffers in the
// workspace, and attention() runs on them with key_lengths = cache.lengths, which gives exactly the
// bottom-right alignment of new rows at the end of each sequence. Nothing reads device metadata on
// the host unless validate_metadata asks, so the calls are graph-safe once the workspace is warm.
//
// Packed calls (append_kv_varlen, attention_with_kv_cache_varlen) run the same kernels with the rows
// of each sequence found through their offsets, ordered first by running_max_offsets (new_rows.cuh);
// on naive and cublas the gathered cache is laid out [batch, capacity, kv_heads, d], which
// attention_varlen() reads as packed keys, sequence b's at rows [b * capacity, (b + 1) * capacity).
#include "selfattn/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "forward/kernel_args.h"
#include "forward/paths.h"
#include "kv_cache/split_heuristic.h"
#include "runtime/backend_kernels.h"
#include "selfattn/attention.h"
#include "selfattn/error.h"
#include "validation/attention_validation.h"
#include "validation/kv_cache_validation.h"

namespace selfattn {
namespace {

using detail::CacheShape;
using detail::ContextState;
using detail::PackedRows;
using kernels::DecodeKernel;

// A decode kernel the backend has, or NotAvailable.
DecodeKernel available(DecodeKernel kernel) {
  if (!kernel.kernel) throw NotAvailable("KV cache: this build has no decode kernels for the backend");
  return kernel;
}
// One decode family's instance (registry.inc: FAMILY(kernels::Element)) for the context's backend.
#define SELFATTN_DECODE_KERNEL(state, family, dtype) \
  available(SELFATTN_KERNEL_FOR((state).device->backend(), family(detail::element_of(dtype))))

kernels::KvPagesView pages_view(const KvCache& cache, const CacheShape& shape) {
  kernels::KvPagesView view{};
  view.k = cache.k.data;
  view.v = cache.v.data;
  view.k_stride_page = cache.k.strides[0];
  view.k_stride_head = cache.k.strides[1];
  view.k_stride_row = cache.k.strides[2];
  view.v_stride_page = cache.v.strides[0];
  view.v_stride_head = cache.v.strides[1];
  view.v_stride_row = cache.v.strides[2];
  view.num_pages = shape.num_pages;
  view.page_size = shape.page_size;
  view.kv_heads = shape.kv_heads;
  view.head_dim = shape.head_dim;
  view.block_table = cache.block_table;
  view.max_pages_per_seq = shape.max_pages_per_seq;
  view.lengths = cache.lengths;
  view.batch_index = cache.batch_index;
  view.batch = shape.batch;
  // Read only by the FP8 instances (validation left them null for other caches).
  view.k_scale = cache.k_scale;
  view.v_scale = cache.v_scale;
  view.scale_count = cache.scale_count;
  return view;
}

kernels::RotaryTables rotary_tables(const std::optional<Rotary>& rotary) {
  if (!rotary) return kernels::RotaryTables{nullptr, nullptr, 0, 0, false, nullptr, 1, kernels::Element::f32};
  return kernels::RotaryTables{rotary->cos,         rotary->sin,       rotary->max_position,
                               rotary->rotary_dim,  rotary->interleaved, rotary->positions,
                               rotary->position_step, detail::element_of(rotary->table_dtype)};
}

kernels::LaunchShape rows_grid(const DecodeKernel& kernel, int64_t rows, int64_t heads, int64_t batch) {
  kernels::LaunchShape shape;
  shape.grid = dim3(unsigned((rows + kernel.rows_per_block - 1) / kernel.rows_per_block), unsigned(heads), unsigned(batch));
  shape.block = dim3(unsigned(kernel.threads));
  return shape;
}

size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

// A call's new rows for the kernels: `view`'s own (dense), or packed through offsets already
// ordered (ordered_offsets) with at most max_seqlen rows per sequence.
kernels::NewRows new_rows(const TensorView& view, const int32_t* ordered_offsets, int max_seqlen) {
  if (ordered_offsets == nullptr) return kernels::NewRows{nullptr, int(view.seq()), int(view.seq())};
  return kernels::NewRows{ordered_offsets, max_seqlen, int(view.seq())};
}

// A packed call's offsets made non-decreasing in `workspace` (offsets_bytes of it), for the kernels.
size_t offsets_bytes(const PackedRows* packed, int batch) {
  return packed ? aligned((size_t(batch) + 1) * sizeof(int32_t)) : 0;
}
const int32_t* ordered_offsets(ContextState& state, const PackedRows* packed, int batch, unsigned char* workspace,
                               const char* function) {
  if (!packed) return nullptr;
  auto* ordered = reinterpret_cast<int32_t*>(workspace);
  detail::order_offsets(state, packed->cu_seqlens, ordered, nullptr, nullptr, batch + 1, function);
  return ordered;
}

// `in` rotated into `out` by rotary_rows: row s of sequence b at lengths[b] - n_b + s, its place
// among the sequence's last n_b tokens (lengths null: at s), unless rotary.positions places it.
void rotate_rows(ContextState& state, const TensorView& in, const TensorView& out, const int32_t* lengths,
                 const kernels::NewRows& rows, int batch, const Rotary& rotary) {
  const DecodeKernel rotate = SELFATTN_DECODE_KERNEL(state, rotary_rows_instance, in.dtype);
  kernels::RotaryRowsParams params{};
  params.in = in.data;
  params.out = out.data;
  params.in_stride_batch = in.strides[0];
  params.in_stride_head = in.strides[1];
  params.in_stride_row = in.strides[2];
  params.out_stride_batch = out.strides[0];
  params.out_stride_head = out.strides[1];
  params.out_stride_row = out.strides[2];
  params.rows = rows;
  params.head_dim = int(in.head_dim());
  params.lengths = lengths;
  params.rotary = rotary_tables(rotary);
  state.device->launch(rotate.kernel, rows_grid(rotate, rows.seq, in.heads(), batch), &params);
}

// ---- split-KV decode (the fused path) ----

constexpr int kKeysPerSplitTile = 32;   // decode_split_kv's key tile
constexpr int kMinTilesPerSplit = 4;    // a split below 128 keys costs more in combine than it saves
constexpr int kMaxAutomaticSplits = 64;

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

DecodeKernel split_kv_kernel(const ContextState& state, DType dtype, int head_dim) {
  return SELFATTN_KERNEL_FOR(state.device->backend(), decode_split_kv_instance(detail::element_of(dtype), head_dim));
}

// The split-KV kernel for this call: the tensor-core one where it has an instance (q f16/bf16,
// head dims 64 and 128) and q's rows are on 16 bytes and K's and V's on 16 (an FP8 cache: 8, its
// 8-value chunks); the SIMT one otherwise. Each over the cache's element.
DecodeKernel split_kv_kernel_for(const ContextState& state, const TensorView& q, const KvCache& cache,
                                 int head_dim) {
  if (is_fp8(cache.k.dtype)) {
    if (q.dtype != DType::f32 && rows_on_16_bytes(q) && rows_on_bytes(cache.k, 8) && rows_on_bytes(cache.v, 8)) {
      const DecodeKernel mma = SELFATTN_KERNEL_FOR(
          state.device->backend(), decode_split_kv_mma_fp8_instance(detail::element_of(q.dtype),
                                                                    detail::cache_element_of(cache.k.dtype), head_dim));
      if (mma.kernel) return mma;
    }
    return available(SELFATTN_KERNEL_FOR(
        state.device->backend(),
        decode_split_kv_fp8_instance(detail::element_of(q.dtype), detail::cache_element_of(cache.k.dtype), head_dim)));
  }
  if (q.dtype != DType::f32 && rows_on_16_bytes(q) && rows_on_16_bytes(cache.k) && rows_on_16_bytes(cache.v)) {
    const DecodeKernel mma =
        SELFATTN_KERNEL_FOR(state.device->backend(), decode_split_kv_mma_instance(detail::element_of(q.dtype), head_dim));
    if (mma.kernel) return mma;
  }
  return split_kv_kernel(state, q.dtype, head_dim);
}

// Whether this call runs the split-KV kernel: path fused, or automatic where the kernel takes the
// head_dim; an explicit fused path that cannot run throws NotAvailable before anything is written.
bool use_split_kv(const ContextState& state, Path path, const CacheShape& shape, const char* function) {
  if (path != Path::fused && path != Path::automatic) return false;
  const DecodeKernel kernel = split_kv_kernel(state, DType::f32, shape.head_dim);
  const char* reason = !kernel.kernel                        ? "this build has no split-KV decode kernel for the backend"
                       : shape.head_dim > kernel.max_head_dim ? "head_dim above 256 needs the naive or cublas path"
                                                              : nullptr;
  if (reason == nullptr) return true;
  if (path == Path::fused) throw NotAvailable(std::string(function) + ": path fused: " + reason);
  return false;
}

// Row blocks per (sequence, kv head) group of up to `seq_q` rows per query head.
int64_t group_row_blocks(const TensorView& q, int64_t seq_q, const CacheShape& shape, const DecodeKernel& kernel) {
  const int64_t group_rows = q.heads() / shape.kv_heads * seq_q;
  return (group_rows + kernel.rows_per_block - 1) / kernel.rows_per_block;
}

}  // namespace

// Enough (sequence, kv head, row block, split) blocks for two waves over the device's SMs (the
// Device reads the count once, so a call never touches the driver; the override is
// options.num_splits), each split at least kMinTilesPerSplit key tiles of the capacity (the
// lengths are device data, not read here).
int detail::choose_splits(int requested, int64_t blocks, int64_t capacity, int multiprocessors) {
  if (requested > 0) return requested;
  const int64_t wanted = (2 * int64_t(std::max(multiprocessors, 1)) + blocks - 1) / std::max<int64_t>(blocks, 1);
  const int64_t tiles = (capacity + kKeysPerSplitTile - 1) / kKeysPerSplitTile;
  const int64_t most = std::max<int64_t>(1, tiles / kMinTilesPerSplit);
  return int(std::clamp<int64_t>(std::min(wanted, most), 1, kMaxAutomaticSplits));
}

namespace {

// grid.x holds splits x row blocks: at most 2^31 - 1 (only a huge seq_q with many splits gets near).
int fit_grid(int splits, int64_t row_blocks) {
  return int(std::max<int64_t>(1, std::min<int64_t>(splits, (int64_t(1) << 31) / std::max<int64_t>(row_blocks, 1) - 1)));
}

size_t partial_bytes(int splits, const TensorView& q) {
  if (splits <= 1) return 0;
  const size_t rows = size_t(q.batch()) * size_t(q.heads()) * size_t(q.seq());
  return aligned(size_t(splits) * rows * size_t(q.head_dim()) * sizeof(float)) + aligned(size_t(splits) * rows * sizeof(float));
}

void run_split_kv(ContextState& state, const DecodeKernel& kernel, const TensorView& q, const kernels::NewRows& q_rows,
                  const KvCache& cache, const CacheShape& shape, const TensorView& out,
                  const KvAttentionOptions& options, float scale, const kernels::ScoreMods& mods, int splits,
                  unsigned char* work) {
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
  params.partial_lse = splits > 1 ? reinterpret_cast<float*>(
                                        work + aligned(size_t(splits) * size_t(params.rows) * size_t(q.head_dim()) * sizeof(float)))
                                  : nullptr;
  params.q_rows = q_rows;
  params.heads = int(q.heads());
  params.head_dim = shape.head_dim;
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
  merge.head_dim = params.head_dim;
  merge.num_splits = splits;
  kernels::LaunchShape combine_launch;
  // At most state.decode_combine_max_blocks (2^20) blocks: decode_combine strides over the rest.
  combine_launch.grid = dim3(unsigned(std::min<int64_t>(params.rows, std::max<int64_t>(state.decode_combine_max_blocks, 1))));
  combine_launch.block = dim3(unsigned(combine.threads));
  combine_launch.dynamic_smem_bytes = combine.smem_bytes;
  state.device->launch(combine.kernel, combine_launch, &merge);
}

}  // namespace

namespace {

// append_kv and append_kv_varlen (packed: the packed call's offsets, else null).
void append_rows(Context& ctx, const KvCache& cache, const TensorView& k_new, const TensorView& v_new,
                 const PackedRows* packed, const AppendKvOptions& options) {
  const char* function = packed ? "append_kv_varlen" : "append_kv";
  ContextState& state = ctx.state();
  const CacheShape shape = detail::validate_append_kv(cache, k_new, v_new, options, packed);
  if (options.validate_metadata) {
    detail::check_metadata(function, state, cache, shape, int(k_new.seq()), packed, k_new.seq(), /*appending=*/true);
  }
  if (shape.batch == 0) return;
  // With no element to copy (no token, no kv head or head_dim 0), updated_lengths still advances by
  // each sequence's tokens: one block per sequence writes it, with a view of no columns so that it
  // copies nothing.
  const int seq_new = packed ? packed->max_seqlen : int(k_new.seq());
  const bool nothing_to_copy = seq_new == 0 || k_new.seq() == 0 || shape.kv_heads == 0 || shape.head_dim == 0;
  if (nothing_to_copy && options.updated_lengths == nullptr) return;
  // An FP8 cache quantizes k_new's element on the way; any other is k_new's own.
  const DecodeKernel kernel =
      is_fp8(cache.k.dtype)
          ? available(SELFATTN_KERNEL_FOR(
                state.device->backend(),
                kv_append_fp8_instance(detail::element_of(k_new.dtype), detail::cache_element_of(cache.k.dtype))))
          : SELFATTN_DECODE_KERNEL(state, kv_append_instance, cache.k.dtype);
  auto* workspace = static_cast<unsigned char*>(
      packed ? state.workspace.reserve(offsets_bytes(packed, shape.batch), std::string(function) + ": ordered offsets")
             : nullptr);

  kernels::KvAppendParams params{};
  params.cache = pages_view(cache, shape);
  if (nothing_to_copy) params.cache.head_dim = 0;
  params.k_new = k_new.data;
  params.v_new = v_new.data;
  params.new_stride_batch_k = k_new.strides[0];
  params.new_stride_head_k = k_new.strides[1];
  params.new_stride_row_k = k_new.strides[2];
  params.new_stride_batch_v = v_new.strides[0];
  params.new_stride_head_v = v_new.strides[1];
  params.new_stride_row_v = v_new.strides[2];
  params.rows = new_rows(k_new, ordered_offsets(state, packed, shape.batch, workspace, function), seq_new);
  params.rotary = rotary_tables(options.rotary);
  params.updated_lengths = options.updated_lengths;
  const int64_t rows = nothing_to_copy ? 1 : seq_new;
  const int64_t heads = nothing_to_copy ? 1 : shape.kv_heads;
  state.device->launch(kernel.kernel, rows_grid(kernel, rows, heads, shape.batch), &params);
}

// attention_with_kv_cache and its packed twin (packed: the packed call's offsets, else null).
void attend_cache(Context& ctx, const TensorView& q, const PackedRows* packed, const KvCache& cache,
                  const TensorView& out, const KvAttentionOptions& options) {
  const char* function = packed ? "attention_with_kv_cache_varlen" : "attention_with_kv_cache";
  ContextState& state = ctx.state();
  detail::AttentionCall score_mods;
  const CacheShape shape = detail::validate_attention_with_kv_cache(q, cache, out, options, score_mods, packed);
  if (options.validate_metadata) detail::check_metadata(function, state, cache, shape, 0, packed, q.seq());
  // Query rows per sequence: every sequence's (dense), at most (packed).
  const int seq_q = packed ? packed->max_seqlen : int(q.seq());
  if (q.numel() == 0 || seq_q == 0 || shape.batch == 0) return;  // no query row to write

  // The same call as attention() (attention_varlen() when packed) over the gathered cache
  // (kv_cache_validation.h), modifiers included.
  const AttentionOptions attention_options = detail::attention_options_of(options, cache);
  if (shape.capacity == 0 || shape.kv_heads == 0) {
    // No cache slot at all: attention() writes zeros and -inf itself (packed: on every row, as
    // attention_varlen() does without keys). With no key there is nothing to bias (and the bias's
    // key extent, the capacity, may not be 0).
    TensorView empty = TensorView::bhsd(nullptr, q.dtype, q.batch(), shape.kv_heads, 0, q.head_dim());
    AttentionOptions no_keys = attention_options;
    no_keys.bias.reset();
    if (packed) {
      no_keys.key_lengths = no_keys.key_start = no_keys.q_offset = nullptr;  // one entry per sequence: unread
      attention_varlen(ctx, q, empty, empty, out, packed->cu_seqlens, packed->cu_seqlens, shape.batch, seq_q, 0,
                       no_keys);
    } else {
      attention(ctx, q, empty, empty, out, no_keys);
    }
    return;
  }

  // The fused path is the split-KV decode kernel, read straight from the cache; the others gather.
  const bool split_kv = use_split_kv(state, options.path, shape, function);
  const DecodeKernel split_kernel = split_kv ? split_kv_kernel_for(state, q, cache, shape.head_dim) : DecodeKernel{};
  const int64_t row_blocks = split_kv ? group_row_blocks(q, seq_q, shape, split_kernel) : 0;
  const int splits = split_kv ? fit_grid(detail::choose_splits(options.num_splits, int64_t(shape.batch) * shape.kv_heads * row_blocks,
                                                               shape.capacity, state.device->multiprocessor_count()),
                                         row_blocks)
                              : 0;
  // Workspace: a packed call's ordered offsets, the rotated q when asked, then the split-KV partials
  // or the gathered K and V (and, on naive/cublas, a packed call's key offsets, then the attention
  // step's scores after them, as self_attention() does).
  const size_t element = dtype_size(q.dtype);
  const size_t order_bytes = offsets_bytes(packed, shape.batch);
  const size_t q_bytes = options.rotary ? aligned(size_t(q.numel()) * element) : 0;
  const size_t kv_bytes = aligned(size_t(shape.batch) * shape.kv_heads * size_t(shape.capacity) * shape.head_dim * element);
  const size_t key_offsets_bytes = split_kv ? 0 : offsets_bytes(packed, shape.batch);
  const size_t work_bytes = split_kv ? partial_bytes(splits, q) : 2 * kv_bytes + key_offsets_bytes;
  const size_t reserved = order_bytes + q_bytes + work_bytes;
  const std::string what = std::string(function) + ": rotated q, split partials or gathered K/V";
  auto* workspace = static_cast<unsigned char*>(state.workspace.reserve(reserved, what));
  const auto rotated_q_at = [&](unsigned char* base) {
    return options.rotary ? TensorView::bhsd(base + order_bytes, q.dtype, q.batch(), q.heads(), q.seq(), q.head_dim())
                          : q;
  };
  // Rotates q into the workspace at `base` when asked, reading the offsets ordered there.
  const auto rotate_query = [&](unsigned char* base, const kernels::NewRows& q_rows) {
    if (options.rotary) rotate_rows(state, q, rotated_q_at(base), cache.lengths, q_rows, shape.batch, *options.rotary);
  };

  if (split_kv) {
    const kernels::NewRows q_rows =
        new_rows(q, ordered_offsets(state, packed, shape.batch, workspace, function), seq_q);
    rotate_query(workspace, q_rows);
    const float scale = options.scale ? *options.scale : 1.0f / std::sqrt(float(shape.head_dim));
    run_split_kv(state, split_kernel, rotated_q_at(workspace), q_rows, cache, shape, out, options, scale,
                 detail::score_mods_of(score_mods), splits, workspace + order_bytes + q_bytes);
    return;
  }

  // Gathered K and V, then attention() (packed: attention_varlen()) on them. Everything that can
  // throw (the path, a packed call's cu_seqlens, the scores' workspace) is planned before the first
  // kernel; the plan's views lie in the workspace, so plan again if growing it for the scores moved
  // it. A packed call's gathered layout is [batch, capacity, kv_heads, d], its sequences' keys
  // packed at rows b * capacity of [1, kv_heads, batch * capacity, d].
  const int64_t gathered_keys = int64_t(shape.batch) * shape.capacity;
  if (packed && gathered_keys > detail::kMaxExtent) {
    throw NotAvailable(std::string(function) + ": the naive and cublas paths gather batch * capacity = " +
                       std::to_string(gathered_keys) + " keys, above " + std::to_string(detail::kMaxExtent) +
                       "; the fused path reads the cache in place");
  }
  // attention_varlen() reads cu_seqlens_q back anyway and would name what it sees, the gathered keys'
  // offsets among them: read back here first, its entries are named as the caller passed them.
  if (packed && !options.validate_metadata) {
    detail::check_offsets_read_back(function, state, *packed, shape.batch, q.seq());
  }
  const size_t gathered_offset = order_bytes + q_bytes;
  const auto gathered_at = [&](unsigned char* base, size_t offset) {
    unsigned char* data = base + gathered_offset + offset;
    if (!packed) return TensorView::bhsd(data, q.dtype, shape.batch, shape.kv_heads, shape.capacity, shape.head_dim);
    return TensorView::bshd(data, q.dtype, 1, shape.kv_heads, gathered_keys, shape.head_dim);
  };
  std::vector<int32_t> key_offsets;
  if (packed) {
    for (int b = 0; b <= shape.batch; ++b) key_offsets.push_back(int32_t(int64_t(b) * shape.capacity));
  }
  const auto plan_at = [&](unsigned char* base) {
    if (!packed) {
      const detail::AttentionCall call = detail::validate_attention(
          function, rotated_q_at(base), gathered_at(base, 0), gathered_at(base, kv_bytes), out, attention_options);
      return detail::plan_attention(state, call, options.path, function, reserved);
    }
    // The key offsets go to the device first: planning reads them back with cu_seqlens_q.
    auto* key_offsets_at = reinterpret_cast<int32_t*>(base + gathered_offset + 2 * kv_bytes);
    state.device->copy(key_offsets_at, key_offsets.data(), key_offsets.size() * sizeof(int32_t), /*async=*/false);
    const detail::AttentionCall call = detail::validate_attention_varlen(
        rotated_q_at(base), gathered_at(base, 0), gathered_at(base, kv_bytes), out, packed->cu_seqlens, key_offsets_at,
        shape.batch, seq_q, shape.capacity, attention_options);
    return detail::plan_attention(state, call, options.path, function, reserved);
  };
  detail::PlannedAttention planned = plan_at(workspace);
  auto* sized = static_cast<unsigned char*>(state.workspace.reserve(
      reserved + planned.workspace_bytes(), std::string(function) + ": gathered K/V and scores"));
  if (sized != workspace) planned = plan_at(workspace = sized);

  rotate_query(workspace, new_rows(q, ordered_offsets(state, packed, shape.batch, workspace, function), seq_q));
  // Gathered in q's dtype; an FP8 cache dequantized on the way.
  const DecodeKernel gather =
      is_fp8(cache.k.dtype)
          ? available(SELFATTN_KERNEL_FOR(
                state.device->backend(),
                kv_gather_fp8_instance(detail::element_of(q.dtype), detail::cache_element_of(cache.k.dtype))))
          : SELFATTN_DECODE_KERNEL(state, kv_gather_instance, q.dtype);
  const TensorView gathered_k = gathered_at(workspace, 0);
  // [batch, kv_heads, capacity, d], or [batch, capacity, kv_heads, d] (packed): batch b's keys start
  // capacity rows further on.
  const int64_t gathered_stride_batch = packed ? shape.capacity * gathered_k.strides[2] : gathered_k.strides[0];
  kernels::KvGatherParams params{};
  params.cache = pages_view(cache, shape);
  params.k_out = workspace + gathered_offset;
  params.v_out = workspace + gathered_offset + kv_bytes;
  params.out_stride_batch = gathered_stride_batch;
  params.out_stride_head = gathered_k.strides[1];
  params.out_stride_row = gathered_k.strides[2];
  params.capacity = shape.capacity;
  state.device->launch(gather.kernel, rows_grid(gather, shape.capacity, shape.kv_heads, shape.batch), &params);
  detail::run_planned(state, planned, workspace + reserved);
}

}  // namespace

void append_kv(Context& ctx, const KvCache& cache, const TensorView& k_new, const TensorView& v_new,
               const AppendKvOptions& options) {
  append_rows(ctx, cache, k_new, v_new, nullptr, options);
}

void append_kv_varlen(Context& ctx, const KvCache& cache, const TensorView& k_new, const TensorView& v_new,
                      const int32_t* cu_seqlens_new, int max_seqlen_new, const AppendKvOptions& options) {
  const PackedRows packed{cu_seqlens_new, max_seqlen_new};
  append_rows(ctx, cache, k_new, v_new, &packed, options);
}

void attention_with_kv_cache(Context& ctx, const TensorView& q, const KvCache& cache, const TensorView& out,
                             const KvAttentionOptions& options) {
  attend_cache(ctx, q, nullptr, cache, out, options);
}

void attention_with_kv_cache_varlen(Context& ctx, const TensorView& q, const int32_t* cu_seqlens_q, int max_seqlen_q,
                                    const KvCache& cache, const TensorView& out, const KvAttentionOptions& options) {
  const PackedRows packed{cu_seqlens_q, max_seqlen_q};
  attend_cache(ctx, q, &packed, cache, out, options);
}

void rotary_embedding(Context& ctx, const TensorView& x, const TensorView& out, const Rotary& rotary) {
  ContextState& state = ctx.state();
  detail::validate_rotary_embedding(x, out, rotary);
  if (x.numel() == 0) return;
  // positions[b] + step s, or s
  rotate_rows(state, x, out, /*lengths=*/nullptr, new_rows(x, nullptr, 0), int(x.batch()), rotary);
}

void merge_states(Context& ctx, const TensorView& out_a, const float* lse_a, const TensorView& out_b,
                  const float* lse_b, const TensorView& out, float* lse_out) {
  ContextState& state = ctx.state();
  detail::validate_merge_states(out_a, lse_a, out_b, lse_b, out, lse_out);
  const int64_t rows = out_a.batch() * out_a.heads() * out_a.seq();
  if (rows == 0) return;
  const DecodeKernel kernel = SELFATTN_DECODE_KERNEL(state, merge_states_instance, out_a.dtype);
  kernels::MergeStatesParams params{};
  params.out_a = out_a.data;
  params.out_b = out_b.data;
  params.out = out.data;
  params.a_stride_batch = out_a.strides[0];
  params.a_stride_head = out_a.strides[1];
  params.a_stride_row = out_a.strides[2];
  params.b_stride_batch = out_b.strides[0];
  params.b_stride_head = out_b.strides[1];
  params.b_stride_row = out_b.strides[2];
  params.o_stride_batch = out.strides[0];
  params.o_stride_head = out.strides[1];
  params.o_stride_row = out.strides[2];
  params.lse_a = lse_a;
  params.lse_b = lse_b;
  params.lse_out = lse_out;
  params.heads = int(out_a.heads());
  params.seq = int(out_a.seq());
  params.head_dim = int(out_a.head_dim());
  params.rows = rows;
  kernels::LaunchShape shape;
  shape.grid = dim3(unsigned((rows + kernel.threads - 1) / kernel.threads));
  shape.block = dim3(unsigned(kernel.threads));
  state.device->launch(kernel.kernel, shape, &params);
}

void cu_seqlens_from_lengths(Context& ctx, const int32_t* lengths, int batch, int32_t* cu_seqlens) {
  ContextState& state = ctx.state();
  detail::validate_cu_seqlens_from_lengths(lengths, batch, cu_seqlens);
  // The scratch first: a WorkspaceTooSmall must come before cu_seqlens[0] is written.
  const size_t scratch_bytes = batch > 0 ? state.device->scan_scratch_bytes(batch) : 0;
  void* scratch = scratch_bytes > 0 ? state.workspace.reserve(scratch_bytes, "cu_seqlens_from_lengths: the scan's scratch") : nullptr;
  state.device->fill(cu_seqlens, 0, sizeof(int32_t));  // cu_seqlens[0] = 0
  if (batch == 0) return;
  state.device->inclusive_sum_int32(lengths, cu_seqlens + 1, batch, scratch, scratch_bytes);
}

}  // namespace selfattn
