// append_kv on the sim (kv_cache.h): exactly the new tokens' rows written, across page boundaries
// and the last partial page, with rotary up to the table's last row and past it, a batch index at
// the cache's row count, then attention over them. Cache K and V, k_new and v_new each have their
// own layout (kv_cache_check.h); every byte outside the new tokens' rows is compared
// (kv_append_check.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kernels/decode/kv_append.cuh"
#include "kv_append_check.h"
#include "kv_cache_check.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

using namespace kv_test;

// append_kv writes exactly the new tokens' rows (checked element by element against the reference,
// every other byte of the pool unchanged), across page boundaries, and attention then sees them.
// With rotary `positions` ([batch], Rotary::positions), token t of sequence b is rotated at
// positions[b] + t on the way in, and q's row i at positions[b] + q_step * i. The rotary tables
// have `table_rows` rows (0: up to the last token appended, rotary_rows_for) and rotate from
// `rotary_first_dim` on. `adjust`, when given, changes the cache after it is made and before the
// append (a view of fewer rows). A latent cache (spec.v_in_k) appends v_new as k_new's leading columns.
::testing::AssertionResult check_append_then_attend(Context& ctx, const CacheSpec& spec, int heads, int seq_new,
                                                    std::optional<std::pair<int, bool>> rotary_spec, Path path,
                                                    const std::vector<int32_t>& positions = {}, int q_step = 1,
                                                    int table_rows = 0,
                                                    const std::function<void(TestCache&)>& adjust = nullptr,
                                                    int rotary_first_dim = 0) {
  AttendCase c = attend(spec, heads, seq_new);
  c.rotary = rotary_spec;
  c.rotary_first_dim = rotary_first_dim;
  const std::string name = "append " + c.name() + " new" + std::to_string(seq_new) +
                           (table_rows ? " table" + std::to_string(table_rows) : "");
  std::mt19937_64 rng = rng_for(name);
  TestCache cache = make_cache(ctx, spec, rng);
  if (adjust) adjust(cache);
  std::optional<TestRotary> rotary;
  if (rotary_spec) {
    rotary = make_rotary(ctx, table_rows ? table_rows : rotary_rows_for(cache.image, seq_new), rotary_spec->first,
                         rotary_spec->second, rng);
  }
  DeviceBuffer<int32_t> rotary_positions(ctx, std::max<size_t>(positions.size(), 1), "rotary positions");
  if (rotary && !positions.empty()) {
    rotary_positions.copy_from_host(positions);
    rotary->view.positions = rotary_positions.data();
    rotary->table.positions = positions;
  }
  Tensor k_new = random_tensor(ctx, spec.dtype, spec.batch, spec.kv_heads, seq_new, spec.head_dim, rng, kNewKeysLayout);
  Tensor v_new = random_tensor(ctx, spec.dtype, spec.batch, spec.kv_heads, seq_new, spec.v_dim(), rng, kNewValuesLayout);
  if (spec.v_in_k) {  // a latent cache: v_new is k_new's leading columns, as the cache's V is K's
    v_new.view = k_new.view;
    v_new.view.shape[3] = spec.v_dim();
    v_new.values.clear();
    for (size_t row = 0; row < k_new.values.size() / size_t(spec.head_dim); ++row)
      v_new.values.insert(v_new.values.end(), k_new.values.begin() + ptrdiff_t(row * spec.head_dim),
                          k_new.values.begin() + ptrdiff_t(row * spec.head_dim + spec.v_dim()));
  }
  DeviceBuffer<int32_t> updated(ctx, size_t(spec.batch), "updated lengths");
  updated.fill_bytes(0xff);
  const std::vector<unsigned char> k_before = cache.k.to_host(), v_before = cache.buffer(1).to_host();

  AppendKvOptions options;
  options.updated_lengths = updated.data();
  if (rotary) {
    rotary->view.first_dim = rotary->table.first_dim = rotary_first_dim;
    options.rotary = rotary->view;
  }
  append_kv(ctx, cache.view, k_new.view, v_new.view, options);
  ctx.synchronize();

  reference::KvCacheImage expected = cache.image;
  reference::append_kv(expected, k_new.values, v_new.values, seq_new, rotary ? &rotary->table : nullptr);
  const std::vector<int> counts(size_t(spec.batch), seq_new);
  ::testing::AssertionResult result =
      check_appended_pools(name, cache, expected, k_before, v_before, append_targets(cache.image, counts),
                           rotary ? &rotary->table : nullptr);
  if (!result) return result;
  const std::vector<int32_t> new_lengths = updated.to_host();
  result = check_updated_lengths(name, new_lengths, cache.image, counts);
  if (!result) return result;
  // Attend with the updated lengths over what the device wrote (the reference fed the rounded cache).
  cache.image.k = download_pool(cache, 0);
  cache.image.v = download_pool(cache, 1);
  cache.image.lengths = new_lengths;
  cache.view.lengths = updated.data();
  if (rotary && !positions.empty()) rotary->view.position_step = rotary->table.position_step = q_step;
  return attend_and_check(ctx, c, cache, path, rng, rotary ? &*rotary : nullptr);
}

TEST(KvCacheAppend, AcrossPageBoundariesThenAttend) {
  Context ctx;
  // Lengths ending just before, on and after a page boundary; 7 new tokens cross it.
  EXPECT_TRUE(check_append_then_attend(ctx, paged(DType::f16, 4, 2, 64, 16, 3, {9, 15, 16, 0}), 4, 7, std::nullopt,
                                       Path::fused));
  EXPECT_TRUE(check_append_then_attend(ctx, paged(DType::bf16, 3, 1, 128, 16, 2, {0, 17, 31}, false), 8, 1,
                                       std::nullopt, Path::naive));
  // Page size 1: every token its own page.
  EXPECT_TRUE(check_append_then_attend(ctx, paged(DType::f32, 2, 2, 64, 1, 12, {0, 4}), 2, 7, std::nullopt,
                                       Path::cublas));
  // Contiguous, BSHD; the last sequence is full up to 3 slots: 4 of its 7 tokens are dropped.
  EXPECT_TRUE(check_append_then_attend(ctx, contiguous(DType::f16, 2, 2, 64, 23, {3, 20}, false), 2, 7, std::nullopt,
                                       Path::fused));
}

// A contiguous cache with a batch index (FlashAttention's cache_batch_idx): sequence b appends to
// and reads row batch_index[b] of a cache with more rows than sequences; a row outside the cache
// drops its tokens and reads as no token, every other row untouched.
TEST(KvCacheAppend, BatchIndexMapsSequencesToRows) {
  Context ctx;
  CacheSpec spec = contiguous(DType::f16, 3, 2, 64, 20, {3, 0, 7}, true);
  spec.batch_index = {4, 0, 2};
  spec.cache_rows = 5;
  for (Path path : {Path::fused, Path::naive}) {
    EXPECT_TRUE(check_append_then_attend(ctx, spec, 4, 5, std::nullopt, path));
  }
  spec = contiguous(DType::f32, 3, 1, 32, 9, {2, 4, 1}, false);
  spec.batch_index = {1, 7, -1};  // two rows outside the cache's 3
  spec.cache_rows = 3;
  EXPECT_TRUE(check_append_then_attend(ctx, spec, 2, 3, std::nullopt, Path::cublas));
}

TEST(KvCacheAppend, RotaryOnKeysAndQueries) {
  Context ctx;
  EXPECT_TRUE(check_append_then_attend(ctx, paged(DType::f16, 2, 2, 64, 16, 2, {14, 3}), 4, 7,
                                       std::make_pair(64, true), Path::fused));
  EXPECT_TRUE(check_append_then_attend(ctx, paged(DType::f32, 2, 1, 64, 16, 2, {5, 16}), 2, 3,
                                       std::make_pair(48, false), Path::naive));
  EXPECT_TRUE(check_append_then_attend(ctx, contiguous(DType::bf16, 1, 1, 128, 20, {11}, true), 1, 1,
                                       std::make_pair(128, false), Path::cublas));
}

// K and V rows of different lengths (MLA's (192, 128), and V longer than K), then a latent cache
// whose V is a view of K's leading columns: the append writes K's rows whole, rotary on the rope
// part only (Rotary::first_dim), and attention reads V from them, on each path.
TEST(KvCacheAppend, TwoHeadDimsAndLatentCaches) {
  Context ctx;
  CacheSpec mla = paged(DType::bf16, 2, 2, 192, 16, 2, {15, 3});
  mla.head_dim_v = 128;
  EXPECT_TRUE(check_append_then_attend(ctx, mla, 4, 3, std::make_pair(64, false), Path::fused));
  CacheSpec wider_v = contiguous(DType::f32, 2, 1, 32, 13, {0, 7}, true);
  wider_v.head_dim_v = 64;
  EXPECT_TRUE(check_append_then_attend(ctx, wider_v, 2, 5, std::nullopt, Path::cublas));
  CacheSpec latent = paged(DType::f16, 2, 1, 96, 16, 3, {16, 30});
  latent.head_dim_v = 64;
  latent.v_in_k = true;
  for (Path path : {Path::fused, Path::naive}) {
    for (bool interleaved : {false, true}) {
      EXPECT_TRUE(check_append_then_attend(ctx, latent, 8, 2, std::make_pair(32, interleaved), path, {}, 1, 0, nullptr,
                                           /*rotary_first_dim=*/64));
    }
  }
}

// kv_append writes KvAppendTraits::kRowsPerBlock new tokens per block: seq_new one below, at and
// one above a block's rows, the new tokens ending in the last page (one sequence exactly at the
// capacity, one a token past it: that token dropped), K rotated up to the tables' last row.
// Rotary at the caller's positions (Rotary::positions): new tokens at positions[b] + t (left
// padding: counted from the first real token), q's rows at positions[b] + i, or all at positions[b]
// (position_step 0, FlashAttention's q when a call is neither causal nor local).
TEST(KvCacheAppend, RotaryAtTheCallersPositions) {
  Context ctx;
  const CacheSpec spec = paged(DType::f16, 3, 2, 64, 16, 3, {9, 0, 20});
  EXPECT_TRUE(check_append_then_attend(ctx, spec, 4, 3, std::pair{64, false}, Path::fused, {3, 0, 15}, 1));
  EXPECT_TRUE(check_append_then_attend(ctx, spec, 4, 3, std::pair{32, true}, Path::naive, {5, 2, 0}, 0));
}

// Rotary tables shorter than the positions a call reaches (only wrong lengths or positions do
// that, kv_cache.h): a position on the tables' last row uses it, a position past the tables uses
// it too and one before 0 the first row (Rotary: "the nearest row"), for the keys appended and the
// queries then rotated (the reference clamps alike). Default positions: 3 new tokens after lengths
// 9, 0, 12 with 12-row tables - sequence 0's last token on the last row, sequence 2's tokens and
// query rows at 12-14, the first of them exactly one row past. The caller's positions (20-row
// tables): runs ending on the last row, crossing it (18-21) and starting at -2; with q's
// position_step 0, every row of a sequence at 19, 23 or -5.
TEST(KvCacheAppend, RotaryAtTheTablesLastRowAndPastIt) {
  Context ctx;
  const std::vector<int32_t> lengths = {9, 0, 12};
  EXPECT_TRUE(check_append_then_attend(ctx, paged(DType::f16, 3, 2, 64, 16, 2, lengths), 4, 3, std::pair{64, false},
                                       Path::fused, {}, 1, 12));
  EXPECT_TRUE(check_append_then_attend(ctx, contiguous(DType::f32, 3, 1, 64, 24, lengths, false), 2, 3,
                                       std::pair{32, true}, Path::naive, {}, 1, 12));
  constexpr int kTableRows = 20;
  const CacheSpec spec = paged(DType::bf16, 3, 2, 64, 16, 3, lengths);
  EXPECT_TRUE(check_append_then_attend(ctx, spec, 4, 4, std::pair{64, true}, Path::fused,
                                       {kTableRows - 4, kTableRows - 2, -2}, 1, kTableRows));
  EXPECT_TRUE(check_append_then_attend(ctx, spec, 4, 4, std::pair{48, false}, Path::cublas,
                                       {kTableRows - 1, kTableRows + 3, -5}, 0, kTableRows));
}

// A batch index equal to the cache's row count: the first row outside it, which reads as no token
// and is never written (KvCache::batch_index). The cache is the first 3 rows of a buffer of 4; the
// 4th, just past the view, holds NaN and must keep its bytes, so a kernel that took row 3 as the
// cache's would read NaN or write it. append_kv drops that sequence's tokens (its updated length
// still advances), attention then reads it as zeros on every path; validate_metadata refuses the
// entry, naming it, before anything is written.
TEST(KvCacheAppend, BatchIndexAtTheCachesRowCount) {
  Context ctx;
  constexpr int kRows = 3;
  CacheSpec spec = contiguous(DType::f16, 3, 2, 64, 20, {3, 5, 7}, true);
  spec.batch_index = {kRows, 0, 2};
  spec.cache_rows = kRows + 1;
  const auto view_rows = [&](TestCache& cache) {
    for (DeviceBuffer<unsigned char>* pool : {&cache.k, &cache.v}) {
      std::vector<unsigned char> bytes = pool->to_host();
      std::fill(bytes.begin() + ptrdiff_t(bytes.size() / (kRows + 1) * kRows), bytes.end(), 0xff);
      pool->copy_from_host(bytes);
    }
    cache.view.k.shape[0] = cache.view.v.shape[0] = kRows;
    cache.image.num_pages = kRows;
  };
  for (Path path : {Path::fused, Path::naive, Path::cublas})
    EXPECT_TRUE(check_append_then_attend(ctx, spec, 4, 5, std::pair{64, false}, path, {}, 1, 0, view_rows));

  std::mt19937_64 rng = rng_for("batch index at the row count");
  TestCache cache = make_cache(ctx, spec, rng);
  view_rows(cache);
  const std::vector<unsigned char> k_before = cache.k.to_host(), v_before = cache.v.to_host();
  Tensor k_new = random_tensor(ctx, spec.dtype, spec.batch, spec.kv_heads, 2, spec.head_dim, rng, kNewKeysLayout);
  Tensor q = random_tensor(ctx, spec.dtype, spec.batch, 4, 2, spec.head_dim, rng, kQueryLayout);
  const Output out = poisoned_output(ctx, spec.dtype, spec.batch, 4, 2, spec.head_dim, kOutLayout);
  DeviceBuffer<int32_t> updated(ctx, size_t(spec.batch), "updated lengths");
  updated.fill_bytes(0xff);
  const std::string message = "cache.batch_index[0] expected a row in [0, 3) (cache.k.shape[0]), got 3";
  const auto expect_refused = [&](const char* call, const std::function<void()>& run) {
    try {
      run();
      ADD_FAILURE() << call << ": a batch index at the row count passed validate_metadata";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  };
  AppendKvOptions append;
  append.validate_metadata = true;
  append.updated_lengths = updated.data();
  expect_refused("append_kv", [&] { append_kv(ctx, cache.view, k_new.view, k_new.view, append); });
  KvAttentionOptions attend;
  attend.validate_metadata = true;
  expect_refused("attention_with_kv_cache",
                 [&] { attention_with_kv_cache(ctx, q.view, cache.view, out.view, attend); });
  ctx.synchronize();
  EXPECT_TRUE(cache.k.to_host() == k_before && cache.v.to_host() == v_before) << "the cache was written";
  EXPECT_EQ(updated.to_host(), std::vector<int32_t>(size_t(spec.batch), -1)) << "updated_lengths was written";
  EXPECT_EQ(out.device.to_host(), std::vector<unsigned char>(out.device.size(), 0xff)) << "out was written";
}

TEST(KvCacheAppend, NewTokensAroundEachBlock) {
  Context ctx;
  constexpr int kRows = kernels::KvAppendTraits::kRowsPerBlock;
  constexpr int kPage = 16, kPages = 3, kCapacity = kPage * kPages;
  for (int seq_new : {kRows - 1, kRows, kRows + 1}) {
    const CacheSpec spec = paged(DType::f16, 3, 2, 64, kPage, kPages, {kCapacity - seq_new, kCapacity - seq_new + 1, kPage - 1},
                                 seq_new % 2 == 0);
    EXPECT_TRUE(check_append_then_attend(ctx, spec, 4, seq_new, std::make_pair(64, seq_new % 2 == 1), Path::fused));
  }
}

// Tokens with no element (no kv head, or head_dim 0) are still tokens: updated_lengths advances by
// seq_new, clamped to the capacity, and nothing else is written.
TEST(KvCacheAppend, TokensWithoutElementsStillAdvanceUpdatedLengths) {
  Context ctx;
  DeviceBuffer<int32_t> lengths(ctx, 2, "lengths"), updated(ctx, 2, "updated");
  lengths.copy_from_host(std::vector<int32_t>{5, 14});
  for (const auto& [kv_heads, head_dim] : {std::pair<int, int>{0, 64}, {2, 0}}) {
    updated.copy_from_host(std::vector<int32_t>{-99, -99});
    const TensorView cache_k = TensorView::bhsd(nullptr, DType::f16, 2, kv_heads, 16, head_dim);
    const TensorView k_new = TensorView::bhsd(nullptr, DType::f16, 2, kv_heads, 3, head_dim);
    AppendKvOptions options;
    options.updated_lengths = updated.data();
    append_kv(ctx, KvCache::contiguous(cache_k, cache_k, lengths.data()), k_new, k_new, options);
    EXPECT_EQ(updated.to_host(), (std::vector<int32_t>{8, 16})) << "kv_heads " << kv_heads << ", head_dim " << head_dim;
  }
}

// rotary_embedding on its own: every element against the reference's rotation (rounded once to
// the dtype), at positions[b] + step * s or at s; both pair layouts, rotary_dim below head_dim
// (the rest copied exactly), fp32, f16 and bf16 tables, each tensor its own layout; then the checks.
TEST(RotaryEmbedding, AgainstTheReference) {
  Context ctx;
  struct Case {
    DType dtype;
    int batch, heads, seq, d, rotary_dim;
    bool interleaved;
    std::vector<int32_t> positions;
    int step;
    DType tables;  // f16/bf16 tables are read as they are
  };
  for (const Case& c : {Case{DType::f16, 2, 3, 7, 64, 64, false, {}, 1, DType::f32},
                        Case{DType::bf16, 3, 2, 5, 32, 16, true, {4, 0, 30}, 1, DType::bf16},
                        Case{DType::f32, 2, 1, 6, 8, 6, false, {2, 9}, 0, DType::f16}}) {
    std::mt19937_64 rng = rng_for("rotary_embedding " + std::to_string(int(c.dtype)));
    const Tensor x = random_tensor(ctx, c.dtype, c.batch, c.heads, c.seq, c.d, rng, kQueryLayout);
    const Output out = poisoned_output(ctx, c.dtype, c.batch, c.heads, c.seq, c.d, kOutLayout);
    TestRotary rotary = make_rotary(ctx, 40, c.rotary_dim, c.interleaved, rng, c.tables);
    DeviceBuffer<int32_t> positions(ctx, std::max<size_t>(c.positions.size(), 1), "positions");
    if (!c.positions.empty()) {
      positions.copy_from_host(c.positions);
      rotary.view.positions = positions.data();
      rotary.table.positions = c.positions;
    }
    rotary.view.position_step = rotary.table.position_step = c.step;
    rotary_embedding(ctx, x.view, out.view, rotary.view);
    ctx.synchronize();
    std::vector<float> got;
    ASSERT_TRUE(download_output("rotary_embedding out", out.device, out.view, got));
    std::vector<double> want = x.values;
    testing::Expected judged = exact_copy(want);
    for (int b = 0; b < c.batch; ++b)
      for (int h = 0; h < c.heads; ++h)
        for (int s = 0; s < c.seq; ++s) {
          const size_t row = ((size_t(b) * c.heads + h) * c.seq + size_t(s)) * size_t(c.d);
          std::vector<double> rotated(x.values.begin() + long(row), x.values.begin() + long(row) + c.d);
          reference::rotate_row(rotated.data(), c.d, int(rotary.table.position(b, 0, s)), rotary.table);
          for (int e = 0; e < c.rotary_dim; ++e) {  // rounded once from fp32 (see check_append_then_attend)
            judged.exact[row + size_t(e)] = rotated[size_t(e)];
            judged.allowed[row + size_t(e)] = round_to(c.dtype, float(rotated[size_t(e)]));
            const int partner =
                c.interleaved ? e ^ 1 : (e < c.rotary_dim / 2 ? e + c.rotary_dim / 2 : e - c.rotary_dim / 2);
            judged.scale[row + size_t(e)] =
                std::sqrt(2.0) * std::hypot(x.values[row + size_t(e)], x.values[row + size_t(partner)]);
            judged.floor[row + size_t(e)] = testing::rounding_floor(c.dtype, 4, judged.scale[row + size_t(e)]);
          }
        }
    EXPECT_TRUE(judge_values("rotary_embedding", got, judged));
  }
  // The checks: out over x, a position step of 2.
  std::mt19937_64 rng = rng_for("rotary_embedding checks");
  const Tensor x = random_tensor(ctx, DType::f16, 1, 1, 4, 16, rng, kQueryLayout);
  TestRotary rotary = make_rotary(ctx, 8, 16, false, rng);
  EXPECT_THROW(rotary_embedding(ctx, x.view, x.view, rotary.view), InvalidArgument);
  const Output out = poisoned_output(ctx, DType::f16, 1, 1, 4, 16, kOutLayout);
  rotary.view.position_step = 2;
  try {
    rotary_embedding(ctx, x.view, out.view, rotary.view);
    ADD_FAILURE() << "position_step 2 accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("rotary.position_step expected 0 or 1, got 2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace selfattn
