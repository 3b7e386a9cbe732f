// append_kv_varlen (kv_cache.h, "Packed calls"): each sequence's own number of new tokens, packed
// without padding in k_new and v_new [1, kv_heads, total, head_dim] at the rows cu_seqlens_new
// gives. Judged against the reference's append of each sequence alone at the rows the documented
// clamps give (offsets read through their running maximum, clamped into [0, total], each count cut
// to max_seqlen_new): the rows it must write, every other byte of the cache untouched, the
// updated lengths; and against append_kv of each sequence alone, bit for bit. Rows of k_new and
// v_new no sequence owns hold NaN. Attention over packed rows: test_kv_cache_varlen.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kv_append_check.h"
#include "kv_cache_check.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

using namespace kv_test;

// A packed append: the cache, cu_seqlens_new as given (in order or not), k_new's rows, the bound.
struct PackedAppend {
  CacheSpec cache;
  std::vector<int32_t> offsets;  // [batch + 1]
  int total = 0;                 // rows of k_new and v_new
  int max_seqlen = 0;
  std::optional<std::pair<int, bool>> rotary;  // (rotary_dim, interleaved) on K
  int table_rows = 0;                          // the rotary tables' rows; 0: up to the last token appended
  std::vector<int32_t> positions;              // empty, or [batch] (Rotary::positions)

  std::string name() const {
    std::string s = "packed append " + cache.name() + " offsets=[";
    for (int32_t o : offsets) s += std::to_string(o) + ",";
    s += "] total" + std::to_string(total) + " max" + std::to_string(max_seqlen);
    if (rotary) s += " rotary" + std::to_string(rotary->first) + (rotary->second ? "i" : "h");
    if (table_rows) s += " table" + std::to_string(table_rows);
    for (size_t b = 0; b < positions.size(); ++b) s += (b ? "," : " positions=") + std::to_string(positions[b]);
    return s;
  }
};

// Sequence b's rows of k_new as kv_cache.h documents the packed offsets: (first row, count), the
// offsets' running maximum clamped into [0, total], the count cut to max_seqlen.
std::vector<std::pair<int, int>> documented_rows(const PackedAppend& c) {
  std::vector<int64_t> ordered(c.offsets.begin(), c.offsets.end());
  for (size_t i = 1; i < ordered.size(); ++i) ordered[i] = std::max(ordered[i], ordered[i - 1]);
  std::vector<std::pair<int, int>> rows;
  for (size_t b = 0; b + 1 < ordered.size(); ++b) {
    const int64_t begin = std::clamp<int64_t>(ordered[b], 0, c.total);
    const int64_t end = std::clamp<int64_t>(ordered[b + 1], begin, c.total);
    rows.emplace_back(int(begin), int(std::min<int64_t>(end - begin, c.max_seqlen)));
  }
  return rows;
}

// Rows [first, first + count) of a [1, kv_heads, total, d] tensor's values as [1, kv_heads, count, d].
std::vector<double> rows_of(const Tensor& t, int kv_heads, int total, int d, int first, int count) {
  std::vector<double> out;
  for (int h = 0; h < kv_heads; ++h) {
    const auto at = t.values.begin() + ptrdiff_t((size_t(h) * total + size_t(first)) * d);
    out.insert(out.end(), at, at + ptrdiff_t(size_t(count) * d));
  }
  return out;
}

// NaN (0xff bytes) in every row of a [1, kv_heads, total, d] tensor that no sequence owns.
void poison_unowned_rows(Tensor& t, const std::vector<std::pair<int, int>>& rows) {
  std::vector<char> owned(size_t(t.view.seq()), 0);
  for (const auto& [first, count] : rows) std::fill_n(owned.begin() + first, count, 1);
  std::vector<unsigned char> bytes = t.device.to_host();
  const size_t element = dtype_size(t.dtype);
  for (int64_t h = 0; h < t.view.heads(); ++h)
    for (int64_t row = 0; row < t.view.seq(); ++row)
      if (!owned[size_t(row)])
        for (int64_t e = 0; e < t.view.head_dim(); ++e)
          std::fill_n(bytes.begin() + ptrdiff_t(size_t(t.view.offset(0, h, row, e)) * element), element, 0xff);
  t.device.copy_from_host(bytes);
}

// Runs append_kv_varlen (validate_metadata off: the offsets may be out of order) and judges the
// cache and updated_lengths (one spare entry after the batch's, which must stay untouched).
::testing::AssertionResult check_packed_append(Context& ctx, const PackedAppend& c) {
  const std::string name = c.name();
  std::mt19937_64 rng = rng_for(name);
  TestCache cache = make_cache(ctx, c.cache, rng);
  const int batch = c.cache.batch, kv_heads = c.cache.kv_heads, d = c.cache.head_dim;
  const std::vector<std::pair<int, int>> rows = documented_rows(c);
  std::optional<TestRotary> rotary;
  DeviceBuffer<int32_t> positions(ctx, std::max<size_t>(c.positions.size(), 1), "rotary positions");
  if (c.rotary) {
    rotary = make_rotary(ctx, c.table_rows ? c.table_rows : rotary_rows_for(cache.image, c.max_seqlen),
                         c.rotary->first, c.rotary->second, rng);
    if (!c.positions.empty()) {
      positions.copy_from_host(c.positions);
      rotary->view.positions = positions.data();
    }
  }
  Tensor k_new = random_tensor(ctx, c.cache.dtype, 1, kv_heads, c.total, d, rng, kNewKeysLayout);
  Tensor v_new = random_tensor(ctx, c.cache.dtype, 1, kv_heads, c.total, d, rng, kNewValuesLayout);
  poison_unowned_rows(k_new, rows);
  poison_unowned_rows(v_new, rows);
  DeviceBuffer<int32_t> cu_seqlens(ctx, c.offsets.size(), "cu_seqlens_new");
  cu_seqlens.copy_from_host(c.offsets);
  DeviceBuffer<int32_t> updated(ctx, size_t(batch) + 1, "updated lengths");
  updated.fill_bytes(0xff);
  const std::vector<unsigned char> k_before = cache.k.to_host(), v_before = cache.v.to_host();

  AppendKvOptions options;
  options.updated_lengths = updated.data();
  if (rotary) options.rotary = rotary->view;
  append_kv_varlen(ctx, cache.view, k_new.view, v_new.view, cu_seqlens.data(), c.max_seqlen, options);
  ctx.synchronize();

  // The reference's append of each sequence alone, its rows and its rotary position.
  reference::KvCacheImage expected = cache.image;
  std::vector<int> counts;
  for (int b = 0; b < batch; ++b) {
    const auto [first, count] = rows[size_t(b)];
    counts.push_back(count);
    reference::KvCacheImage one = sequence_image(expected, b);
    std::optional<reference::RotaryTable> table;
    if (rotary) {
      table = rotary->table;
      if (!c.positions.empty()) table->positions = {c.positions[size_t(b)]};
    }
    reference::append_kv(one, rows_of(k_new, kv_heads, c.total, d, first, count),
                         rows_of(v_new, kv_heads, c.total, d, first, count), count, table ? &*table : nullptr);
    expected.k = std::move(one.k);
    expected.v = std::move(one.v);
  }
  const ::testing::AssertionResult result =
      check_appended_pools(name, cache, expected, k_before, v_before, append_targets(cache.image, counts),
                           rotary ? &rotary->table : nullptr);
  if (!result) return result;
  return check_updated_lengths(name, updated.to_host(), cache.image, counts);
}

// Rotary tables shorter than the positions a packed append reaches (Rotary: a position past the
// tables uses their last row, one before 0 the first). Default positions (lengths[b] + t): 12-row
// tables, sequence 0's tokens ending on the last row (9-11), sequence 2's from one past it
// (12-14), sequence 3's far past; the caller's positions (16-row tables): a run ending on the last
// row, one starting before 0, one crossing the end (15-17). Paged and contiguous, both pair
// layouts, the last rows of k_new owned by no sequence.
TEST(KvCacheVarlen, AppendAtTheRotaryTablesLastRowAndPastIt) {
  Context ctx;
  PackedAppend c;
  c.cache = paged(DType::f16, 4, 2, 64, 16, 3, {9, 0, 12, 30});
  c.offsets = {0, 3, 5, 8, 9};
  c.total = 11;
  c.max_seqlen = 3;
  c.rotary = std::pair{64, false};
  c.table_rows = 12;
  EXPECT_TRUE(check_packed_append(ctx, c));
  c.cache = contiguous(DType::bf16, 4, 1, 64, 40, {9, 0, 12, 30}, false);
  c.rotary = std::pair{32, true};
  c.table_rows = 16;
  c.positions = {13, -2, 15, 7};
  EXPECT_TRUE(check_packed_append(ctx, c));
}

// cu_seqlens_new out of order, past total and longer than max_seqlen_new, with validate_metadata
// off: the kernels take the documented rows (documented_rows: {0, 6, 3, 9, 20} over 12 rows with
// max_seqlen 4 gives sequence 0 rows 0-3 (6 cut to 4), sequence 1 none, sequence 2 rows 6-8 (not
// 3-8: row 3 is sequence 0's), sequence 3 rows 9-11 (20 clamped to 12), whose last token falls
// past the capacity and is dropped; {3, 1, 5, 2, 30} over 10 rows gives 0, 2 from row 3, 0 and
// 5 from row 5, and rows 0-2 belong to nobody). Nothing else of the cache is written, and each
// updated length is its sequence's length plus the rows it was given, at most the capacity.
// validate_metadata names the first bad entry instead, writing nothing.
TEST(KvCacheVarlen, AppendOffsetsOutOfOrderUnvalidated) {
  Context ctx;
  PackedAppend c;
  c.cache = paged(DType::f16, 4, 2, 64, 16, 3, {5, 15, 30, 46});
  c.offsets = {0, 6, 3, 9, 20};
  c.total = 12;
  c.max_seqlen = 4;
  EXPECT_TRUE(check_packed_append(ctx, c));
  PackedAppend shifted;
  shifted.cache = contiguous(DType::bf16, 4, 1, 64, 24, {0, 7, 3, 20}, true);
  shifted.offsets = {3, 1, 5, 2, 30};
  shifted.total = 10;
  shifted.max_seqlen = 8;
  shifted.rotary = std::pair{64, true};
  EXPECT_TRUE(check_packed_append(ctx, shifted));

  std::mt19937_64 rng = rng_for("packed append offsets validated");
  TestCache cache = make_cache(ctx, c.cache, rng);
  const Tensor k_new = random_tensor(ctx, DType::f16, 1, 2, c.total, 64, rng, kNewKeysLayout);
  DeviceBuffer<int32_t> cu_seqlens(ctx, c.offsets.size(), "cu_seqlens_new"), updated(ctx, 4, "updated lengths");
  cu_seqlens.copy_from_host(c.offsets);
  updated.fill_bytes(0xff);
  const std::vector<unsigned char> k_before = cache.k.to_host(), v_before = cache.v.to_host();
  AppendKvOptions options;
  options.updated_lengths = updated.data();
  options.validate_metadata = true;
  try {
    append_kv_varlen(ctx, cache.view, k_new.view, k_new.view, cu_seqlens.data(), c.max_seqlen, options);
    ADD_FAILURE() << "offsets out of order passed validate_metadata";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "append_kv_varlen: cu_seqlens_new[1] - cu_seqlens_new[0] = 6 exceeds max_seqlen_new = 4"),
              std::string::npos)
        << e.what();
  }
  ctx.synchronize();
  EXPECT_TRUE(cache.k.to_host() == k_before && cache.v.to_host() == v_before) << "the cache was written";
  EXPECT_EQ(updated.to_host(), std::vector<int32_t>(4, -1)) << "updated_lengths was written";
}

// append_kv_varlen writes what append_kv writes for each sequence alone (its tokens, its pages,
// its rotary positions; checked against the reference above and in test_kv_cache_append), bit for
// bit, and nothing else; updated_lengths advance by each sequence's own count. Then attention over
// the appended tokens with the new lengths.
TEST(KvCacheVarlen, AppendPackedEqualsAppendPerSequence) {
  Context ctx;
  // Paged bf16, contiguous f16, and a paged e4m3 cache (per kv head scales) fed bf16 tokens.
  for (int variant : {0, 1, 2}) {
    const bool paged_cache = variant != 1;
    CacheSpec spec = variant == 0   ? paged(DType::bf16, 4, 2, 64, 16, 4, {0, 15, 30, 62})
                     : variant == 1 ? contiguous(DType::f16, 4, 2, 64, 40, {3, 0, 20, 38}, false)
                                    : paged(DType::e4m3, 4, 2, 64, 16, 4, {0, 15, 30, 62});
    if (variant == 2) {
      spec.k_scale = {0.375f, 1.25f};
      spec.v_scale = {0.625f, 0.75f};
    }
    const DType new_dtype = is_fp8(spec.dtype) ? DType::bf16 : spec.dtype;
    const std::vector<int> counts = {5, 0, 17, 1};
    const std::vector<int32_t> offsets = {0, 5, 5, 22, 23};
    const int total = 25, seq_max = 17, d = 64;
    std::mt19937_64 rng = rng_for(spec.name() + " packed append");
    std::mt19937_64 same = rng;
    TestCache packed_cache = make_cache(ctx, spec, rng);
    TestCache single_cache = make_cache(ctx, spec, same);
    TestRotary rotary = make_rotary(ctx, 64, 32, false, rng);
    const std::vector<int32_t> rotary_start = {2, 0, 7, 40};
    DeviceBuffer<int32_t> positions(ctx, rotary_start.size(), "rotary positions");
    positions.copy_from_host(rotary_start);
    rotary.view.positions = positions.data();
    Tensor k_new = random_tensor(ctx, new_dtype, 1, spec.kv_heads, total, d, rng, kNewKeysLayout);
    Tensor v_new = random_tensor(ctx, new_dtype, 1, spec.kv_heads, total, d, rng, kNewValuesLayout);
    DeviceBuffer<int32_t> cu_seqlens(ctx, offsets.size(), "cu_seqlens_new");
    cu_seqlens.copy_from_host(offsets);
    DeviceBuffer<int32_t> packed_lengths(ctx, 4, "updated lengths"), single_lengths(ctx, 4, "updated lengths");
    AppendKvOptions options;
    options.rotary = rotary.view;
    options.updated_lengths = packed_lengths.data();
    options.validate_metadata = true;
    append_kv_varlen(ctx, packed_cache.view, k_new.view, v_new.view, cu_seqlens.data(), seq_max, options);
    for (int b = 0; b < 4; ++b) {
      KvCache one = single_cache.view;
      one.batch = 1;
      one.lengths = single_cache.view.lengths + b;
      if (paged_cache) {
        one.block_table = single_cache.view.block_table + b * one.max_pages_per_seq;
      } else {
        one.k.data = static_cast<unsigned char*>(one.k.data) + b * one.k.strides[0] * dtype_size(spec.dtype);
        one.v.data = static_cast<unsigned char*>(one.v.data) + b * one.v.strides[0] * dtype_size(spec.dtype);
        one.k.shape[0] = one.v.shape[0] = 1;
      }
      TensorView k_b = k_new.view, v_b = v_new.view;
      for (TensorView* view : {&k_b, &v_b}) {
        view->data =
            static_cast<unsigned char*>(view->data) + offsets[size_t(b)] * view->strides[2] * dtype_size(new_dtype);
        view->shape[2] = counts[size_t(b)];
      }
      AppendKvOptions single = options;
      single.rotary->positions = positions.data() + b;
      single.updated_lengths = single_lengths.data() + b;
      append_kv(ctx, one, k_b, v_b, single);
    }
    ctx.synchronize();
    EXPECT_EQ(packed_cache.k.to_host(), single_cache.k.to_host()) << spec.name();
    EXPECT_EQ(packed_cache.v.to_host(), single_cache.v.to_host()) << spec.name();
    EXPECT_EQ(packed_lengths.to_host(), single_lengths.to_host()) << spec.name();
    for (int b = 0; b < 4; ++b)
      EXPECT_EQ(packed_lengths.to_host()[size_t(b)], spec.lengths[size_t(b)] + counts[size_t(b)]) << b;

    // validate_metadata: a sequence whose new tokens overflow its capacity is named.
    const std::vector<int32_t> too_many = {0, 5, 5, 22, 25};
    cu_seqlens.copy_from_host(too_many);
    options.updated_lengths = nullptr;
    try {
      append_kv_varlen(ctx, packed_cache.view, k_new.view, v_new.view, cu_seqlens.data(), seq_max, options);
      ADD_FAILURE() << "an append past the capacity passed validate_metadata";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("append_kv_varlen: cache.lengths[3] expected <= "), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace selfattn
