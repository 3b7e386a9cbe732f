// The KV cache's entry points (host/src/kv_cache.cpp): append_kv, attention_with_kv_cache,
// merge_states and cu_seqlens_from_lengths, and the cache's and the rotary tables' arrays (call.h
// declares them).
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "entry_points.h"

namespace selfattn_python {

namespace {

// An FP8 cache's scales (k_scale, v_scale): fp32, 1-D, contiguous; the library reads scale_count of
// them from a bare pointer, so the length (1 or kv_heads, checked by the library) is taken here.
const Arg* add_scales(Call& call, const char* name, const std::optional<InArray>& scales) {
  if (!scales) return nullptr;
  const Arg& a = call.add(Arg(name, *scales, false, Holds::vector));
  expect_contiguous_float32(a, scales->dtype());
  if (a.ndim != 1) {
    invalid(std::string(name) + " expected a 1-D array of 1 (per tensor) or kv_heads (per kv head) entries, got "
            "shape " + shape_text(a));
  }
  return &a;
}

}  // namespace

KvCacheArgs add_kv_cache(Call& call, const Arg& k, const Arg& v, const InArray& lengths,
                         const std::optional<InArray>& block_table, const std::optional<InArray>& batch_index,
                         const CallBatch& call_batch, const std::optional<InArray>& k_scale,
                         const std::optional<InArray>& v_scale) {
  const Arg* ak_scale = add_scales(call, "k_scale", k_scale);
  const Arg* av_scale = add_scales(call, "v_scale", v_scale);
  if (ak_scale && av_scale && ak_scale->shape != av_scale->shape) {
    invalid("v_scale expected k_scale's shape " + shape_text(*ak_scale) + " (one count of scales for both), got " +
            shape_text(*av_scale));
  }
  const Arg& alengths = call.add(Arg("lengths", lengths, false, Holds::vector));
  const Arg* table = block_table ? &call.add(Arg("block_table", *block_table, false, Holds::vector)) : nullptr;
  int64_t batch = k.ndim == 4 ? k.shape[0] : 0, max_pages = 0;
  if (table) {
    const nb::dlpack::dtype dt = block_table->dtype();
    if (dt.code != uint8_t(nb::dlpack::dtype_code::Int) || dt.bits != 32 || dt.lanes != 1) {
      invalid("block_table.dtype expected int32, got " + dtype_name(dt));
    }
    if (table->ndim != 2) {
      invalid("block_table expected 2 dimensions [batch, max_pages_per_seq], got " + shape_text(*table));
    }
    batch = table->shape[0];
    max_pages = table->shape[1];
    if ((max_pages > 1 && table->strides[1] != 1) || (batch > 1 && table->strides[0] != max_pages)) {
      invalid("block_table expected a contiguous (row-major) array");
    }
    if (batch > INT32_MAX || max_pages > INT32_MAX) {
      invalid("block_table's extents expected to fit int32, got " + shape_text(*table));
    }
  }
  const Arg* index = batch_index ? &call.add(Arg("batch_index", *batch_index, false, Holds::vector)) : nullptr;
  std::string reference = table ? "batch: block_table's rows" : "batch";
  if (index) {
    if (table) invalid("batch_index expected None with a block_table (the table maps sequences to pages)");
    // One row per sequence, whatever the cache holds: the batch is no extent of the cache. Where
    // batch_index and lengths agree, that is it (q or k_new is then named if it differs); else
    // both are checked against the call's own batch, so the one that differs is named.
    const int64_t entries = index->ndim == 1 ? index->shape[0] : -1;
    const int64_t counted = alengths.ndim == 1 ? alengths.shape[0] : -1;
    const bool from_call = (entries != counted || entries < 0) && call_batch.count >= 0;
    batch = from_call ? call_batch.count : entries;
    reference = from_call ? "batch: " + call_batch.what : "batch: lengths.shape[0]";
    expect_int32_vector(*index, batch_index->dtype(), batch, reference);
  }
  expect_int32_vector(alengths, lengths.dtype(), batch, reference);
  return {k, v, alengths, table, index, batch, max_pages, ak_scale, av_scale};
}

selfattn::KvCache kv_cache(const KvCacheArgs& cache) {
  const auto* lengths = static_cast<const int32_t*>(cache.lengths.data);
  selfattn::KvCache view;
  if (!cache.block_table) {
    view = selfattn::KvCache::contiguous(tensor_view(cache.k), tensor_view(cache.v), lengths);
    if (cache.batch_index) {
      view.batch_index = static_cast<const int32_t*>(cache.batch_index->data);
      view.batch = int(cache.batch);
    }
  } else {
    view = selfattn::KvCache::paged_pool(tensor_view(cache.k), tensor_view(cache.v),
                                         static_cast<const int32_t*>(cache.block_table->data), int(cache.batch),
                                         int(cache.max_pages_per_seq), lengths);
  }
  const Arg* counted = cache.k_scale ? cache.k_scale : cache.v_scale;
  view.k_scale = cache.k_scale ? static_cast<const float*>(cache.k_scale->data) : nullptr;
  view.v_scale = cache.v_scale ? static_cast<const float*>(cache.v_scale->data) : nullptr;
  view.scale_count = counted ? int(std::min<int64_t>(counted->shape[0], INT32_MAX)) : 0;
  return view;
}

RotaryArgs add_rotary(Call& call, const std::optional<InArray>& cos, const std::optional<InArray>& sin,
                      bool interleaved, const std::optional<InArray>& positions, int position_step, int64_t batch,
                      int first_dim) {
  if (bool(cos) != bool(sin)) invalid("rotary_cos and rotary_sin expected both or neither");
  if (positions && !cos) invalid("rotary_positions expected None without rotary_cos and rotary_sin");
  if (!cos) return {nullptr, nullptr, interleaved, nullptr, position_step, selfattn::DType::f32, first_dim};
  const Arg& acos = call.add(Arg("rotary_cos", *cos, false, Holds::vector));
  const Arg& asin = call.add(Arg("rotary_sin", *sin, false, Holds::vector));
  // float32, or float16/bfloat16 as the model keeps them (read as they are); both of one dtype.
  const selfattn::DType table_dtype = dtype_of("rotary_cos", cos->dtype(), false);
  if (dtype_of("rotary_sin", sin->dtype(), false) != table_dtype) {
    invalid("rotary_sin.dtype expected rotary_cos's " + dtype_name(cos->dtype()) + ", got " + dtype_name(sin->dtype()));
  }
  expect_contiguous(acos);
  expect_contiguous(asin);
  if (acos.ndim != 2 || acos.shape[0] < 1 || acos.shape[1] < 1) {
    invalid("rotary_cos expected shape [max_position >= 1, rotary_dim / 2 >= 1], got " + shape_text(acos));
  }
  if (acos.shape[0] > INT32_MAX || acos.shape[1] > INT32_MAX / 2) {
    invalid("rotary_cos's extents expected to fit int32, got " + shape_text(acos));
  }
  if (asin.shape != acos.shape) {
    invalid("rotary_sin expected rotary_cos's shape " + shape_text(acos) + ", got " + shape_text(asin));
  }
  const Arg* apositions = positions ? &call.add(Arg("rotary_positions", *positions, false, Holds::vector)) : nullptr;
  if (apositions) expect_int32_vector(*apositions, positions->dtype(), batch, "batch");
  return {&acos, &asin, interleaved, apositions, position_step, table_dtype, first_dim};
}

std::optional<selfattn::Rotary> rotary(const RotaryArgs& tables) {
  if (!tables.cos) return std::nullopt;
  selfattn::Rotary r;
  r.cos = static_cast<const float*>(tables.cos->data);
  r.sin = static_cast<const float*>(tables.sin->data);
  r.max_position = int(tables.cos->shape[0]);
  r.rotary_dim = int(tables.cos->shape[1] * 2);
  r.interleaved = tables.interleaved;
  r.positions = tables.positions ? static_cast<const int32_t*>(tables.positions->data) : nullptr;
  r.position_step = tables.position_step;
  r.table_dtype = tables.table_dtype;
  r.first_dim = tables.first_dim;
  return r;
}

namespace {

// The batch of a call on `rows` (q or k_new, [batch, heads, seq, head_dim] as the Python layer
// passes it), or of its packed offsets (int32 [batch + 1]) when given.
CallBatch call_batch(const InArray& rows, const char* rows_name, const std::optional<InArray>& offsets,
                     const char* offsets_name) {
  if (offsets) {
    if (offsets->ndim() != 1 || offsets->shape(0) < 1) return {};
    return {int64_t(offsets->shape(0)) - 1, std::string(offsets_name) + "'s entries - 1"};
  }
  if (rows.ndim() != 4) return {};
  return {int64_t(rows.shape(0)), std::string(rows_name) + ".shape[0]"};
}

// A packed call's offsets (int32 [batch + 1]), or null for a dense call.
const Arg* add_packed_offsets(Call& call, const char* name, const std::optional<InArray>& offsets, int64_t batch) {
  if (!offsets) return nullptr;
  const Arg& a = call.add(Arg(name, *offsets, false, Holds::vector));
  expect_int32_vector(a, offsets->dtype(), batch + 1, "batch + 1");
  return &a;
}

}  // namespace

// The KV cache (selfattn/kv_cache.h). k_cache and v_cache are the cache or the page pool as
// [batch or num_pages, kv_heads, capacity or page_size, head_dim] views; append_kv writes them.
void append_kv(BoundContext& context, OutArray k_cache, OutArray v_cache, InArray lengths,
               std::optional<InArray> block_table, std::optional<InArray> batch_index, InArray k_new, InArray v_new,
               std::optional<InArray> rotary_cos, std::optional<InArray> rotary_sin, bool rotary_interleaved,
               std::optional<InArray> rotary_positions, int rotary_position_step,
               std::optional<OutArray> updated_lengths, bool validate_metadata, std::optional<InArray> cu_seqlens_new,
               int max_seqlen_new, bool bf16_as_uint16, std::optional<std::string> fp8,
               std::optional<InArray> k_scale, std::optional<InArray> v_scale, int rotary_first_dim) {
  const Holds data = data_kind(bf16_as_uint16);
  // Every data array gets the format, so an FP8 k_new is named as such by the library's refusal.
  const std::optional<selfattn::DType> fp8_dtype = parse_fp8(fp8);
  Call call(context);
  const KvCacheArgs cache = add_kv_cache(call, call.add(Arg("k_cache", k_cache, true, data, fp8_dtype)),
                                         call.add(Arg("v_cache", v_cache, true, data, fp8_dtype)), lengths,
                                         block_table, batch_index,
                                         call_batch(k_new, "k_new", cu_seqlens_new, "cu_seqlens_new"), k_scale,
                                         v_scale);
  const Arg* offsets = add_packed_offsets(call, "cu_seqlens_new", cu_seqlens_new, cache.batch);
  const Arg& ak = call.add(Arg("k_new", k_new, false, data, fp8_dtype));
  const Arg& av = call.add(Arg("v_new", v_new, false, data, fp8_dtype));
  const RotaryArgs tables =
      add_rotary(call, rotary_cos, rotary_sin, rotary_interleaved, rotary_positions, rotary_position_step, cache.batch,
                 rotary_first_dim);
  const Arg* aupdated =
      updated_lengths ? &call.add(Arg("updated_lengths", *updated_lengths, true, Holds::vector)) : nullptr;
  if (aupdated) expect_int32_vector(*aupdated, updated_lengths->dtype(), cache.batch, "batch");
  run_call(context, call, [&] {
    selfattn::AppendKvOptions options;
    options.rotary = rotary(tables);
    options.updated_lengths = aupdated ? static_cast<int32_t*>(aupdated->data) : nullptr;
    options.validate_metadata = validate_metadata;
    if (offsets) {
      selfattn::append_kv_varlen(call.ctx(), kv_cache(cache), tensor_view(ak), tensor_view(av),
                                 static_cast<const int32_t*>(offsets->data), max_seqlen_new, options);
    } else {
      selfattn::append_kv(call.ctx(), kv_cache(cache), tensor_view(ak), tensor_view(av), options);
    }
  });
}

void attention_with_kv_cache(BoundContext& context, InArray q, InArray k_cache, InArray v_cache, InArray lengths,
                             std::optional<InArray> block_table, std::optional<InArray> batch_index, OutArray out,
                             std::optional<std::string> causal, std::optional<float> scale, std::string path,
                             std::optional<OutArray> lse, std::optional<InArray> rotary_cos,
                             std::optional<InArray> rotary_sin, bool rotary_interleaved,
                             std::optional<InArray> rotary_positions, int rotary_position_step, int num_splits,
                             const MaskArgs& masks, bool validate_metadata,
                             std::optional<InArray> cu_seqlens_q, int max_seqlen_q, bool bf16_as_uint16,
                             std::optional<std::string> fp8, std::optional<InArray> k_scale,
                             std::optional<InArray> v_scale, int rotary_first_dim) {
  // The attention options parsed as attention()'s, then carried over with the cache's own.
  selfattn::AttentionOptions parsed = make_options(causal, scale, path, masks);
  const Holds data = data_kind(bf16_as_uint16);
  const std::optional<selfattn::DType> fp8_dtype = parse_fp8(fp8);
  Call call(context);
  const Arg& aq = call.add(Arg("q", q, false, data, fp8_dtype));
  const KvCacheArgs cache = add_kv_cache(call, call.add(Arg("k_cache", k_cache, false, data, fp8_dtype)),
                                         call.add(Arg("v_cache", v_cache, false, data, fp8_dtype)), lengths,
                                         block_table, batch_index, call_batch(q, "q", cu_seqlens_q, "cu_seqlens_q"),
                                         k_scale, v_scale);
  const Arg& aout = call.add(Arg("out", out, true, data, fp8_dtype));
  const RotaryArgs tables =
      add_rotary(call, rotary_cos, rotary_sin, rotary_interleaved, rotary_positions, rotary_position_step, cache.batch,
                 rotary_first_dim);
  const Arg* alse = lse ? &call.add(Arg("lse", *lse, true, Holds::vector)) : nullptr;
  const Arg* offsets = add_packed_offsets(call, "cu_seqlens_q", cu_seqlens_q, cache.batch);
  const selfattn::TensorView q_shape = tensor_view(aq);
  if (alse && offsets) expect_lse(*alse, lse->dtype(), {q_shape.heads(), q_shape.seq()}, "heads, total_q");
  if (alse && !offsets) {
    expect_lse(*alse, lse->dtype(), {q_shape.batch(), q_shape.heads(), q_shape.seq()}, "batch, heads, seq_q");
  }
  // Per-sequence options have the cache's batch (a packed q has one entry).
  const ModArgs mods = add_mod_args(call, masks,
                                    offsets ? cache.batch : q_shape.batch(), q_shape.heads(), bf16_as_uint16);
  run_call(context, call, [&] {
    set_mod_options(parsed, mods);
    selfattn::KvAttentionOptions options;
    static_cast<selfattn::MaskOptions&>(options) = parsed;  // the masks and modifiers, one bundle
    options.path = parsed.path;
    options.causal = parsed.causal;
    options.scale = parsed.scale;
    options.lse = alse ? static_cast<float*>(alse->data) : nullptr;
    options.rotary = rotary(tables);
    options.num_splits = num_splits;
    options.validate_metadata = validate_metadata;
    if (offsets) {
      selfattn::attention_with_kv_cache_varlen(call.ctx(), tensor_view(aq), static_cast<const int32_t*>(offsets->data),
                                               max_seqlen_q, kv_cache(cache), tensor_view(aout), options);
    } else {
      selfattn::attention_with_kv_cache(call.ctx(), tensor_view(aq), kv_cache(cache), tensor_view(aout), options);
    }
  });
}

// lse_a, lse_b and lse_out: fp32 [batch, heads, seq] contiguous, as the library reads them.
void rotary_embedding(BoundContext& context, InArray x, OutArray out, InArray rotary_cos, InArray rotary_sin,
                      bool rotary_interleaved, std::optional<InArray> rotary_positions, int rotary_position_step,
                      bool bf16_as_uint16, int rotary_first_dim) {
  const Holds data = data_kind(bf16_as_uint16);
  Call call(context);
  const Arg& ax = call.add(Arg("x", x, false, data));
  const Arg& aout = call.add(Arg("out", out, true, data));
  const RotaryArgs tables = add_rotary(call, rotary_cos, rotary_sin, rotary_interleaved, rotary_positions,
                                       rotary_position_step, ax.ndim == 4 ? ax.shape[0] : 0, rotary_first_dim);
  run_call(context, call,
           [&] { selfattn::rotary_embedding(call.ctx(), tensor_view(ax), tensor_view(aout), *rotary(tables)); });
}

void merge_states(BoundContext& context, InArray out_a, InArray lse_a, InArray out_b, InArray lse_b, OutArray out,
                  std::optional<OutArray> lse_out, bool bf16_as_uint16) {
  const Holds data = data_kind(bf16_as_uint16);
  Call call(context);
  const Arg& aa = call.add(Arg("out_a", out_a, false, data));
  const Arg& alse_a = call.add(Arg("lse_a", lse_a, false, Holds::vector));
  const Arg& ab = call.add(Arg("out_b", out_b, false, data));
  const Arg& alse_b = call.add(Arg("lse_b", lse_b, false, Holds::vector));
  const Arg& aout = call.add(Arg("out", out, true, data));
  const Arg* alse_out = lse_out ? &call.add(Arg("lse_out", *lse_out, true, Holds::vector)) : nullptr;
  const selfattn::TensorView shape = tensor_view(aa);
  const std::vector<int64_t> rows = {shape.batch(), shape.heads(), shape.seq()};
  expect_lse(alse_a, lse_a.dtype(), rows, "batch, heads, seq of out_a");
  expect_lse(alse_b, lse_b.dtype(), rows, "batch, heads, seq of out_a");
  if (alse_out) expect_lse(*alse_out, lse_out->dtype(), rows, "batch, heads, seq of out_a");
  run_call(context, call, [&] {
    selfattn::merge_states(call.ctx(), tensor_view(aa), static_cast<const float*>(alse_a.data), tensor_view(ab),
                           static_cast<const float*>(alse_b.data), tensor_view(aout),
                           alse_out ? static_cast<float*>(alse_out->data) : nullptr);
  });
}

void cu_seqlens_from_lengths(BoundContext& context, InArray lengths, OutArray cu_seqlens) {
  Call call(context);
  const Arg& alengths = call.add(Arg("lengths", lengths, false, Holds::vector));
  const Arg& acu = call.add(Arg("cu_seqlens", cu_seqlens, true, Holds::vector));
  if (alengths.ndim != 1) invalid("lengths expected a 1-D array, got " + shape_text(alengths));
  if (alengths.shape[0] > INT32_MAX - 1) invalid("lengths expected at most 2^31 - 2 entries");
  expect_int32_vector(alengths, lengths.dtype(), alengths.shape[0], "batch");
  expect_int32_vector(acu, cu_seqlens.dtype(), alengths.shape[0] + 1, "batch + 1");
  run_call(context, call, [&] {
    selfattn::cu_seqlens_from_lengths(call.ctx(), static_cast<const int32_t*>(alengths.data),
                                      int(alengths.shape[0]), static_cast<int32_t*>(acu.data));
  });
}

}  // namespace selfattn_python
