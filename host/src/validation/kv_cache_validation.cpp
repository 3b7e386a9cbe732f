// Argument checking for the KV-cache calls (see kv_cache_validation.h).
#include "validation/kv_cache_validation.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <string>
#include <tuple>

#include "selfattn/error.h"
#include "validation/attention_validation.h"

namespace selfattn::detail {
namespace {

constexpr int64_t kMaxGridYZ = 65535;  // kv heads / heads on grid.y, sequences on grid.z
constexpr int64_t kMaxGroupRows = (int64_t(1) << 31) - 1 - 64;  // a row block's first row stays an int32

[[noreturn]] void fail(const char* function, const std::string& message) {
  throw InvalidArgument(std::string(function) + ": " + message);
}

std::string str(int64_t value) { return std::to_string(value); }

void expect_equal(const char* function, const std::string& what, int64_t expected, const std::string& reference,
                  int64_t given) {
  if (given != expected) fail(function, what + " expected " + str(expected) + " (" + reference + "), got " + str(given));
}

void expect_dtype(const char* function, const char* name, const TensorView& view, DType dtype) {
  if (view.dtype != dtype) {
    fail(function, std::string(name) + ".dtype expected " + to_string(dtype) + " (cache.k.dtype), got " +
                       to_string(view.dtype));
  }
}

ByteRange int_range(const int32_t* data, int64_t count) { return byte_range(data, size_t(count) * sizeof(int32_t)); }

// An FP8 cache's scales (what the kernels read; empty for other caches).
ByteRange scale_range(const float* scales, const KvCache& cache) {
  return byte_range(is_fp8(cache.k.dtype) ? scales : nullptr, size_t(std::max(cache.scale_count, 0)) * sizeof(float));
}

// The other side of a call on an FP8 cache (k_new and v_new, q and out): f32, f16 or bf16
// (check_view), `second` of `first`'s dtype. Other caches: both of the cache's dtype.
void expect_dtypes(const char* function, const char* first_name, const TensorView& first, const char* second_name,
                   const TensorView& second, const KvCache& cache) {
  if (!is_fp8(cache.k.dtype)) {
    expect_dtype(function, first_name, first, cache.k.dtype);
    expect_dtype(function, second_name, second, cache.k.dtype);
    return;
  }
  if (second.dtype != first.dtype) {
    fail(function, std::string(second_name) + ".dtype expected " + to_string(first.dtype) + " (" + first_name +
                       ".dtype; with an FP8 cache both are f32, f16 or bf16), got " + to_string(second.dtype));
  }
}

// An FP8 cache's scales: present, 1 or kv_heads of them, aligned, apart from the cache (append_kv
// writes it while reading them); any other cache has none.
void check_scales(const char* function, const KvCache& cache, int kv_heads) {
  if (!is_fp8(cache.k.dtype)) {
    const std::string why = std::string(" (cache.k.dtype ") + to_string(cache.k.dtype) + " is not FP8)";
    if (cache.k_scale != nullptr) fail(function, "cache.k_scale expected null" + why + ", got a pointer");
    if (cache.v_scale != nullptr) fail(function, "cache.v_scale expected null" + why + ", got a pointer");
    if (cache.scale_count != 0)
      fail(function, "cache.scale_count expected 0" + why + ", got " + str(cache.scale_count));
    return;
  }
  const std::string fp8 = std::string(" (cache.k.dtype ") + to_string(cache.k.dtype) + ": real value = stored x scale)";
  if (cache.k_scale == nullptr) fail(function, "cache.k_scale expected device fp32 scales" + fp8 + ", got null");
  if (cache.v_scale == nullptr) fail(function, "cache.v_scale expected device fp32 scales" + fp8 + ", got null");
  if (cache.scale_count != 1 && cache.scale_count != kv_heads) {
    fail(function, "cache.scale_count expected 1 (per tensor) or kv_heads = " + str(kv_heads) + " (per kv head), got " +
                       str(cache.scale_count));
  }
  expect_aligned(function, "cache.k_scale", cache.k_scale, alignof(float));
  expect_aligned(function, "cache.v_scale", cache.v_scale, alignof(float));
  const ByteRange k = byte_range(cache.k), v = byte_range(cache.v);
  expect_disjoint(function, "cache.k_scale", scale_range(cache.k_scale, cache), "cache.k", k);
  expect_disjoint(function, "cache.k_scale", scale_range(cache.k_scale, cache), "cache.v", v);
  expect_disjoint(function, "cache.v_scale", scale_range(cache.v_scale, cache), "cache.k", k);
  expect_disjoint(function, "cache.v_scale", scale_range(cache.v_scale, cache), "cache.v", v);
}

// The scales are read while `written` is written.
void expect_scales_apart(const char* function, const KvCache& cache, const char* written_name,
                         const ByteRange& written) {
  expect_disjoint(function, "cache.k_scale", scale_range(cache.k_scale, cache), written_name, written);
  expect_disjoint(function, "cache.v_scale", scale_range(cache.v_scale, cache), written_name, written);
}

// Whether `columns` is a view of `rows`' leading columns: the same data and strides (head_dim's is 1
// in both), the same extents but the head dim, no more columns. A latent cache's V (kv_cache.h).
bool view_of_leading_columns(const TensorView& columns, const TensorView& rows) {
  if (columns.data != rows.data || columns.data == nullptr || columns.head_dim() > rows.head_dim()) return false;
  for (int i = 0; i < 3; ++i)
    if (columns.shape[i] != rows.shape[i] || columns.strides[i] != rows.strides[i]) return false;
  return true;
}

// The cache alone: views, dtypes, layout, sizes, metadata pointers, and its parts not overlapping.
// `written`: the call writes the cache (append_kv), so its elements need addresses of their own.
CacheShape check_cache(const char* function, const KvCache& cache, bool written) {
  check_view(function, "cache.k", cache.k, /*fp8=*/true);
  check_view(function, "cache.v", cache.v, /*fp8=*/true);
  if (cache.v.dtype != cache.k.dtype) {
    fail(function, std::string("cache.v.dtype expected ") + to_string(cache.k.dtype) + " (cache.k.dtype), got " +
                       to_string(cache.v.dtype));
  }
  for (int i = 0; i < 3; ++i) {
    expect_equal(function, "cache.v.shape[" + str(i) + "]", cache.k.shape[i], "cache.k.shape[" + str(i) + "]",
                 cache.v.shape[i]);
  }
  const bool v_in_k = view_of_leading_columns(cache.v, cache.k);
  if (v_in_k && is_fp8(cache.k.dtype) && cache.v_scale != cache.k_scale) {
    fail(function, "cache.v_scale expected cache.k_scale (cache.v is a view of cache.k's values, so one scale "
                   "dequantizes both), got another pointer");
  }
  if (written) {
    expect_distinct_addresses(function, "cache.k", cache.k);
    expect_distinct_addresses(function, "cache.v", cache.v);
  }
  if (cache.batch < 0) fail(function, "cache.batch expected >= 0, got " + str(cache.batch));
  if (cache.batch > kMaxGridYZ) fail(function, "cache.batch expected <= 65535, got " + str(cache.batch));
  if (cache.k.heads() > kMaxGridYZ) fail(function, "cache.k.shape[1] (kv_heads) expected <= 65535, got " + str(cache.k.heads()));
  check_scales(function, cache, int(cache.k.heads()));
  CacheShape shape;
  shape.batch = cache.batch;
  shape.kv_heads = int(cache.k.heads());
  shape.head_dim_qk = int(cache.k.head_dim());
  shape.head_dim_v = int(cache.v.head_dim());
  shape.v_in_k = v_in_k;
  shape.num_pages = int(cache.k.batch());
  shape.page_size = int(cache.k.seq());
  if (cache.paged()) {
    if (cache.batch_index != nullptr) {
      fail(function, "cache.batch_index expected null with a block table (the table maps sequences to pages), got a "
                     "pointer");
    }
    if (cache.max_pages_per_seq < 1) fail(function, "cache.max_pages_per_seq expected >= 1, got " + str(cache.max_pages_per_seq));
    if (shape.page_size < 1) fail(function, "cache.k.shape[2] (page_size) expected >= 1, got " + str(shape.page_size));
    shape.max_pages_per_seq = cache.max_pages_per_seq;
  } else {
    if (cache.batch_index == nullptr) {
      expect_equal(function, "cache.batch", cache.k.batch(), "cache.k.shape[0], a contiguous cache", cache.batch);
    }
    if (cache.max_pages_per_seq != 0 && cache.max_pages_per_seq != 1) {
      fail(function, "cache.max_pages_per_seq expected 0 or 1 (contiguous cache: block_table is null), got " +
                         str(cache.max_pages_per_seq));
    }
    shape.max_pages_per_seq = 1;
  }
  const int64_t capacity = int64_t(shape.page_size) * shape.max_pages_per_seq;
  if (capacity > kMaxExtent) {
    fail(function, "cache capacity (page_size * max_pages_per_seq) expected <= " + str(kMaxExtent) + ", got " + str(capacity));
  }
  shape.capacity = int(capacity);
  if (shape.batch > 0 && cache.lengths == nullptr) fail(function, "cache.lengths expected non-null, got null");
  expect_aligned(function, "cache.lengths", cache.lengths, alignof(int32_t));
  if (cache.paged()) expect_aligned(function, "cache.block_table", cache.block_table, alignof(int32_t));
  expect_aligned(function, "cache.batch_index", cache.batch_index, alignof(int32_t));
  if (shape.batch > 0 && cache.batch_index != nullptr) {
    const ByteRange index = int_range(cache.batch_index, shape.batch);
    expect_disjoint(function, "cache.batch_index", index, "cache.k", byte_range(cache.k));
    expect_disjoint(function, "cache.batch_index", index, "cache.v", byte_range(cache.v));
  }
  const ByteRange k = byte_range(cache.k), v = byte_range(cache.v);
  if (!v_in_k && v.overlaps(k)) {
    fail(function, "cache.v expected not to overlap cache.k, or to be a view of its leading columns (cache.k's data "
                   "and strides, shape[3] <= cache.k.shape[3] = " + str(cache.k.head_dim()) + "), got a view that "
                   "overlaps it otherwise");
  }
  const ByteRange lengths = int_range(cache.lengths, shape.batch);
  expect_disjoint(function, "cache.lengths", lengths, "cache.k", k);
  expect_disjoint(function, "cache.lengths", lengths, "cache.v", v);
  if (cache.paged()) {
    const ByteRange table = int_range(cache.block_table, int64_t(shape.batch) * shape.max_pages_per_seq);
    expect_disjoint(function, "cache.block_table", table, "cache.k", k);
    expect_disjoint(function, "cache.block_table", table, "cache.v", v);
  }
  return shape;
}

void check_rotary(const char* function, const char* name, const std::optional<Rotary>& rotary, int head_dim) {
  if (!rotary) return;
  const std::string prefix = name;
  if (rotary->position_step != 0 && rotary->position_step != 1) {
    fail(function, prefix + ".position_step expected 0 or 1, got " + str(rotary->position_step));
  }
  expect_aligned(function, (prefix + ".positions").c_str(), rotary->positions, alignof(int32_t));
  if (rotary->cos == nullptr) fail(function, prefix + ".cos expected non-null, got null");
  if (rotary->sin == nullptr) fail(function, prefix + ".sin expected non-null, got null");
  if (rotary->table_dtype != DType::f32 && rotary->table_dtype != DType::f16 && rotary->table_dtype != DType::bf16) {
    fail(function, prefix + ".table_dtype expected f32, f16 or bf16, got " + to_string(rotary->table_dtype));
  }
  expect_aligned(function, (prefix + ".cos").c_str(), rotary->cos, dtype_size(rotary->table_dtype));
  expect_aligned(function, (prefix + ".sin").c_str(), rotary->sin, dtype_size(rotary->table_dtype));
  if (rotary->max_position < 1) fail(function, prefix + ".max_position expected >= 1, got " + str(rotary->max_position));
  if (rotary->first_dim < 0 || rotary->first_dim > head_dim) {
    fail(function, prefix + ".first_dim expected 0 to head_dim = " + str(head_dim) + ", got " + str(rotary->first_dim));
  }
  const int room = head_dim - rotary->first_dim;  // the elements from first_dim on
  if (rotary->rotary_dim < 2 || rotary->rotary_dim % 2 != 0 || rotary->rotary_dim > room) {
    const std::string bound = rotary->first_dim == 0 ? "head_dim = " : "head_dim - first_dim = ";
    fail(function, prefix + ".rotary_dim expected an even number in [2, " + bound + str(room) + "], got " +
                       str(rotary->rotary_dim));
  }
}

// What the rotary tables and positions occupy (they are read while `written` is written).
void check_rotary_disjoint(const char* function, const char* name, const std::optional<Rotary>& rotary,
                           const char* written_name, const ByteRange& written, int64_t batch) {
  if (!rotary) return;
  const size_t bytes = size_t(rotary->max_position) * size_t(rotary->rotary_dim / 2) * dtype_size(rotary->table_dtype);
  expect_disjoint(function, (std::string(name) + ".cos").c_str(), byte_range(rotary->cos, bytes), written_name, written);
  expect_disjoint(function, (std::string(name) + ".sin").c_str(), byte_range(rotary->sin, bytes), written_name, written);
  expect_disjoint(function, (std::string(name) + ".positions").c_str(), int_range(rotary->positions, batch),
                  written_name, written);
}

// A packed call's offsets and bound; returns the bytes the offsets occupy (read by the kernels).
ByteRange check_packed(const char* function, const char* offsets_name, const char* max_name, const PackedRows& packed,
                       int batch) {
  if (packed.max_seqlen < 0 || packed.max_seqlen > kMaxExtent) {
    fail(function, std::string(max_name) + " expected 0 to " + str(kMaxExtent) + ", got " + str(packed.max_seqlen));
  }
  if (batch > 0 && packed.cu_seqlens == nullptr) {
    fail(function, std::string(offsets_name) + " expected non-null (cache.batch + 1 = " + str(int64_t(batch) + 1) +
                       " device int32 entries), got null");
  }
  expect_aligned(function, offsets_name, packed.cu_seqlens, alignof(int32_t));
  return int_range(packed.cu_seqlens, int64_t(batch) + 1);
}

void expect_packed_batch(const char* function, const char* name, const TensorView& view, const char* layout) {
  if (view.batch() != 1) {
    fail(function, std::string(name) + ".shape[0] expected 1 (packed rows " + layout + "), got " + str(view.batch()));
  }
}

}  // namespace

CacheShape validate_append_kv(const KvCache& cache, const TensorView& k_new, const TensorView& v_new,
                              const AppendKvOptions& options, const PackedRows* packed) {
  const char* function = packed ? "append_kv_varlen" : "append_kv";
  const CacheShape shape = check_cache(function, cache, /*written=*/true);
  check_view(function, "k_new", k_new);
  check_view(function, "v_new", v_new);
  expect_dtypes(function, "k_new", k_new, "v_new", v_new, cache);
  ByteRange offsets{};
  if (packed) {
    expect_packed_batch(function, "k_new", k_new, "[1, kv_heads, total_new, head_dim]");
    offsets = check_packed(function, "cu_seqlens_new", "max_seqlen_new", *packed, shape.batch);
  } else {
    expect_equal(function, "k_new.shape[0] (batch)", shape.batch, "cache.batch", k_new.batch());
  }
  expect_equal(function, "k_new.shape[1] (kv_heads)", shape.kv_heads, "cache.k.shape[1]", k_new.heads());
  expect_equal(function, "k_new.shape[3] (head_dim)", shape.head_dim_qk, "cache.k.shape[3]", k_new.head_dim());
  for (int i = 0; i < 3; ++i) {
    expect_equal(function, "v_new.shape[" + str(i) + "]", k_new.shape[i], "k_new.shape[" + str(i) + "]", v_new.shape[i]);
  }
  expect_equal(function, "v_new.shape[3] (head_dim)", shape.head_dim_v, "cache.v.shape[3]", v_new.head_dim());
  if (shape.v_in_k && !view_of_leading_columns(v_new, k_new)) {
    fail(function, "v_new expected a view of k_new's leading columns (k_new's data and strides), as cache.v is of "
                   "cache.k (K's rows are written whole and V's are among them), got another view");
  }
  const int64_t seq_new = packed ? packed->max_seqlen : k_new.seq();
  if (int64_t(shape.capacity) + seq_new > kMaxExtent) {
    fail(function, std::string("capacity + ") + (packed ? "max_seqlen_new" : "k_new.shape[2] (seq_new)") +
                       " expected <= " + str(kMaxExtent) + ", got " + str(int64_t(shape.capacity) + seq_new));
  }
  check_rotary(function, "options.rotary", options.rotary, shape.head_dim_qk);
  const ByteRange k = byte_range(cache.k), v = byte_range(cache.v);
  expect_disjoint(function, "k_new", byte_range(k_new), "cache.k", k);
  expect_disjoint(function, "k_new", byte_range(k_new), "cache.v", v);
  expect_disjoint(function, "v_new", byte_range(v_new), "cache.k", k);
  expect_disjoint(function, "v_new", byte_range(v_new), "cache.v", v);
  check_rotary_disjoint(function, "options.rotary", options.rotary, "cache.k", k, shape.batch);
  check_rotary_disjoint(function, "options.rotary", options.rotary, "cache.v", v, shape.batch);
  if (packed) {
    expect_disjoint(function, "cu_seqlens_new", offsets, "cache.k", k);
    expect_disjoint(function, "cu_seqlens_new", offsets, "cache.v", v);
  }
  if (options.updated_lengths != nullptr) {
    expect_aligned(function, "options.updated_lengths", options.updated_lengths, alignof(int32_t));
    const ByteRange updated = int_range(options.updated_lengths, shape.batch);
    expect_disjoint(function, "options.updated_lengths", updated, "cache.lengths", int_range(cache.lengths, shape.batch));
    expect_disjoint(function, "options.updated_lengths", updated, "cache.batch_index",
                    int_range(cache.batch_index, cache.batch_index ? shape.batch : 0));
    expect_disjoint(function, "options.updated_lengths", updated, "cache.k", k);
    expect_disjoint(function, "options.updated_lengths", updated, "cache.v", v);
    // Written while other blocks read the new tokens and the rotary tables.
    expect_disjoint(function, "options.updated_lengths", updated, "k_new", byte_range(k_new));
    expect_disjoint(function, "options.updated_lengths", updated, "v_new", byte_range(v_new));
    expect_scales_apart(function, cache, "options.updated_lengths", updated);
    check_rotary_disjoint(function, "options.rotary", options.rotary, "options.updated_lengths", updated, shape.batch);
    if (packed) expect_disjoint(function, "options.updated_lengths", updated, "cu_seqlens_new", offsets);
    if (cache.paged()) {
      expect_disjoint(function, "options.updated_lengths", updated, "cache.block_table",
                      int_range(cache.block_table, int64_t(shape.batch) * shape.max_pages_per_seq));
    }
  }
  return shape;
}

AttentionOptions attention_options_of(const KvAttentionOptions& options, const KvCache& cache) {
  AttentionOptions converted;
  static_cast<MaskOptions&>(converted) = options;  // the masks and modifiers, one bundle (mask_options.h)
  converted.path = options.path;
  converted.causal = options.causal;
  converted.scale = options.scale;
  converted.key_lengths = cache.lengths;
  converted.lse = options.lse;
  return converted;
}

CacheShape validate_attention_with_kv_cache(const TensorView& q, const KvCache& cache, const TensorView& out,
                                            const KvAttentionOptions& options, AttentionCall& score_mods,
                                            const PackedRows* packed) {
  const char* function = packed ? "attention_with_kv_cache_varlen" : "attention_with_kv_cache";
  const CacheShape shape = check_cache(function, cache, /*written=*/false);
  check_view(function, "q", q);
  check_view(function, "out", out);
  expect_dtypes(function, "q", q, "out", out, cache);
  if (packed) {
    expect_packed_batch(function, "q", q, "[1, heads, total_q, head_dim]");
    check_packed(function, "cu_seqlens_q", "max_seqlen_q", *packed, shape.batch);
  } else {
    expect_equal(function, "q.shape[0] (batch)", shape.batch, "cache.batch", q.batch());
  }
  // Rows per sequence: the grid's extent (a packed call's longest sequence).
  const int64_t seq_q = packed ? packed->max_seqlen : q.seq();
  expect_equal(function, "q.shape[3] (head_dim)", shape.head_dim_qk, "cache.k.shape[3]", q.head_dim());
  for (int i = 0; i < 3; ++i) {
    expect_equal(function, "out.shape[" + str(i) + "]", q.shape[i], "q.shape[" + str(i) + "]", out.shape[i]);
  }
  expect_equal(function, "out.shape[3] (head_dim)", shape.head_dim_v, "cache.v.shape[3]", out.head_dim());
  // The decode kernels number the rows of one (sequence, kv head) group, (heads / kv_heads) * seq_q
  // of them, and their blocks' first rows in int32.
  if (shape.kv_heads > 0 && q.heads() / shape.kv_heads * seq_q > kMaxGroupRows) {
    fail(function, std::string("q.shape[1] / kv_heads * ") + (packed ? "max_seqlen_q" : "q.shape[2]") +
                       " (query rows per kv head) expected <= " + str(kMaxGroupRows) + ", got " +
                       str(q.heads() / shape.kv_heads * seq_q));
  }
  expect_distinct_addresses(function, "out", out);
  if (q.heads() > kMaxGridYZ) fail(function, "q.shape[1] (heads) expected <= 65535, got " + str(q.heads()));
  if (q.heads() > 0 && (shape.kv_heads == 0 || q.heads() % shape.kv_heads != 0)) {
    fail(function, "q.shape[1] (heads) expected a multiple of cache.k.shape[1] (kv_heads) = " + str(shape.kv_heads) +
                       ", got " + str(q.heads()));
  }
  if (q.batch() * q.heads() * q.seq() > 0 && shape.head_dim_qk == 0) {
    fail(function, "q.shape[3] (head_dim) expected >= 1 when there are query rows, got 0");
  }
  if (options.causal != Causal::none && options.causal != Causal::bottom_right) {
    fail(function, "options.causal expected none or bottom_right (top_left has no meaning against a cache), got " +
                       std::string(options.causal == Causal::top_left ? "top_left" : "value " + str(int(options.causal))));
  }
  if (options.scale && !std::isfinite(*options.scale)) {
    fail(function, "options.scale expected a finite number, got " + std::to_string(*options.scale));
  }
  if (options.num_splits < 0 || options.num_splits > 4096) {
    fail(function, "options.num_splits expected 0 (automatic) to 4096, got " + str(options.num_splits));
  }
  check_rotary(function, "options.rotary", options.rotary, shape.head_dim_qk);

  const ByteRange out_range = byte_range(out);
  expect_disjoint(function, "out", out_range, "q", byte_range(q));
  expect_disjoint(function, "out", out_range, "cache.k", byte_range(cache.k));
  expect_disjoint(function, "out", out_range, "cache.v", byte_range(cache.v));
  expect_disjoint(function, "out", out_range, "cache.lengths", int_range(cache.lengths, shape.batch));
  expect_disjoint(function, "out", out_range, "cache.batch_index",
                  int_range(cache.batch_index, cache.batch_index ? shape.batch : 0));
  if (cache.paged()) {
    expect_disjoint(function, "out", out_range, "cache.block_table",
                    int_range(cache.block_table, int64_t(shape.batch) * shape.max_pages_per_seq));
  }
  check_rotary_disjoint(function, "options.rotary", options.rotary, "out", out_range, shape.batch);
  expect_scales_apart(function, cache, "out", out_range);
  if (options.lse != nullptr) {
    expect_aligned(function, "options.lse", options.lse, alignof(float));
    const ByteRange lse = byte_range(options.lse, size_t(q.batch() * q.heads() * q.seq()) * sizeof(float));
    expect_disjoint(function, "options.lse", lse, "out", out_range);
    expect_disjoint(function, "options.lse", lse, "q", byte_range(q));
    expect_disjoint(function, "options.lse", lse, "cache.k", byte_range(cache.k));
    expect_disjoint(function, "options.lse", lse, "cache.v", byte_range(cache.v));
    expect_disjoint(function, "options.lse", lse, "cache.lengths", int_range(cache.lengths, shape.batch));
    expect_disjoint(function, "options.lse", lse, "cache.batch_index",
                    int_range(cache.batch_index, cache.batch_index ? shape.batch : 0));
    if (cache.paged()) {
      expect_disjoint(function, "options.lse", lse, "cache.block_table",
                      int_range(cache.block_table, int64_t(shape.batch) * shape.max_pages_per_seq));
    }
    check_rotary_disjoint(function, "options.rotary", options.rotary, "options.lse", lse, shape.batch);
    expect_scales_apart(function, cache, "options.lse", lse);
  }
  // Read by the kernels while out and lse are written.
  // (cu_seqlens_q's alignment and entries were checked above.)
  const int64_t offsets_count = int64_t(shape.batch) + 1;
  for (const auto& [name, values, count] :
       {std::tuple<const char*, const int32_t*, int64_t>{"options.key_start", options.key_start, shape.batch},
        {"options.q_offset", options.q_offset, shape.batch},
        {"cu_seqlens_q", packed ? packed->cu_seqlens : nullptr, offsets_count}}) {
    if (values == nullptr) continue;
    expect_aligned(function, name, values, alignof(int32_t));
    const ByteRange range = int_range(values, count);
    expect_disjoint(function, name, range, "out", out_range);
    if (options.lse != nullptr) {
      expect_disjoint(function, name, range, "options.lse",
                      byte_range(options.lse, size_t(q.batch() * q.heads() * q.seq()) * sizeof(float)));
    }
  }
  check_score_mods(function, attention_options_of(options, cache), shape.batch, q.heads(), seq_q, shape.capacity, q,
                   out, q.batch() * q.heads() * q.seq(), true, score_mods, "capacity");
  return shape;
}

void validate_rotary_embedding(const TensorView& x, const TensorView& out, const Rotary& rotary) {
  const char* function = "rotary_embedding";
  check_view(function, "x", x);
  check_view(function, "out", out);
  expect_dtype(function, "out", out, x.dtype);
  for (int i = 0; i < 4; ++i) {
    expect_equal(function, "out.shape[" + str(i) + "]", x.shape[i], "x.shape[" + str(i) + "]", out.shape[i]);
  }
  if (x.batch() > kMaxGridYZ) fail(function, "x.shape[0] (batch) expected <= 65535, got " + str(x.batch()));
  if (x.heads() > kMaxGridYZ) fail(function, "x.shape[1] (heads) expected <= 65535, got " + str(x.heads()));
  expect_distinct_addresses(function, "out", out);
  const std::optional<Rotary> tables = rotary;
  check_rotary(function, "rotary", tables, int(x.head_dim()));
  const ByteRange out_range = byte_range(out);
  expect_disjoint(function, "out", out_range, "x", byte_range(x));
  check_rotary_disjoint(function, "rotary", tables, "out", out_range, x.batch());
}

void validate_merge_states(const TensorView& out_a, const float* lse_a, const TensorView& out_b, const float* lse_b,
                           const TensorView& out, const float* lse_out) {
  const char* function = "merge_states";
  check_view(function, "out_a", out_a);
  check_view(function, "out_b", out_b);
  check_view(function, "out", out);
  for (const auto& [name, view] : {std::pair<const char*, const TensorView&>{"out_b", out_b}, {"out", out}}) {
    if (view.dtype != out_a.dtype) {
      fail(function, std::string(name) + ".dtype expected " + to_string(out_a.dtype) + " (out_a.dtype), got " +
                         to_string(view.dtype));
    }
    for (int i = 0; i < 4; ++i) {
      expect_equal(function, std::string(name) + ".shape[" + str(i) + "]", out_a.shape[i],
                   "out_a.shape[" + str(i) + "]", view.shape[i]);
    }
  }
  expect_distinct_addresses(function, "out", out);
  const int64_t rows = out_a.batch() * out_a.heads() * out_a.seq();
  if (rows > 0 && lse_a == nullptr) fail(function, "lse_a expected non-null, got null");
  if (rows > 0 && lse_b == nullptr) fail(function, "lse_b expected non-null, got null");
  expect_aligned(function, "lse_a", lse_a, alignof(float));
  expect_aligned(function, "lse_b", lse_b, alignof(float));
  expect_aligned(function, "lse_out", lse_out, alignof(float));
  const size_t lse_bytes = size_t(rows) * sizeof(float);
  const ByteRange a = byte_range(out_a), b = byte_range(out_b), o = byte_range(out);
  const ByteRange la = byte_range(lse_a, lse_bytes), lb = byte_range(lse_b, lse_bytes), lo = byte_range(lse_out, lse_bytes);
  // In place: out may be out_a itself (each row is read whole before it is written), nothing else.
  const bool out_is_a = out.data == out_a.data && out.strides == out_a.strides;
  if (!out_is_a) expect_disjoint(function, "out", o, "out_a (out may only be out_a itself)", a);
  expect_disjoint(function, "out", o, "out_b", b);
  expect_disjoint(function, "out", o, "lse_a", la);
  expect_disjoint(function, "out", o, "lse_b", lb);
  if (lse_out != nullptr) {
    if (lse_out != lse_a) expect_disjoint(function, "lse_out", lo, "lse_a (lse_out may only be lse_a itself)", la);
    expect_disjoint(function, "lse_out", lo, "lse_b", lb);
    expect_disjoint(function, "lse_out", lo, "out_a", a);
    expect_disjoint(function, "lse_out", lo, "out_b", b);
    expect_disjoint(function, "lse_out", lo, "out", o);
  }
}

void validate_cu_seqlens_from_lengths(const int32_t* lengths, int batch, const int32_t* cu_seqlens) {
  const char* function = "cu_seqlens_from_lengths";
  if (batch < 0) fail(function, "batch expected >= 0, got " + str(batch));
  if (batch > 0 && lengths == nullptr) fail(function, "lengths expected non-null (batch > 0), got null");
  if (cu_seqlens == nullptr) fail(function, "cu_seqlens expected non-null (batch + 1 entries), got null");
  expect_aligned(function, "lengths", lengths, alignof(int32_t));
  expect_aligned(function, "cu_seqlens", cu_seqlens, alignof(int32_t));
  expect_disjoint(function, "cu_seqlens", int_range(cu_seqlens, int64_t(batch) + 1), "lengths", int_range(lengths, batch));
}

}  // namespace selfattn::detail
