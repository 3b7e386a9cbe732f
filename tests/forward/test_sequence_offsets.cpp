// Per-sequence key starts and query offsets (AttentionOptions::key_start, q_offset) on every path,
// on the sim, against the double reference: left padding (NaN in the K/V rows before key_start, so
// a kernel that reads them or lets a zero probability meet them fails), query rows placed against a
// static cache (every slot handed over), both together with the causal alignments, the window,
// ALiBi, the bias (indexed by key row), sinks, GQA and key lengths; varlen; values out of range
// (clamped, attention.h); the arguments' checks. The backward's cases are in the backward checks'
// sweeps (support/backward_check_sweeps.h) and its left padding in check_backward_ignores_key_padding. Each test runs once per path; the fused ones also
// under SELFATTN_HOPPER_KERNELS=0 (tests/forward/CMakeLists.txt): q_offset alone runs the Hopper
// kernel on the sim's 9.0, key_start the mma.sync one.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "attention_harness.h"
#include "score_mods_fixture.h"
#include "selfattn/selfattn.h"
#include "test_helpers.h"

namespace selfattn {
namespace {

AttentionCase offsets(AttentionCase c, std::vector<int32_t> key_start, std::vector<int32_t> q_offset) {
  c.key_start = std::move(key_start);
  c.q_offset = std::move(q_offset);
  return c;
}

using SequenceOffsets = ScoreMods;

// Left padding: keys before key_start[b] are padding (NaN on the device). Starts of 0, inside the
// first key tile, past several tiles, at the length (no key left), with key lengths after them;
// positions count from the start, so bottom_right and top_left move with it.
TEST_P(SequenceOffsets, KeyStartLeftPadding) {
  Context ctx;
  testing::expect_all_pass(ctx, {
      offsets(make(DType::f16, 3, 4, 2, 7, 113, 64, bottom_right, {113, 90, 60}), {40, 0, 60}, {}),
      offsets(make(DType::bf16, 2, 2, 1, 64, 203, 128, top_left, {}, Layout::bshd), {70, 129}, {}),
      offsets(make(DType::f32, 2, 1, 1, 1, 33, 7, none), {32, 5}, {}),
      offsets(make(DType::f16, 1, 2, 2, 113, 257, 32, bottom_right), {1}, {}),
      offsets(make(DType::bf16, 2, 2, 2, 33, 64, 256, none, {64, 1}), {63, 0}, {}),
  });
}

// A static cache: every slot handed over (no key lengths), the new rows at the positions they hold.
// Row i sees keys <= q_offset + i under either causal alignment; the window and ALiBi measure from
// there; without a causal mask the offset places the window alone.
TEST_P(SequenceOffsets, QueryOffsetAgainstStaticCache) {
  Context ctx;
  ScoreModsCase window_alibi = window(30, -1);
  window_alibi.alibi = testing::AlibiSlopes::batch_heads;
  testing::expect_all_pass(ctx, {
      offsets(make(DType::f16, 3, 4, 1, 16, 257, 64, bottom_right), {}, {100, 241, 0}),
      offsets(make(DType::bf16, 2, 2, 2, 1, 300, 128, top_left), {}, {299, 17}),
      offsets(make(DType::f32, 1, 2, 1, 7, 64, 16, bottom_right, {}, Layout::bshd), {}, {3}),
      with(offsets(make(DType::f16, 2, 2, 1, 40, 203, 64, bottom_right), {}, {150, 60}), window_alibi),
      with(offsets(make(DType::bf16, 1, 1, 1, 64, 129, 32, none), {}, {10}), window(5, 5)),
      offsets(make(DType::bf16, 2, 2, 1, 113, 120, 64, bottom_right), {}, {0, 7}),
  });
}

// Both, with every modifier (window, softcap, ALiBi, a bias with -inf rows and columns indexed by
// key row), sinks, GQA and key lengths.
TEST_P(SequenceOffsets, WithEveryModifier) {
  Context ctx;
  ScoreModsCase all = every_modifier();
  ScoreModsCase all_with_sinks = all;
  all_with_sinks.sinks = true;
  testing::expect_all_pass(ctx, {
      with(offsets(make(DType::f16, 2, 4, 2, 20, 203, 64, bottom_right, {203, 150}), {50, 90}, {100, 30}), all),
      with(offsets(make(DType::f32, 2, 2, 1, 9, 70, 8, none, {60, 70}), {13, 0}, {40, 2}), all_with_sinks),
      with(offsets(make(DType::bf16, 3, 2, 2, 64, 113, 128, top_left), {0, 64, 112}, {}), all_with_sinks),
  });
}

// Device data out of range is clamped (attention.h): a negative start is 0, one past the length is
// the length (no key); a negative offset is 0, a huge one past every key (every key visible under
// the causal mask, ALiBi distances as large as int allows).
TEST_P(SequenceOffsets, OutOfRangeValuesAreClamped) {
  Context ctx;
  ScoreModsCase alibi;
  alibi.alibi = testing::AlibiSlopes::heads;
  testing::expect_all_pass(ctx, {
      offsets(make(DType::f16, 4, 2, 1, 5, 64, 64, bottom_right, {64, 40, 64, 64}), {-5, 1000, 2147483647, 10},
              {-3, 2147483647, 0, -2147483647 - 1}),
      with(offsets(make(DType::f32, 2, 1, 1, 3, 20, 4, none), {-1, 25}, {2147483000, -7}), alibi),
  });
}

// Varlen: one start and offset per sequence, counted within it; sequences without queries or keys.
TEST_P(SequenceOffsets, Varlen) {
  Context ctx;
  for (DType dtype : {DType::f32, DType::f16}) {
    testing::VarlenCase c = make_varlen(dtype, 4, 2, 64);
    c.key_start = {20, 0, 63, 0};
    c.q_offset = {60, 3, 10, 0};
    EXPECT_TRUE(testing::check_attention_varlen(ctx, c)) << c.name();
    c.q_offset.clear();
    EXPECT_TRUE(testing::check_attention_varlen(ctx, c, window(12, 2))) << c.name();
    // key_lengths per sequence (seqused_k): the keys each uses of its own (NaN past them).
    c.key_lengths = {50, 12, 70, 0};
    EXPECT_TRUE(testing::check_attention_varlen(ctx, c)) << c.name();
    c.key_start.clear();
    c.key_lengths = {1, 0, 30, 5};
    EXPECT_TRUE(testing::check_attention_varlen(ctx, c)) << c.name();
  }
}

INSTANTIATE_TEST_SUITE_P(EveryPath, SequenceOffsets, ::testing::Values(Path::naive, Path::cublas, Path::fused),
                         [](const ::testing::TestParamInfo<Path>& info) { return std::string(to_string(info.param)); });

// The checks: each pointer's alignment, and neither may overlap out or the LSE; nothing is written.
TEST(SequenceOffsetArguments, RejectedBeforeAnythingIsWritten) {
  using host_test::throws_with;
  Context ctx;
  DeviceBuffer<float> q(ctx, 2 * 4 * 8), k(ctx, 2 * 4 * 8), v(ctx, 2 * 4 * 8), out(ctx, 2 * 4 * 8), lse(ctx, 8);
  DeviceBuffer<int32_t> values(ctx, 4);
  out.fill_bytes(host_test::kPoison);
  lse.fill_bytes(host_test::kPoison);
  const TensorView qv = TensorView::bhsd(q.data(), DType::f32, 2, 1, 4, 8);
  const TensorView kv = TensorView::bhsd(k.data(), DType::f32, 2, 1, 4, 8);
  const TensorView vv = TensorView::bhsd(v.data(), DType::f32, 2, 1, 4, 8);
  const TensorView ov = TensorView::bhsd(out.data(), DType::f32, 2, 1, 4, 8);
  for (const char* name : {"options.key_start", "options.q_offset"}) {
    const bool start = std::string(name) == "options.key_start";
    AttentionOptions options;
    const int32_t*& field = start ? options.key_start : options.q_offset;
    field = reinterpret_cast<const int32_t*>(reinterpret_cast<const char*>(values.data()) + 1);
    EXPECT_TRUE(throws_with<InvalidArgument>([&] { attention(ctx, qv, kv, vv, ov, options); }, {name, "alignment"}));
    field = reinterpret_cast<const int32_t*>(out.data()) + 3;
    EXPECT_TRUE(throws_with<InvalidArgument>([&] { attention(ctx, qv, kv, vv, ov, options); }, {name, "out"}));
    options.lse = lse.data();
    field = reinterpret_cast<const int32_t*>(lse.data()) + 1;
    EXPECT_TRUE(throws_with<InvalidArgument>([&] { attention(ctx, qv, kv, vv, ov, options); }, {name, "options.lse"}));
  }
  EXPECT_TRUE(host_test::untouched(out));
  EXPECT_TRUE(host_test::untouched(lse));
}

}  // namespace
}  // namespace selfattn
