// append_kv, attention_with_kv_cache and merge_states (kv_cache.h): validate everything first
// (kv_cache_validation.cpp), then launch the kernels of kernels/decode/.
//
// Attention over a cache runs one of two runners: the fused path is split_kv_runner.h's (the
// split-KV decode kernel reading the cache in place, then decode_combine), the naive and cublas
// paths gathered_runner.h's (each sequence's K/V gathered into the workspace, then attention() on
// them). Both stage q the same way (cache_launch.h: StagedQuery). Nothing reads device metadata on
// the host unless validate_metadata asks, so the calls are graph-safe once the workspace is warm.
//
// Packed calls (append_kv_varlen, attention_with_kv_cache_varlen) run the same kernels with the rows
// of each sequence found through their offsets, ordered first by running_max_offsets (new_rows.cuh).
#include "selfattn/kv_cache.h"

#include <optional>
#include <string>

#include "forward/paths.h"
#include "kv_cache/cache_launch.h"
#include "kv_cache/gathered_runner.h"
#include "kv_cache/split_kv_runner.h"
#include "selfattn/error.h"

namespace selfattn {
namespace {

using detail::CacheShape;
using detail::ContextState;
using detail::PackedRows;
using detail::available;
using detail::new_rows;
using detail::offsets_bytes;
using detail::ordered_offsets;
using detail::pages_view;
using detail::rotary_tables;
using detail::rotate_rows;
using detail::rows_grid;
using kernels::DecodeKernel;

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
  const bool nothing_to_copy =
      seq_new == 0 || k_new.seq() == 0 || shape.kv_heads == 0 || (shape.head_dim_qk == 0 && shape.head_dim_v == 0);
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
  if (nothing_to_copy) params.cache.head_dim = params.cache.head_dim_v = 0;
  params.k_new = k_new.data;
  params.v_new = shape.v_in_k ? nullptr : v_new.data;  // V's rows are among K's: written with them
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

  if (shape.capacity == 0) {
    // No cache slot at all: the call attention() makes of a call without keys, already validated:
    // out 0 and each LSE row -inf or its head's sink (packed: every row of q, as attention_varlen()
    // writes them without keys). kv_heads is >= 1 here (q has rows; validation).
    detail::AttentionCall no_keys = score_mods;  // its validated sinks
    no_keys.q = q;
    no_keys.out = out;
    no_keys.dtype = q.dtype;
    no_keys.batch = shape.batch;
    no_keys.heads = int(q.heads());
    no_keys.kv_heads = shape.kv_heads;
    no_keys.seq_q = seq_q;
    no_keys.seq_k = 0;
    no_keys.lse = options.lse;
    if (packed) no_keys.cu_seqlens_q = no_keys.cu_seqlens_k = packed->cu_seqlens;
    detail::run_without_keys(state, no_keys);
    return;
  }

  // The fused path is the split-KV decode kernel, read straight from the cache; the others gather.
  const std::optional<detail::SplitKvPlan> split_kv =
      detail::plan_split_kv(state, q, seq_q, cache, shape, options, function);
  const detail::StagedQuery staged(q, packed, cache, shape, options.rotary, seq_q, function);
  if (!split_kv) {
    detail::attend_gathered(state, staged, out, options);
    return;
  }
  auto* workspace = static_cast<unsigned char*>(state.workspace.reserve(
      staged.prefix_bytes() + split_kv->workspace_bytes, std::string(function) + ": rotated q and split partials"));
  const kernels::NewRows q_rows = staged.stage(state, workspace);
  detail::run_split_kv(state, *split_kv, staged.at(workspace), q_rows, cache, shape, out, options,
                       detail::score_mods_of(score_mods), workspace + staged.prefix_bytes());
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
