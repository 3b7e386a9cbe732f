// Packed calls over a KV cache (kv_cache.h, "Packed calls"): attention_with_kv_cache_varlen (and
// append_kv_varlen: test_kv_cache_varlen_append.cpp), where each sequence has its own number of new
// rows (0 allowed), as a serving engine's step mixes prefill chunks and single-token decodes. Every
// path against the reference: sequence b of a packed call is judged as the dense call of that
// sequence alone (its rows, its cache pages, its slice of every per-sequence option). Rows no
// sequence owns stay poisoned.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "kv_cache_check.h"
#include "runtime/context_state.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

using namespace kv_test;

const Path kPaths[] = {Path::naive, Path::cublas, Path::fused};

struct PackedCase {
  CacheSpec cache;
  int heads = 1;
  std::vector<int> rows;  // new query rows of each sequence
  int spare_rows = 2;     // rows of q and out past the last sequence's: no sequence owns them
  Causal causal = Causal::bottom_right;
  std::vector<int32_t> q_offset;               // empty, or [batch]
  std::optional<std::pair<int, bool>> rotary;  // (rotary_dim, interleaved) on q
  std::vector<int32_t> rotary_positions;       // empty, or [batch] (Rotary::positions)
  int rotary_rows = 0;  // the tables' rows; 0: up to the last position a row reaches (with max_seqlen rows)
  int num_splits = 0;
  testing::ScoreModsCase mods;  // the bias is [batch, heads, max_seqlen_q, capacity]
  std::optional<DType> query_dtype;  // q's and out's when not the cache's (an FP8 cache)

  int max_seqlen() const { return rows.empty() ? 0 : *std::max_element(rows.begin(), rows.end()); }
  std::vector<int32_t> offsets() const {
    std::vector<int32_t> cu(1, 0);
    for (int n : rows) cu.push_back(cu.back() + n);
    return cu;
  }
  int total() const { return offsets().back() + spare_rows; }
  std::string name() const {
    std::string s = (query_dtype ? std::string("q ") + to_string(*query_dtype) + " " : std::string()) + cache.name() +
                    " h" + std::to_string(heads) + " rows=[";
    for (int n : rows) s += std::to_string(n) + ",";
    s += "] " + std::string(to_string(causal));
    if (!q_offset.empty()) s += " q_offset";
    if (rotary) s += " rotary" + std::to_string(rotary->first) + (rotary_positions.empty() ? "" : " positions");
    if (rotary_rows) s += " table" + std::to_string(rotary_rows);
    if (num_splits) s += " splits" + std::to_string(num_splits);
    return s + mods.name();
  }
};

// Sequence b's problem: its rows, its key start and offset, its ALiBi slopes and bias rows.
reference::Problem sequence_problem(const reference::Problem& all, int b, int rows, int max_seqlen) {
  reference::Problem one = all;
  one.batch = 1;
  one.seq_q = rows;
  if (!all.key_start.empty()) one.key_start = {all.key_start[size_t(b)]};
  if (!all.q_offset.empty()) one.q_offset = {all.q_offset[size_t(b)]};
  if (all.alibi_slopes.size() == size_t(all.batch) * all.heads) {
    const auto first = all.alibi_slopes.begin() + ptrdiff_t(b) * all.heads;
    one.alibi_slopes.assign(first, first + all.heads);
  }
  if (!all.bias.empty()) {
    one.bias.clear();
    const size_t keys = size_t(all.seq_k);
    for (int h = 0; h < all.heads; ++h) {
      const auto first = all.bias.begin() + ptrdiff_t(((size_t(b) * all.heads + h) * max_seqlen) * keys);
      one.bias.insert(one.bias.end(), first, first + ptrdiff_t(size_t(rows) * keys));
    }
  }
  return one;
}

// Runs attention_with_kv_cache_varlen and judges each sequence's rows (out and lse) against the
// dense reference of that sequence alone; rows no sequence owns must still hold the poison.
::testing::AssertionResult check_packed(Context& ctx, const PackedCase& c, Path path) {
  const std::string what = c.name() + " " + to_string(path);
  std::mt19937_64 rng = rng_for(what);
  const TestCache cache = make_cache(ctx, c.cache, rng);
  const DType dtype = c.query_dtype ? *c.query_dtype : c.cache.dtype;
  const int batch = c.cache.batch, d = c.cache.head_dim, dv = c.cache.v_dim(), total = c.total();
  const int max_seqlen = c.max_seqlen();
  const std::vector<int32_t> offsets = c.offsets();
  Tensor q = random_tensor(ctx, dtype, 1, c.heads, total, d, rng, kQueryLayout);
  const Output out = poisoned_output(ctx, dtype, 1, c.heads, total, dv, kOutLayout);
  DeviceBuffer<unsigned char> lse = poisoned(ctx, DType::f32, size_t(c.heads) * total);
  DeviceBuffer<int32_t> cu_seqlens(ctx, offsets.size(), "cu_seqlens_q");
  cu_seqlens.copy_from_host(offsets);

  KvAttentionOptions options;
  options.path = path;
  options.causal = c.causal;
  options.num_splits = c.num_splits;
  options.lse = reinterpret_cast<float*>(lse.data());
  reference::Problem problem;
  problem.batch = batch;
  problem.heads = c.heads;
  problem.kv_heads = c.cache.kv_heads;
  problem.head_dim = d;
  problem.causal = c.causal;
  problem.seq_q = max_seqlen;
  problem.seq_k = int(cache.image.capacity());
  const SequenceOffsets sequence_offsets =
      upload_sequence_offsets(ctx, c.cache.key_start, c.q_offset, options, problem);
  std::optional<TestRotary> rotary;
  DeviceBuffer<int32_t> positions(ctx, std::max<size_t>(c.rotary_positions.size(), 1), "rotary positions");
  if (c.rotary) {
    int rows = c.rotary_rows;
    if (rows == 0) {
      rows = rotary_rows_for(cache.image, 0);
      for (int32_t p : c.rotary_positions) rows = std::max(rows, p + max_seqlen);
    }
    rotary = make_rotary(ctx, rows, c.rotary->first, c.rotary->second, rng);
    if (!c.rotary_positions.empty()) {
      positions.copy_from_host(c.rotary_positions);
      rotary->view.positions = positions.data();
      rotary->table.positions = c.rotary_positions;
    }
    options.rotary = rotary->view;
  }
  testing::ScoreModsData mods;
  if (c.mods.any()) {
    mods = testing::make_score_mods(ctx, c.mods, dtype, batch, c.heads, max_seqlen, problem.seq_k, rng);
    mods.apply(c.mods, options);
    mods.apply(c.mods, problem);
  }

  attention_with_kv_cache_varlen(ctx, q.view, cu_seqlens.data(), max_seqlen, cache.view, out.view, options);
  ctx.synchronize();

  std::vector<float> out_values;
  ::testing::AssertionResult result = download_output(what + " out", out.device, out.view, out_values);
  if (!result) return result;
  const std::vector<float> lse_values = download(lse, DType::f32, size_t(c.heads) * total);
  // Each sequence's rows in [heads, rows] order, beside its expected values.
  testing::AttentionExpected expected;
  expected.out.row_length = dv;
  std::vector<float> out_judged, lse_judged;
  std::vector<char> owned(size_t(total), 0);
  for (int b = 0; b < batch; ++b) {
    const int rows = c.rows[size_t(b)], first = offsets[size_t(b)];
    if (rows == 0) continue;
    std::vector<double> q_b;
    for (int h = 0; h < c.heads; ++h)
      for (int i = 0; i < rows; ++i) {
        const size_t row = size_t(h) * total + size_t(first + i);
        q_b.insert(q_b.end(), q.values.begin() + ptrdiff_t(row * d), q.values.begin() + ptrdiff_t((row + 1) * d));
        out_judged.insert(out_judged.end(), out_values.begin() + ptrdiff_t(row * dv),
                          out_values.begin() + ptrdiff_t((row + 1) * dv));
        lse_judged.push_back(lse_values[size_t(h) * total + size_t(first + i)]);
        owned[size_t(first + i)] = 1;
      }
    std::optional<reference::RotaryTable> rotary_b;
    if (rotary) {
      rotary_b = rotary->table;
      if (!c.rotary_positions.empty()) rotary_b->positions = {c.rotary_positions[size_t(b)]};
    }
    const testing::AttentionExpected part =
        expected_kv_attention(sequence_problem(problem, b, rows, max_seqlen), q_b, sequence_image(cache.image, b),
                              dtype, rotary_b ? &*rotary_b : nullptr);
    expected.out.append(part.out);
    expected.lse.append(part.lse);
  }
  for (int h = 0; h < c.heads; ++h)
    for (int row = 0; row < total; ++row) {
      if (owned[size_t(row)]) continue;
      const size_t at = size_t(h) * total + size_t(row);
      if (!std::isnan(lse_values[at]) || !std::isnan(out_values[at * dv])) {
        return ::testing::AssertionFailure()
               << what << ": row " << row << " of head " << h << " belongs to no sequence but was written";
      }
    }
  result = judge_values(what + " out", out_judged, expected.out);
  if (!result) return result;
  return judge_values(what + " lse", lse_judged, expected.lse);
}

PackedCase packed(CacheSpec cache, int heads, std::vector<int> rows, Causal causal = Causal::bottom_right) {
  PackedCase c;
  c.cache = std::move(cache);
  c.heads = heads;
  c.rows = std::move(rows);
  c.causal = causal;
  return c;
}

// A step of continuous batching: single-token decodes, a sequence with no new row, prefill chunks
// longer than one block's 16 rows (GQA groups of 4 and 8 heads), a chunk longer than its cache
// (rows before position 0 see no key), every dtype, both kernels of the fused path (the tensor-core
// one at head_dim 64/128 with 16-byte rows), paged and contiguous.
TEST(KvCacheVarlen, MixedPrefillAndDecodeEveryPath) {
  Context ctx;
  std::vector<PackedCase> cases;
  cases.push_back(packed(paged(DType::f16, 5, 1, 64, 16, 4, {17, 5, 40, 1, 60}), 4, {1, 0, 7, 1, 33}));
  cases.push_back(packed(paged(DType::bf16, 3, 2, 128, 16, 3, {33, 3, 48}, false), 4, {1, 5, 1}));
  cases.push_back(packed(paged(DType::f32, 4, 1, 32, 1, 40, {0, 9, 38, 20}), 2, {3, 1, 17, 20}, Causal::none));
  cases.push_back(packed(contiguous(DType::f16, 3, 2, 64, 50, {50, 12, 31}, false), 8, {2, 13, 1}));
  for (const PackedCase& c : cases)
    for (Path path : kPaths) EXPECT_TRUE(check_packed(ctx, c, path));
}

// Packed calls over caches with two head dims: V in its own pool (192, 128) and latent caches
// (V a view of K's leading columns, MQA, 1-2 rows per sequence as speculative decoding has them).
TEST(KvCacheVarlen, TwoHeadDimsEveryPath) {
  Context ctx;
  CacheSpec mla = paged(DType::bf16, 3, 2, 192, 16, 3, {33, 3, 48});
  mla.head_dim_v = 128;
  CacheSpec latent = paged(DType::f16, 3, 1, 96, 16, 2, {20, 0, 32});
  latent.head_dim_v = 64;
  latent.v_in_k = true;
  // DeepSeek's (576, 512): the fused path's latent kernel, a sequence with no row among them.
  CacheSpec deepseek = paged(DType::bf16, 3, 1, 576, 64, 2, {70, 128, 9});
  deepseek.head_dim_v = 512;
  deepseek.v_in_k = true;
  for (const PackedCase& c : {packed(mla, 4, {1, 5, 1}), packed(latent, 16, {2, 1, 0}), packed(deepseek, 16, {2, 0, 1})})
    for (Path path : kPaths) EXPECT_TRUE(check_packed(ctx, c, path));
}

// The split-KV kernel's work division: one split, 3, more splits than tiles; a sequence of
// max_seqlen rows beside ones of 1; every row of out owned (no spare rows), or spare rows that the
// combine of the splits must leave alone, also when its blocks each serve several rows.
TEST(KvCacheVarlen, SplitCounts) {
  Context ctx;
  for (int splits : {1, 3, 64})
    for (DType dtype : {DType::f16, DType::f32}) {
      PackedCase c = packed(paged(dtype, 3, 1, 64, 16, 8, {113, 1, 64}), 8, {1, 1, 7});
      c.num_splits = splits;
      c.spare_rows = dtype == DType::f16 ? 0 : 3;
      EXPECT_TRUE(check_packed(ctx, c, Path::fused));
    }
  // decode_combine with fewer blocks than rows (ContextState::decode_combine_max_blocks): each
  // block strides over 32 of the 8 heads x 12 rows, skipping the rows no sequence owns.
  ctx.state().decode_combine_max_blocks = 3;
  PackedCase c = packed(paged(DType::f32, 3, 1, 64, 16, 8, {113, 1, 64}), 8, {1, 1, 7});
  c.num_splits = 3;
  c.spare_rows = 3;
  EXPECT_TRUE(check_packed(ctx, c, Path::fused)) << "3 combine blocks";
}

// Per-sequence options follow the sequence: left padding (key_start) and query positions
// (q_offset), ALiBi [batch, heads], a bias [batch, heads, max_seqlen_q, capacity] of which each
// sequence reads its first rows, sinks, softcap and a window; rotary on q at the default positions
// (each sequence's last rows) and at given ones.
TEST(KvCacheVarlen, MasksModifiersAndRotaryPerSequence) {
  Context ctx;
  testing::ScoreModsCase mods;
  mods.window_left = 20;
  mods.softcap = 12.0f;
  mods.alibi = testing::AlibiSlopes::batch_heads;
  mods.bias = testing::BiasLayout::full;
  mods.masked_key_period = 5;
  mods.sinks = true;
  for (Path path : kPaths) {
    CacheSpec spec = paged(DType::f16, 3, 2, 64, 16, 4, {50, 30, 64});
    spec.key_start = {10, 0, 16};
    PackedCase c = packed(spec, 4, {7, 1, 3});
    c.q_offset = {30, 28, 20};
    c.mods = mods;
    EXPECT_TRUE(check_packed(ctx, c, path));
    PackedCase rotated = packed(paged(DType::bf16, 3, 1, 64, 16, 3, {20, 5, 40}), 2, {4, 0, 9});
    rotated.rotary = std::make_pair(32, false);
    EXPECT_TRUE(check_packed(ctx, rotated, path));
    rotated.rotary = std::make_pair(64, true);
    rotated.rotary_positions = {3, 0, 17};
    EXPECT_TRUE(check_packed(ctx, rotated, path));
  }
}

// Rotary on q with tables shorter than the positions its rows reach (Rotary: a position past the
// tables uses their last row, one before 0 the first), every path. Default positions (each
// sequence's last rows, lengths[b] - n_b + i) with 20-row tables: sequence 0's rows end on the
// last row (16-19), sequence 1's 3 rows over a length of 1 start before 0 (-2..0), sequence 2's
// run from 16 to 24, past the tables. The caller's positions: runs ending on the last row,
// starting at -2, and crossing the end (17-25).
TEST(KvCacheVarlen, RotaryAtTheTablesLastRowAndPastIt) {
  Context ctx;
  for (Path path : kPaths) {
    PackedCase c = packed(paged(DType::f16, 3, 1, 64, 16, 3, {20, 1, 25}), 2, {4, 3, 9});
    c.rotary = std::make_pair(64, false);
    c.rotary_rows = 20;
    EXPECT_TRUE(check_packed(ctx, c, path));
    c.cache = contiguous(DType::f32, 3, 2, 32, 30, {20, 1, 25}, true);
    c.heads = 4;
    c.rotary = std::make_pair(32, true);
    c.rotary_positions = {16, -2, 17};
    EXPECT_TRUE(check_packed(ctx, c, path));
  }
}

// When every sequence has the same number of rows, the packed call is the dense call: the same
// kernels over the same rows, so out and lse agree bit for bit (fused path, explicit splits).
TEST(KvCacheVarlen, EqualRowsMatchTheDenseCallBitwise) {
  Context ctx;
  for (DType dtype : {DType::bf16, DType::f32}) {
    const CacheSpec spec = paged(dtype, 3, 2, 64, 16, 3, {40, 7, 33});
    std::mt19937_64 rng = rng_for(std::string("equal rows ") + to_string(dtype));
    const TestCache cache = make_cache(ctx, spec, rng);
    const int heads = 4, rows = 3, d = 64;
    // One packed [1, heads, 3 * rows, d] q viewed as dense [3, heads, rows, d] (BSHD both ways).
    Tensor q = random_tensor(ctx, dtype, 1, heads, 3 * rows, d, rng, Layout{false, 0});
    TensorView q_dense = TensorView::bshd(q.device.data(), dtype, 3, heads, rows, d);
    Output packed_out = poisoned_output(ctx, dtype, 1, heads, 3 * rows, d, Layout{false, 0});
    Output dense_out = poisoned_output(ctx, dtype, 3, heads, rows, d, Layout{false, 0});
    const std::vector<int32_t> offsets = {0, rows, 2 * rows, 3 * rows};
    DeviceBuffer<int32_t> cu_seqlens(ctx, offsets.size(), "cu_seqlens_q");
    cu_seqlens.copy_from_host(offsets);
    KvAttentionOptions options;
    options.path = Path::fused;
    options.num_splits = 2;
    attention_with_kv_cache_varlen(ctx, q.view, cu_seqlens.data(), rows, cache.view, packed_out.view, options);
    attention_with_kv_cache(ctx, q_dense, cache.view, dense_out.view, options);
    ctx.synchronize();
    EXPECT_EQ(packed_out.device.to_host(), dense_out.device.to_host()) << to_string(dtype);
  }
}

// Wrong offsets on the fused path stay inside the views: out of order (running maxima make the
// later sequence empty), past total_q (clamped), a sequence longer than max_seqlen_q (cut to it).
// Rows no sequence then owns are not written; every written row is finite. validate_metadata
// names each bad entry instead, and says what the kernels clamp without it; the naive and cublas
// paths, which read cu_seqlens_q back, name it too (not the gathered keys they run on), with
// nothing written.
TEST(KvCacheVarlen, WrongOffsetsAreClampedOrNamed) {
  Context ctx;
  const CacheSpec spec = paged(DType::f16, 3, 1, 64, 16, 2, {20, 9, 31});
  std::mt19937_64 rng = rng_for("wrong offsets");
  const TestCache cache = make_cache(ctx, spec, rng);
  const int heads = 2, total = 12, d = 64;
  Tensor q = random_tensor(ctx, DType::f16, 1, heads, total, d, rng, kQueryLayout);
  struct Wrong {
    std::vector<int32_t> offsets;
    int max_seqlen;
    std::vector<int> owned;  // rows some sequence owns after ordering and clamping
    std::string message;     // what validate_metadata says
  };
  const std::vector<Wrong> wrongs = {
      {{0, 6, 3, 9},
       4,
       {0, 1, 2, 3, 6, 7, 8},
       "cu_seqlens_q[1] - cu_seqlens_q[0] = 6 exceeds max_seqlen_q = 4 (sequence 0: rows [0, 6))"},
      {{0, 2, 1, 3},
       4,
       {0, 1, 2},
       "cu_seqlens_q[2] = 1 is below cu_seqlens_q[1] = 2 (sequence 1 would own -1 rows; the offsets must not "
       "decrease)"},
      {{0, 4, 8, 14},
       6,
       {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11},
       "cu_seqlens_q[3] = 14 runs past q's 12 rows (sequence 2: rows [8, 14))"},
      {{3, 4, 5, 6}, 4, {3, 4, 5}, "cu_seqlens_q[0] = 3 expected 0 (sequence 0 starts at q's first row)"},
  };
  const std::string clamped =
      "(validate_metadata; without it the kernels clamp cu_seqlens_q: read in order, each entry into [0, 12], each "
      "sequence cut to max_seqlen_q rows)";
  const std::string refused =
      "(the naive and cublas paths read cu_seqlens_q back and refuse it; the fused path clamps it unless "
      "validate_metadata is set)";
  for (const Wrong& wrong : wrongs)
    for (int splits : {1, 3}) {  // the block writes its rows itself, or the combine does
      DeviceBuffer<int32_t> cu_seqlens(ctx, wrong.offsets.size(), "cu_seqlens_q");
      cu_seqlens.copy_from_host(wrong.offsets);
      Output out = poisoned_output(ctx, DType::f16, 1, heads, total, d, kOutLayout);
      KvAttentionOptions options;
      options.path = Path::fused;
      options.num_splits = splits;
      attention_with_kv_cache_varlen(ctx, q.view, cu_seqlens.data(), wrong.max_seqlen, cache.view, out.view, options);
      ctx.synchronize();
      std::vector<float> values;
      EXPECT_TRUE(download_output("wrong offsets out", out.device, out.view, values));
      for (int h = 0; h < heads; ++h)
        for (int row = 0; row < total; ++row) {
          const bool owned = std::find(wrong.owned.begin(), wrong.owned.end(), row) != wrong.owned.end();
          const float value = values[(size_t(h) * total + size_t(row)) * d];
          EXPECT_EQ(owned, !std::isnan(value))
              << "row " << row << " head " << h << " splits " << splits << " offsets " << wrong.message;
        }
      options.validate_metadata = true;
      try {
        attention_with_kv_cache_varlen(ctx, q.view, cu_seqlens.data(), wrong.max_seqlen, cache.view, out.view, options);
        ADD_FAILURE() << "validate_metadata passed " << wrong.message;
      } catch (const InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find("attention_with_kv_cache_varlen: " + wrong.message + " " + clamped),
                  std::string::npos)
            << e.what();
      }
    }
  for (const Wrong& wrong : wrongs)
    for (Path path : {Path::naive, Path::cublas}) {
      DeviceBuffer<int32_t> cu_seqlens(ctx, wrong.offsets.size(), "cu_seqlens_q");
      cu_seqlens.copy_from_host(wrong.offsets);
      const Output out = poisoned_output(ctx, DType::f16, 1, heads, total, d, kOutLayout);
      DeviceBuffer<float> lse(ctx, size_t(heads) * total, "lse");
      lse.fill_bytes(0xff);
      KvAttentionOptions options;
      options.path = path;
      options.lse = lse.data();
      try {
        attention_with_kv_cache_varlen(ctx, q.view, cu_seqlens.data(), wrong.max_seqlen, cache.view, out.view, options);
        ADD_FAILURE() << to_string(path) << " passed " << wrong.message;
      } catch (const InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find("attention_with_kv_cache_varlen: " + wrong.message + " " + refused),
                  std::string::npos)
            << to_string(path) << ": " << e.what();
      }
      EXPECT_EQ(std::vector<unsigned char>(out.device.size(), 0xff), out.device.to_host()) << to_string(path);
      for (float value : lse.to_host()) EXPECT_TRUE(std::isnan(value)) << to_string(path) << ": lse was written";
    }
}

// An FP8 cache (e4m3 per tensor, e5m2 per kv head) under packed calls, every path: mixed prefill
// and decode rows, f16/bf16/f32 queries, with 3 splits and with a window and sinks.
TEST(KvCacheVarlen, Fp8CacheEveryPath) {
  Context ctx;
  CacheSpec e4m3 = paged(DType::e4m3, 3, 1, 64, 16, 8, {113, 1, 64});
  e4m3.k_scale = {0.375f};
  e4m3.v_scale = {0.625f};
  CacheSpec e5m2 = contiguous(DType::e5m2, 3, 2, 64, 70, {70, 9, 33}, false);
  e5m2.k_scale = {1.25f, 0.75f};
  e5m2.v_scale = {0.5f, 0.375f};
  for (const auto& [spec, q_dtype] :
       {std::pair<CacheSpec, DType>{e4m3, DType::f16}, {e5m2, DType::bf16}, {e4m3, DType::f32}}) {
    PackedCase c = packed(spec, 4, {1, 7, 3});
    c.query_dtype = q_dtype;
    for (Path path : kPaths) EXPECT_TRUE(check_packed(ctx, c, path));
    c.num_splits = 3;
    c.mods.window_left = 20;
    c.mods.window_right = 0;
    c.mods.sinks = true;
    EXPECT_TRUE(check_packed(ctx, c, Path::fused));
    EXPECT_TRUE(check_packed(ctx, c, Path::naive));
  }
}

// Bad arguments name what is wrong, before anything is written.
TEST(KvCacheVarlen, ArgumentsNamed) {
  Context ctx;
  const CacheSpec spec = paged(DType::f16, 2, 1, 64, 16, 2, {3, 4});
  std::mt19937_64 rng = rng_for("packed arguments");
  const TestCache cache = make_cache(ctx, spec, rng);
  Tensor q = random_tensor(ctx, DType::f16, 1, 2, 5, 64, rng, kQueryLayout);
  Tensor q_batched = random_tensor(ctx, DType::f16, 2, 2, 5, 64, rng, kQueryLayout);
  Output out = poisoned_output(ctx, DType::f16, 1, 2, 5, 64, kOutLayout);
  DeviceBuffer<int32_t> cu_seqlens(ctx, 3, "cu_seqlens_q");
  cu_seqlens.copy_from_host(std::vector<int32_t>{0, 2, 5});
  const auto expect_message = [&](const std::string& message, const auto& call) {
    try {
      call();
      ADD_FAILURE() << "accepted: " << message;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  };
  expect_message("attention_with_kv_cache_varlen: q.shape[0] expected 1 (packed rows", [&] {
    attention_with_kv_cache_varlen(ctx, q_batched.view, cu_seqlens.data(), 3, cache.view, out.view);
  });
  expect_message("attention_with_kv_cache_varlen: cu_seqlens_q expected non-null",
                 [&] { attention_with_kv_cache_varlen(ctx, q.view, nullptr, 3, cache.view, out.view); });
  expect_message("attention_with_kv_cache_varlen: max_seqlen_q expected 0 to",
                 [&] { attention_with_kv_cache_varlen(ctx, q.view, cu_seqlens.data(), -1, cache.view, out.view); });
  expect_message("attention_with_kv_cache_varlen: cu_seqlens_q expected not to overlap out", [&] {
    TensorView overlapping = out.view;
    attention_with_kv_cache_varlen(ctx, q.view, static_cast<const int32_t*>(overlapping.data), 3, cache.view,
                                   overlapping);
  });
  Tensor k_new = random_tensor(ctx, DType::f16, 2, 1, 5, 64, rng, kNewKeysLayout);
  expect_message("append_kv_varlen: k_new.shape[0] expected 1 (packed rows",
                 [&] { append_kv_varlen(ctx, cache.view, k_new.view, k_new.view, cu_seqlens.data(), 3); });
  EXPECT_EQ(std::vector<unsigned char>(out.device.size(), 0xff), out.device.to_host());
}

}  // namespace
}  // namespace selfattn
