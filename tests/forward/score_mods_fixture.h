#pragma once
// What the score-modifier programs (test_score_mods*.cpp) share: the ScoreMods fixture (one run per
// path, its case shorthands) and the modifier cases they build on. One test source a program: its
// helpers sit in an anonymous namespace.
#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "attention_harness.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

using testing::AlibiSlopes;
using testing::AttentionCase;
using testing::BiasLayout;
using testing::Layout;
using testing::make_case;
using testing::ScoreModsCase;
using testing::VarlenCase;

constexpr Causal none = Causal::none, top_left = Causal::top_left, bottom_right = Causal::bottom_right;

inline ScoreModsCase window(int left, int right) {
  ScoreModsCase m;
  m.window_left = left;
  m.window_right = right;
  return m;
}

// Window (30, 10), softcap, [batch, heads] ALiBi and a full bias with -inf rows and columns.
inline ScoreModsCase every_modifier() {
  ScoreModsCase all = window(30, 10);
  all.softcap = 4.0f;
  all.alibi = AlibiSlopes::batch_heads;
  all.bias = BiasLayout::full;
  all.masked_row_period = 11;
  all.masked_key_period = 9;
  return all;
}

inline AttentionCase with(AttentionCase c, const ScoreModsCase& mods) {
  c.mods = mods;
  return c;
}

class ScoreMods : public ::testing::TestWithParam<Path> {
 protected:
  Path path() const { return GetParam(); }
  // Shorthand: dtype, batch, heads / kv_heads, seq_q x seq_k, head_dim, causal, lse, key lengths.
  AttentionCase make(DType dtype, int batch, int heads, int kv_heads, int seq_q, int seq_k, int head_dim,
                     Causal causal, std::vector<int32_t> key_lengths = {}, Layout layout = Layout::bhsd) const {
    return make_case(dtype, batch, heads, kv_heads, seq_q, seq_k, head_dim, causal, layout, true,
                     std::move(key_lengths), path());
  }
  // Four sequences, bottom-right causal, LSE: one without queries, one without keys, one short.
  VarlenCase make_varlen(DType dtype, int heads, int kv_heads, int head_dim) const {
    VarlenCase varlen;
    varlen.dtype = dtype;
    varlen.heads = heads;
    varlen.kv_heads = kv_heads;
    varlen.head_dim = head_dim;
    varlen.seq_q = {37, 0, 64, 5};
    varlen.seq_k = {90, 12, 64, 0};
    varlen.causal = bottom_right;
    varlen.with_lse = true;
    varlen.path = path();
    return varlen;
  }
};

}  // namespace
}  // namespace selfattn
