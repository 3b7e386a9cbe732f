// The reference's masks and score modifiers (sliding window, softcap, ALiBi, bias) against values
// worked out by hand; the comment beside each case shows the arithmetic.
#include <cmath>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/common/causal_mask.cuh"
#include "selfattn/error.h"
#include "selfattn/reference.h"

namespace selfattn::reference {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

Problem problem(int seq_q, int seq_k, double scale = 1.0) {
  Problem p;
  p.seq_q = seq_q;
  p.seq_k = seq_k;
  p.head_dim = 1;
  p.scale = scale;
  return p;
}

void expect_range(KeyRange range, int begin, int end) {
  EXPECT_EQ(range.begin, begin);
  EXPECT_EQ(range.end, end);
}

TEST(AlignedRow, FollowsTheCausalAlignment) {
  EXPECT_EQ(aligned_row(2, 3, 5, Causal::top_left), 2);
  EXPECT_EQ(aligned_row(2, 3, 5, Causal::bottom_right), 4);  // 2 + (5 - 3)
  EXPECT_EQ(aligned_row(2, 3, 5, Causal::none), 4);          // none aligns at the last key
  EXPECT_EQ(aligned_row(0, 4, 1, Causal::bottom_right), -3);
}

TEST(VisibleKeyRange, WindowAroundTheAlignedRow) {
  // No window: the causal prefix.
  expect_range(visible_key_range(1, 3, 5, Causal::top_left, -1, -1), 0, 2);
  expect_range(visible_key_range(1, 3, 5, Causal::none, -1, -1), 0, 5);
  // none, 3 rows, 5 keys: row 1 is aligned at key 3; window (1, 0) -> keys 2..3.
  expect_range(visible_key_range(1, 3, 5, Causal::none, 1, 0), 2, 4);
  // top_left: row 1 aligned at key 1; window (1, 2) -> keys 0..3, the causal mask cuts it to 0..1.
  expect_range(visible_key_range(1, 3, 5, Causal::top_left, 1, 2), 0, 2);
  // bottom_right: row 0 aligned at key 2; window (0, 0) -> key 2 alone.
  expect_range(visible_key_range(0, 3, 5, Causal::bottom_right, 0, 0), 2, 3);
  // Only a left bound, only a right bound.
  expect_range(visible_key_range(4, 5, 5, Causal::none, 2, -1), 2, 5);
  expect_range(visible_key_range(0, 5, 5, Causal::none, -1, 1), 0, 2);
  // Wider than the sequence: everything the causal mask allows.
  expect_range(visible_key_range(2, 5, 5, Causal::top_left, 1000, 1000), 0, 3);
  // Right bound before key 0 (more queries than keys): empty, normalised within [0, len_k].
  expect_range(visible_key_range(0, 4, 1, Causal::none, 0, 0), 0, 0);
  // Left bound past the last key (top_left, row beyond len_k): empty at len_k.
  expect_range(visible_key_range(9, 10, 3, Causal::top_left, 1, -1), 3, 3);
  // Bounds are non-decreasing in the row (the kernels' tile skipping relies on it).
  for (Causal causal : {Causal::none, Causal::top_left, Causal::bottom_right})
    for (int left : {-1, 0, 3})
      for (int right : {-1, 0, 2}) {
        KeyRange previous = visible_key_range(0, 9, 6, causal, left, right);
        for (int row = 1; row < 9; ++row) {
          const KeyRange range = visible_key_range(row, 9, 6, causal, left, right);
          EXPECT_GE(range.begin, previous.begin);
          EXPECT_GE(range.end, previous.end);
          EXPECT_LE(range.begin, range.end);
          EXPECT_LE(range.end, 6);
          previous = range;
        }
      }
}

// key_start and q_offset (AttentionOptions): 3 rows over keys [0, 8) of 10 (a key length of 8).
TEST(RowKeys, KeyStartAndQueryOffsetByHand) {
  Problem p = problem(3, 10);
  p.key_lengths = {8};
  p.key_start = {2};
  // Keys [2, 8): 6 keys, positions counted from key 2. bottom_right: row i at key 8 - 3 + i.
  p.causal = Causal::bottom_right;
  expect_range(row_keys(p, 0, 0).keys, 2, 6);
  EXPECT_EQ(row_keys(p, 0, 0).aligned, 5);
  // top_left: row i at key 2 + i; none: every key from the start.
  p.causal = Causal::top_left;
  expect_range(row_keys(p, 0, 1).keys, 2, 4);
  EXPECT_EQ(row_keys(p, 0, 1).aligned, 3);
  p.causal = Causal::none;
  expect_range(row_keys(p, 0, 0).keys, 2, 8);
  // q_offset 4: row i at key 2 + 4 + i under either alignment; row 1 at key 7 sees keys 2..7.
  p.q_offset = {4};
  for (Causal causal : {Causal::top_left, Causal::bottom_right}) {
    p.causal = causal;
    expect_range(row_keys(p, 0, 0).keys, 2, 7);
    expect_range(row_keys(p, 0, 1).keys, 2, 8);
  }
  // With a window (1, 0): row 0 at key 6 sees keys 5..6; without a causal mask (1, 1): 5..7.
  p.window_left = 1, p.window_right = 0;
  expect_range(row_keys(p, 0, 0).keys, 5, 7);
  p.causal = Causal::none;
  p.window_right = 1;
  expect_range(row_keys(p, 0, 0).keys, 5, 8);
  EXPECT_EQ(row_keys(p, 0, 2).aligned, 8);
  // Clamped: a negative start is 0, one past the length leaves no key; a negative offset is 0.
  p = problem(3, 10);
  p.key_start = {-3};
  p.q_offset = {-5};
  p.causal = Causal::bottom_right;
  expect_range(row_keys(p, 0, 1).keys, 0, 2);
  p.key_start = {20};
  expect_range(row_keys(p, 0, 2).keys, 10, 10);
}

// The kernels' twin (kernels/common/causal_mask.cuh) agrees with the reference on every small case:
// each causal mode, key lengths 0..9, starts and offsets in and out of range (and absent), windows.
TEST(RowKeys, TheKernelsTwinAgrees) {
  const kernels::CausalMask masks[] = {kernels::CausalMask::none, kernels::CausalMask::top_left,
                                       kernels::CausalMask::bottom_right};
  const Causal causals[] = {Causal::none, Causal::top_left, Causal::bottom_right};
  const int32_t kAbsent = -1000;
  for (int c = 0; c < 3; ++c)
    for (int seq_q = 1; seq_q <= 4; ++seq_q)
      for (int length = 0; length <= 9; ++length)
        for (int32_t start = kAbsent; start <= 11; start += (start == kAbsent ? 999 : 3))
          for (int32_t offset = kAbsent; offset <= 12; offset += (offset == kAbsent ? 998 : 5))
            for (int left : {-1, 0, 2})
              for (int right : {-1, 0, 3}) {
                Problem p = problem(seq_q, 9);
                p.causal = causals[c];
                p.key_lengths = {length};
                if (start != kAbsent) p.key_start = {start};
                if (offset != kAbsent) p.q_offset = {offset};
                p.window_left = left, p.window_right = right;
                const kernels::SequenceKeys keys =
                    kernels::sequence_keys(seq_q, length, masks[c], start != kAbsent ? &start : nullptr,
                                           offset != kAbsent ? &offset : nullptr, 0);
                for (int row = 0; row < seq_q; ++row) {
                  const RowKeys want = row_keys(p, 0, row);
                  const kernels::KeyRange got = kernels::visible_key_range(row, keys, masks[c], left, right);
                  ASSERT_EQ(got.begin, want.keys.begin) << c << " " << seq_q << " " << length << " " << start << " "
                                                        << offset << " " << left << " " << right << " row " << row;
                  ASSERT_EQ(got.end, want.keys.end) << c << " " << seq_q << " " << length << " " << start << " "
                                                    << offset << " " << left << " " << right << " row " << row;
                  ASSERT_EQ(kernels::aligned_key(row, keys), want.aligned) << "row " << row;
                }
              }
}

TEST(ReferenceScoreMods, WindowAveragesTheKeysItSees) {
  // q = 0: equal scores, each row averages its values. 2 rows, 4 keys, none: rows aligned at 2, 3.
  // window (1, 0): row 0 sees keys 1, 2 -> (10 + 100) / 2; row 1 keys 2, 3 -> (100 + 1000) / 2.
  Problem p = problem(2, 4);
  p.window_left = 1;
  p.window_right = 0;
  const Result r = attention(p, {0, 0}, {1, 2, 3, 4}, {1, 10, 100, 1000});
  EXPECT_NEAR(r.out[0], 55.0, 1e-12);
  EXPECT_NEAR(r.out[1], 550.0, 1e-12);
  EXPECT_NEAR(r.lse[0], std::log(2.0), 1e-14);
}

TEST(ReferenceScoreMods, SoftcapBeforeBias) {
  // scores 3 and 0, cap 1: tanh(3) and 0; bias +1 on key 1: tanh(3) and 1.
  Problem p = problem(1, 2);
  p.softcap = 1.0;
  p.bias = {0.0, 1.0};
  const Result r = attention(p, {1}, {3, 0}, {1, 0});
  const double a = std::exp(std::tanh(3.0)), b = std::exp(1.0);
  EXPECT_NEAR(r.out[0], a / (a + b), 1e-14);
  EXPECT_NEAR(r.lse[0], std::log(a + b), 1e-14);
}

TEST(ReferenceScoreMods, AlibiPenalisesDistanceFromTheAlignedRow) {
  // q = 0, 1 row, 3 keys, none: the row is aligned at key 2; slope 0.5 -> scores -1, -0.5, 0.
  Problem p = problem(1, 3);
  p.alibi_slopes = {0.5};
  const Result r = attention(p, {0}, {0, 0, 0}, {1, 2, 4});
  const double w0 = std::exp(-1.0), w1 = std::exp(-0.5), w2 = 1.0;
  EXPECT_NEAR(r.out[0], (w0 * 1 + w1 * 2 + w2 * 4) / (w0 + w1 + w2), 1e-14);
  // top_left aligns the row at key 0: scores 0, -0.5, -1, but causal sees key 0 alone.
  p.causal = Causal::top_left;
  EXPECT_NEAR(attention(p, {0}, {0, 0, 0}, {1, 2, 4}).out[0], 1.0, 1e-14);
  // [batch, heads] slopes: batch 1 uses its own.
  Problem two = problem(1, 2);
  two.batch = 2;
  two.alibi_slopes = {0.0, std::log(3.0)};  // batch 1: key 0 at distance 1 -> weight 1/3 of key 1
  const Result r2 = attention(two, {0, 0}, {0, 0, 0, 0}, {1, 5, 1, 5});
  EXPECT_NEAR(r2.out[0], 3.0, 1e-14);                      // (1 + 5) / 2
  EXPECT_NEAR(r2.out[1], (1.0 / 3 + 5) / (1.0 / 3 + 1), 1e-14);
}

TEST(ReferenceScoreMods, MinusInfinityBiasMasks) {
  // Row 0: key 0 masked -> out = v1. Row 1: both masked -> out 0, LSE -inf.
  Problem p = problem(2, 2);
  p.bias = {-kInf, 0.0, -kInf, -kInf};
  const Result r = attention(p, {1, 1}, {1, 2}, {3, 7});
  EXPECT_DOUBLE_EQ(r.out[0], 7.0);
  EXPECT_DOUBLE_EQ(r.lse[0], 2.0);
  EXPECT_EQ(r.out[1], 0.0);
  EXPECT_EQ(r.lse[1], -kInf);
}

TEST(ReferenceScoreMods, ScoresBeyondTheLimitMaskOrClamp) {
  EXPECT_EQ(limit_score(-1e38), -kInf);
  EXPECT_EQ(limit_score(-std::numeric_limits<double>::max()), -kInf);
  EXPECT_EQ(limit_score(-9.9e37), -9.9e37);
  EXPECT_EQ(limit_score(3e38), 1e38);
  EXPECT_TRUE(std::isnan(limit_score(std::nan(""))));
  // -FLT_MAX on every key masks the row (0, LSE -inf); +3e38 on key 1 makes it the whole softmax.
  Problem p = problem(2, 2);
  const double lowest = -3.4028234663852886e38;
  p.bias = {lowest, lowest, 0.0, 3e38};
  const Result r = attention(p, {1, 1}, {1, 2}, {3, 7});
  EXPECT_EQ(r.out[0], 0.0);
  EXPECT_EQ(r.lse[0], -kInf);
  EXPECT_EQ(r.out[1], 7.0);
  EXPECT_EQ(r.lse[1], 1e38);
}

TEST(ReferenceScoreMods, SinkTakesItsShareOfTheSoftmax) {
  // Scores 1 and 0 beside a sink of logit 0.5 (a key whose value is 0): weights e, 1 and e^0.5.
  Problem p = problem(1, 2);
  p.sinks = {0.5};
  const Result r = attention(p, {1}, {1, 0}, {3, 7});
  const double a = std::exp(1.0), b = 1.0, sink = std::exp(0.5);
  EXPECT_NEAR(r.out[0], (3 * a + 7 * b) / (a + b + sink), 1e-14);
  EXPECT_NEAR(r.lse[0], std::log(a + b + sink), 1e-14);
  // A sink far above the scores leaves almost nothing to the keys, without overflow.
  p.sinks = {800.0};
  const Result high = attention(p, {1}, {1, 0}, {3, 7});
  EXPECT_EQ(high.out[0], 0.0);
  EXPECT_NEAR(high.lse[0], 800.0, 1e-12);
  // -inf is no sink.
  p.sinks = {-kInf};
  EXPECT_NEAR(attention(p, {1}, {1, 0}, {3, 7}).out[0], (3 * a + 7 * b) / (a + b), 1e-14);
}

TEST(ReferenceScoreMods, RowWithoutKeysIsZeroWithTheSinksLse) {
  // Row 0 sees no key (every key masked): out 0, LSE the sink's logit. Per head: head 1 has no sink.
  Problem p = problem(1, 2);
  p.heads = p.kv_heads = 2;
  p.bias = {-kInf, -kInf, -kInf, -kInf};
  p.sinks = {1.25, -kInf};
  const Result r = attention(p, {1, 1}, {1, 2, 1, 2}, {3, 7, 3, 7});
  EXPECT_EQ(r.out[0], 0.0);
  EXPECT_EQ(r.lse[0], 1.25);
  EXPECT_EQ(r.out[1], 0.0);
  EXPECT_EQ(r.lse[1], -kInf);
}

TEST(ReferenceScoreMods, RejectsBadModifiers) {
  Problem p = problem(1, 2);
  p.window_left = -2;
  EXPECT_THROW(attention(p, {1}, {1, 2}, {1, 2}), InvalidArgument);
  p = problem(1, 2);
  p.softcap = -1;
  EXPECT_THROW(attention(p, {1}, {1, 2}, {1, 2}), InvalidArgument);
  p = problem(1, 2);
  p.alibi_slopes = {1, 2};
  EXPECT_THROW(attention(p, {1}, {1, 2}, {1, 2}), InvalidArgument);
  p = problem(1, 2);
  p.bias = {1};
  EXPECT_THROW(attention(p, {1}, {1, 2}, {1, 2}), InvalidArgument);
  p = problem(1, 2);
  p.sinks = {1, 2};  // one per head
  EXPECT_THROW(attention(p, {1}, {1, 2}, {1, 2}), InvalidArgument);
  p.sinks = {std::nan("")};
  EXPECT_THROW(attention(p, {1}, {1, 2}, {1, 2}), InvalidArgument);
  p.sinks = {kInf};
  EXPECT_THROW(attention(p, {1}, {1, 2}, {1, 2}), InvalidArgument);
}

}  // namespace
}  // namespace selfattn::reference
