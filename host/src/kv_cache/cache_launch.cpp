// The KV-cache runners' shared pieces (cache_launch.h).
#include "kv_cache/cache_launch.h"

#include "forward/paths.h"
#include "selfattn/error.h"

namespace selfattn::detail {

DecodeKernel available(DecodeKernel kernel) {
  if (!kernel.kernel) throw NotAvailable("KV cache: this build has no decode kernels for the backend");
  return kernel;
}

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
  view.head_dim = shape.head_dim_qk;
  view.head_dim_v = shape.head_dim_v;
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
  if (!rotary) return kernels::RotaryTables{nullptr, nullptr, 0, 0, false, nullptr, 1, kernels::Element::f32, 0};
  return kernels::RotaryTables{rotary->cos,         rotary->sin,       rotary->max_position,
                               rotary->rotary_dim,  rotary->interleaved, rotary->positions,
                               rotary->position_step, detail::element_of(rotary->table_dtype), rotary->first_dim};
}

kernels::LaunchShape rows_grid(const DecodeKernel& kernel, int64_t rows, int64_t heads, int64_t batch) {
  kernels::LaunchShape shape;
  shape.grid = dim3(unsigned((rows + kernel.rows_per_block - 1) / kernel.rows_per_block), unsigned(heads), unsigned(batch));
  shape.block = dim3(unsigned(kernel.threads));
  return shape;
}

size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

kernels::NewRows new_rows(const TensorView& view, const int32_t* ordered_offsets, int max_seqlen) {
  if (ordered_offsets == nullptr) return kernels::NewRows{nullptr, int(view.seq()), int(view.seq())};
  return kernels::NewRows{ordered_offsets, max_seqlen, int(view.seq())};
}

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


StagedQuery::StagedQuery(const TensorView& q, const PackedRows* packed, const KvCache& cache, const CacheShape& shape,
                         const std::optional<Rotary>& rotary, int seq_q, const char* function)
    : q(q), packed(packed), cache(cache), shape(shape), rotary(rotary), seq_q(seq_q), function(function),
      order_bytes(offsets_bytes(packed, shape.batch)),
      q_bytes(rotary ? aligned(size_t(q.numel()) * dtype_size(q.dtype)) : 0) {}

TensorView StagedQuery::at(unsigned char* base) const {
  return rotary ? TensorView::bhsd(base + order_bytes, q.dtype, q.batch(), q.heads(), q.seq(), q.head_dim()) : q;
}

kernels::NewRows StagedQuery::stage(ContextState& state, unsigned char* base) const {
  const kernels::NewRows rows = new_rows(q, ordered_offsets(state, packed, shape.batch, base, function), seq_q);
  if (rotary) rotate_rows(state, q, at(base), cache.lengths, rows, shape.batch, *rotary);
  return rows;
}

}  // namespace selfattn::detail
