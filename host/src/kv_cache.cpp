// append_kv, attention_with_kv_cache and merge_states (kv_cache.h): validate everything first
// (kv_cache_validation.cpp), then launch the kernels of kernels/decode/.
//
// Attention over a cache runs on the existing paths: kv_gather copies each sequence's K/V (from
// pages or a strided contiguous cache) into dense [batch, kv_heads, capacity, d] buffers in the
// workspace, and attention() runs on them with key_lengths = cache.lengths, which gives exactly the
// bottom-right alignment of new rows at the end of each sequence. Nothing reads device metadata on
// the host unless validate_metadata asks, so the calls are graph-safe once the workspace is warm.
#include <algorithm>
#include <string>

#include "kernel_args.h"
#include "kernels/registry.h"
#include "kv_cache_validation.h"
#include "selfattn/attention.h"
#include "selfattn/error.h"
#include "selfattn/kv_cache.h"

namespace selfattn {
namespace {

using detail::CacheShape;
using detail::ContextState;
using kernels::DecodeKernel;
using kernels::Element;

// The instance of one decode kernel family for the context's backend.
DecodeKernel decode_kernel(const ContextState& ctx, DecodeKernel (*sim)(Element), DecodeKernel (*cuda)(Element),
                           DType dtype) {
  const DecodeKernel kernel = ctx.device->backend() == Backend::sim ? sim(detail::element_of(dtype))
                              : cuda != nullptr                     ? cuda(detail::element_of(dtype))
                                                                    : DecodeKernel{};
  if (!kernel.kernel) throw NotAvailable("KV cache: this build has no decode kernels for the backend");
  return kernel;
}

#if SELFATTN_HAVE_CUDA
#define SELFATTN_DECODE_KERNEL(ctx, family, dtype) \
  decode_kernel(ctx, &kernels::sim_target::family, &kernels::cuda_target::family, dtype)
#else
#define SELFATTN_DECODE_KERNEL(ctx, family, dtype) decode_kernel(ctx, &kernels::sim_target::family, nullptr, dtype)
#endif

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
  view.batch = shape.batch;
  return view;
}

kernels::RotaryTables rotary_tables(const std::optional<Rotary>& rotary) {
  if (!rotary) return kernels::RotaryTables{nullptr, nullptr, 0, 0, false};
  return kernels::RotaryTables{rotary->cos, rotary->sin, rotary->max_position, rotary->rotary_dim, rotary->interleaved};
}

kernels::LaunchShape rows_grid(const DecodeKernel& kernel, int64_t rows, int64_t heads, int64_t batch) {
  kernels::LaunchShape shape;
  shape.grid = dim3(unsigned((rows + kernel.rows_per_block - 1) / kernel.rows_per_block), unsigned(heads), unsigned(batch));
  shape.block = dim3(unsigned(kernel.threads));
  return shape;
}

size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

void append_kv(Context& ctx, const KvCache& cache, const TensorView& k_new, const TensorView& v_new,
               const AppendKvOptions& options) {
  ContextState& state = ctx.state();
  const CacheShape shape = detail::validate_append_kv(cache, k_new, v_new, options);
  if (options.validate_metadata) detail::check_metadata("append_kv", state, cache, shape, int(k_new.seq()));
  if (shape.batch == 0 || shape.kv_heads == 0) return;
  const bool no_tokens = k_new.seq() == 0 || shape.head_dim == 0;
  if (no_tokens && options.updated_lengths == nullptr) return;
  const DecodeKernel kernel = SELFATTN_DECODE_KERNEL(state, kv_append_instance, cache.k.dtype);

  kernels::KvAppendParams params{};
  params.cache = pages_view(cache, shape);
  params.k_new = k_new.data;
  params.v_new = v_new.data;
  params.new_stride_batch_k = k_new.strides[0];
  params.new_stride_head_k = k_new.strides[1];
  params.new_stride_row_k = k_new.strides[2];
  params.new_stride_batch_v = v_new.strides[0];
  params.new_stride_head_v = v_new.strides[1];
  params.new_stride_row_v = v_new.strides[2];
  params.seq_new = no_tokens ? 0 : int(k_new.seq());
  params.rotary = rotary_tables(options.rotary);
  params.updated_lengths = options.updated_lengths;
  // At least one block per sequence, so that updated_lengths is written even without new tokens.
  const int64_t rows = std::max<int64_t>(params.seq_new, 1);
  state.device->launch(kernel.kernel, rows_grid(kernel, rows, shape.kv_heads, shape.batch), &params);
}

void attention_with_kv_cache(Context& ctx, const TensorView& q, const KvCache& cache, const TensorView& out,
                             const KvAttentionOptions& options) {
  ContextState& state = ctx.state();
  const CacheShape shape = detail::validate_attention_with_kv_cache(q, cache, out, options);
  if (options.validate_metadata) detail::check_metadata("attention_with_kv_cache", state, cache, shape, 0);

  AttentionOptions attention_options;
  attention_options.path = options.path;
  attention_options.causal = options.causal;
  attention_options.scale = options.scale;
  attention_options.key_lengths = cache.lengths;
  attention_options.lse = options.lse;
  if (q.numel() == 0 || shape.capacity == 0 || shape.kv_heads == 0) {
    // No query rows, or no cache slot at all: attention() writes nothing / zeros and -inf itself.
    TensorView empty = TensorView::bhsd(nullptr, q.dtype, q.batch(), shape.kv_heads, 0, q.head_dim());
    attention(ctx, q, empty, empty, out, attention_options);
    return;
  }

  // Workspace: gathered K and V, then the rotated q when asked.
  const size_t element = dtype_size(q.dtype);
  const size_t kv_bytes = aligned(size_t(shape.batch) * shape.kv_heads * size_t(shape.capacity) * shape.head_dim * element);
  const size_t q_bytes = options.rotary ? aligned(size_t(q.numel()) * element) : 0;
  auto* workspace = static_cast<unsigned char*>(state.workspace.reserve(
      2 * kv_bytes + q_bytes, "attention_with_kv_cache's gathered K/V", detail::WorkspaceSlot::projections));
  const TensorView k = TensorView::bhsd(workspace, q.dtype, shape.batch, shape.kv_heads, shape.capacity, shape.head_dim);
  const TensorView v = TensorView::bhsd(workspace + kv_bytes, q.dtype, shape.batch, shape.kv_heads, shape.capacity,
                                        shape.head_dim);
  TensorView q_used = q;
  if (options.rotary) {
    q_used = TensorView::bhsd(workspace + 2 * kv_bytes, q.dtype, q.batch(), q.heads(), q.seq(), q.head_dim());
    const DecodeKernel rotate = SELFATTN_DECODE_KERNEL(state, rotary_rows_instance, q.dtype);
    kernels::RotaryRowsParams params{};
    params.in = q.data;
    params.out = q_used.data;
    params.in_stride_batch = q.strides[0];
    params.in_stride_head = q.strides[1];
    params.in_stride_row = q.strides[2];
    params.out_stride_batch = q_used.strides[0];
    params.out_stride_head = q_used.strides[1];
    params.out_stride_row = q_used.strides[2];
    params.seq = int(q.seq());
    params.head_dim = int(q.head_dim());
    params.lengths = cache.lengths;
    params.position_offset = -int(q.seq());  // new rows are the last seq_q tokens of each sequence
    params.rotary = rotary_tables(options.rotary);
    state.device->launch(rotate.kernel, rows_grid(rotate, q.seq(), q.heads(), q.batch()), &params);
  }

  const DecodeKernel gather = SELFATTN_DECODE_KERNEL(state, kv_gather_instance, q.dtype);
  kernels::KvGatherParams params{};
  params.cache = pages_view(cache, shape);
  params.k_out = k.data;
  params.v_out = v.data;
  params.capacity = shape.capacity;
  state.device->launch(gather.kernel, rows_grid(gather, shape.capacity, shape.kv_heads, shape.batch), &params);

  attention(ctx, q_used, k, v, out, attention_options);
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

}  // namespace selfattn
