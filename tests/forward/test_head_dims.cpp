// Two head dims: q and k of head_dim_qk, v and out of head_dim_v (core/attention_call.h). The naive
// and cublas paths run any pair, judged by the harness against the reference with two head dims;
// the fused kernels take only equal ones and refuse others by name, with nothing written. The
// backward's two head dims: tests/backward/test_backward_head_dims.cpp.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "attention_harness.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

using testing::AttentionCase;
using testing::Layout;
using testing::VarlenCase;

AttentionCase with_v_dim(AttentionCase c, int head_dim_v) {
  c.head_dim_v = head_dim_v;
  return c;
}

class TwoHeadDims : public ::testing::TestWithParam<Path> {};

// The pairs the models use (MLA prefill 192/128, absorbed decode 576/512 at a few rows), odd pairs
// either way round, d_v of 1, on every causal mode, GQA, both layouts, key lengths with 0, LSE.
TEST_P(TwoHeadDims, AgreeWithTheReference) {
  Context ctx;
  const Path path = GetParam();
  std::vector<AttentionCase> cases;
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    cases.push_back(with_v_dim(testing::make_case(dtype, 2, 4, 2, 7, 113, 192, Causal::bottom_right, Layout::bshd,
                                                  true, {113, 0}, path),
                               128));
    cases.push_back(
        with_v_dim(testing::make_case(dtype, 1, 4, 1, 2, 64, 576, Causal::none, Layout::bhsd, true, {}, path), 512));
    cases.push_back(
        with_v_dim(testing::make_case(dtype, 1, 2, 2, 13, 7, 5, Causal::top_left, Layout::bhsd, true, {}, path), 7));
    cases.push_back(
        with_v_dim(testing::make_case(dtype, 3, 1, 1, 9, 33, 7, Causal::none, Layout::bshd, false, {30, 1, 0}, path),
                   5));
    cases.push_back(
        with_v_dim(testing::make_case(dtype, 1, 3, 1, 4, 17, 32, Causal::none, Layout::bhsd, true, {}, path), 1));
  }
  // Row gaps and distinct strides per tensor, and the score modifiers (sinks included).
  AttentionCase gapped =
      with_v_dim(testing::make_case(DType::bf16, 2, 2, 1, 19, 40, 48, Causal::none, Layout::bshd, true, {}, path), 16);
  gapped.row_gap = 3;
  cases.push_back(gapped);
  AttentionCase mods =
      with_v_dim(testing::make_case(DType::f16, 2, 3, 1, 11, 37, 24, Causal::none, Layout::bhsd, true, {}, path), 40);
  mods.mods.window_left = 9;
  mods.mods.window_right = 2;
  mods.mods.softcap = 8.0f;
  mods.mods.alibi = testing::AlibiSlopes::heads;
  mods.mods.bias = testing::BiasLayout::heads;
  mods.mods.sinks = true;
  cases.push_back(mods);
  AttentionCase dropout =
      with_v_dim(testing::make_case(DType::f32, 1, 2, 2, 6, 21, 12, Causal::top_left, Layout::bhsd, true, {}, path), 20);
  dropout.mods.dropout_p = 0.25f;
  dropout.mods.dropout_seed = 11;
  cases.push_back(dropout);
  // FP8 inputs: dequantized into out's dtype (no FP8 kernel takes two head dims), then this path.
  AttentionCase fp8 =
      with_v_dim(testing::make_case(DType::bf16, 2, 2, 1, 5, 70, 192, Causal::bottom_right, Layout::bshd, true, {}, path),
                 128);
  fp8.fp8 = DType::e4m3;
  cases.push_back(fp8);
  testing::expect_all_pass(ctx, cases);
}

TEST_P(TwoHeadDims, Varlen) {
  Context ctx;
  VarlenCase c;
  c.dtype = DType::bf16;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 40;
  c.head_dim_v = 24;
  c.seq_q = {5, 0, 17, 1};
  c.seq_k = {9, 3, 17, 30};
  c.causal = Causal::bottom_right;
  c.with_lse = true;
  c.path = GetParam();
  c.unowned_q_rows = 2;
  c.unowned_k_rows = 3;
  EXPECT_TRUE(testing::check_attention_varlen(ctx, c)) << c.name();
  c.dtype = DType::f32;
  c.head_dim = 3;
  c.head_dim_v = 65;
  c.layout = Layout::bhsd;
  EXPECT_TRUE(testing::check_attention_varlen(ctx, c)) << c.name();
}

INSTANTIATE_TEST_SUITE_P(Paths, TwoHeadDims, ::testing::Values(Path::naive, Path::cublas, Path::automatic),
                         [](const ::testing::TestParamInfo<Path>& info) { return to_string(info.param); });

TEST(TwoHeadDims, FusedPathRefusesByName) {
  Context ctx;
  const int d_qk = 64, d_v = 32;
  DeviceBuffer<uint16_t> q(ctx, 16 * d_qk), k(ctx, 16 * d_qk), v(ctx, 16 * d_v), out(ctx, 16 * d_v);
  q.fill_bytes(0);
  k.fill_bytes(0);
  v.fill_bytes(0);
  out.fill_bytes(0xFF);
  AttentionOptions options;
  options.path = Path::fused;
  try {
    attention(ctx, TensorView::bhsd(q.data(), DType::f16, 1, 1, 16, d_qk),
              TensorView::bhsd(k.data(), DType::f16, 1, 1, 16, d_qk), TensorView::bhsd(v.data(), DType::f16, 1, 1, 16, d_v),
              TensorView::bhsd(out.data(), DType::f16, 1, 1, 16, d_v), options);
    ADD_FAILURE() << "path fused ran head_dim_v 32 with head_dim_qk 64";
  } catch (const NotAvailable& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim_v != head_dim_qk"), std::string::npos) << e.what();
  }
  for (uint16_t bits : out.to_host()) ASSERT_EQ(bits, 0xFFFF);
}

}  // namespace
}  // namespace selfattn
