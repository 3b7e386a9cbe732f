// Dropout in attention_backward() on every path (naive, cublas, fused in both dQ modes), on the sim,
// judged by the shared backward check (support/backward_check.h): the forward (naive path) and the
// backward take the same options, so the backward must regenerate the forward's mask; the
// reference gradients take the library's mask (reference::dropout_keep_mask) as an input. Odd
// and round sizes, causal both alignments, GQA, key lengths, windows, softcap/ALiBi/bias, sinks
// (whose gradient keeps its form: the sink is never dropped), an LSE gradient, varlen with empty
// sequences.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backward_check.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

using backward_check::Case;

class BackwardDropout : public ::testing::TestWithParam<Path> {};

std::vector<Case> dropout_cases(Path path) {
  // The fused backward takes f16/bf16 with its shipped head dims; naive and cublas every dtype and size.
  const bool fused = path == Path::fused;
  const DType wide = fused ? DType::f16 : DType::f32;
  std::vector<Case> cases;
  const auto add = [&](Case c, const std::string& name) {
    c.path = path;
    c.name = std::string(to_string(path)) + "_" + to_string(c.dtype) + "_" + name;
    cases.push_back(c);
    if (fused) {  // both dQ modes: atomics and the deterministic dQ kernel
      c.deterministic = true;
      c.name += "_deterministic";
      cases.push_back(c);
    }
  };
  Case c;
  c.dtype = wide;
  c.grad_f32 = fused;
  c.heads = 2, c.kv_heads = 1, c.seq_q = 113, c.seq_k = 203, c.head_dim = fused ? 32 : 7;
  c.dropout_p = 0.3f, c.dropout_seed = 17;
  add(c, "gqa_113x203");
  c = Case{};
  c.dtype = DType::bf16;
  c.batch = 2, c.heads = 2, c.kv_heads = 2, c.seq_q = 7, c.seq_k = 1, c.head_dim = 64;
  c.causal = Causal::bottom_right;
  c.dropout_p = 0.5f, c.dropout_seed = 3, c.dropout_offset = 11;
  add(c, "7x1_bottom_right");
  c = Case{};
  c.dtype = fused ? DType::f16 : DType::f32;
  c.seq_q = 1, c.seq_k = 7, c.head_dim = fused ? 96 : 1;
  c.dropout_p = 0.2f, c.dropout_seed = 4;
  add(c, "1x7");
  c = Case{};
  c.dtype = DType::bf16;
  c.heads = 4, c.kv_heads = 2, c.seq_q = 70, c.seq_k = 64, c.head_dim = 64;
  c.causal = Causal::top_left;
  c.bshd = true;
  c.dropout_p = 0.1f, c.dropout_seed = 5;
  add(c, "top_left_gqa_bshd_64x64");
  c = Case{};
  c.dtype = DType::f16;
  c.batch = 2, c.heads = 2, c.kv_heads = 1, c.seq_q = 33, c.seq_k = 40, c.head_dim = 128;
  c.causal = Causal::bottom_right;
  c.key_lengths = {0, 29};
  c.dlse = true;
  c.dropout_p = 0.25f, c.dropout_seed = 6;
  add(c, "bottom_right_lengths_dlse");
  c = Case{};
  c.dtype = wide;
  c.heads = 2, c.kv_heads = 2, c.seq_q = 45, c.seq_k = 60, c.head_dim = fused ? 64 : 24;
  c.window_left = 6, c.window_right = 2;
  c.softcap = 3.0f;
  c.alibi = true;
  c.bias = true;
  c.sinks = true;
  c.dropout_p = 0.4f, c.dropout_seed = 7, c.dropout_offset = 1u << 30;
  add(c, "window_softcap_alibi_bias_sinks");
  c = Case{};
  c.dtype = DType::bf16;
  c.heads = 2, c.kv_heads = 1, c.head_dim = 64;
  c.causal = Causal::bottom_right;
  c.varlen_q = {7, 0, 33, 1};
  c.varlen_k = {20, 5, 0, 9};
  c.sinks = true;
  c.dropout_p = 0.3f, c.dropout_seed = 8;
  add(c, "varlen_empty_sequences_sinks");
  c = Case{};
  c.dtype = wide;
  c.heads = 2, c.kv_heads = 1, c.head_dim = fused ? 32 : 7;
  c.varlen_q = {50, 3, 64};
  c.varlen_k = {64, 30, 17};
  c.dropout_p = 0.6f, c.dropout_seed = 9;
  add(c, "varlen");
  return cases;
}

TEST_P(BackwardDropout, EveryCase) {
  Context ctx;
  for (const Case& c : dropout_cases(GetParam())) EXPECT_TRUE(backward_check::check(ctx, c));
}

// dropout_p = 0 with a seed is the backward without dropout, bit for bit (the same kernels' arithmetic).
TEST_P(BackwardDropout, ZeroRateIsNoDropout) {
  Context ctx;
  Case c;
  c.dtype = GetParam() == Path::fused ? DType::f16 : DType::f32;
  c.heads = 2, c.kv_heads = 1, c.seq_q = 33, c.seq_k = 40, c.head_dim = 32;
  c.causal = Causal::bottom_right;
  c.path = GetParam();
  c.deterministic = true;
  c.name = "dropout_zero_rate";  // one name: the inputs are drawn from it
  backward_check::Gradients plain, zero, dropped;
  ASSERT_TRUE(backward_check::check(ctx, c, &plain));
  c.dropout_seed = 99;
  ASSERT_TRUE(backward_check::check(ctx, c, &zero));
  EXPECT_EQ(plain.dq, zero.dq);
  EXPECT_EQ(plain.dk, zero.dk);
  EXPECT_EQ(plain.dv, zero.dv);
  c.dropout_p = 0.5f;
  ASSERT_TRUE(backward_check::check(ctx, c, &dropped));
  EXPECT_NE(plain.dv, dropped.dv);
}

INSTANTIATE_TEST_SUITE_P(EveryPath, BackwardDropout, ::testing::Values(Path::naive, Path::cublas, Path::fused),
                         [](const ::testing::TestParamInfo<Path>& info) { return std::string(to_string(info.param)); });

}  // namespace
}  // namespace selfattn
