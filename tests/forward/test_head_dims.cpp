// Two head dims: q and k of head_dim_qk, v and out of head_dim_v (core/attention_call.h). The naive
// and cublas paths run any pair, judged by the harness against the reference with two head dims;
// the fused path runs MLA's prefill pair (192, 128) on its mma.sync kernel and refuses other
// pairs by name, with nothing written. The backward's two head dims:
// tests/backward/test_backward_head_dims.cpp.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "attention_harness.h"
#include "gpu_sized.h"
#include "kernels/registry.h"
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

// MLA's prefill pair on the fused path: the mma.sync kernel's (192, 128) instance (run alone by the
// ".mma_sync" copy of this test, tests/forward/CMakeLists.txt; here the sim's Hopper kernel takes the
// calls it can, test_fused_hopper.cpp sizes those around its own tiles), with sizes on each edge of
// its work division (query rows per block, keys per tile, from the instance), every causal mode, GQA, both layouts with row gaps, key lengths, left padding and
// query offsets, every modifier, sinks, dropout, and varlen with empty sequences.
TEST(TwoHeadDims, FusedMlaPrefillPair) {
  Context ctx;
  const kernels::FlashFwdInstance bf16 = kernels::sim_target::flash_fwd_instance<kernels::Element::bf16, 192, 128>();
  const kernels::FlashFwdInstance f16 = kernels::sim_target::flash_fwd_instance<kernels::Element::f16, 192, 128>();
  ASSERT_TRUE(bf16.kernel && f16.kernel);
  ASSERT_EQ(bf16.block_rows, f16.block_rows);
  const int rows = bf16.block_rows, keys = bf16.block_keys;
  const auto mla = [&](DType dtype, int batch, int heads, int kv_heads, int seq_q, int seq_k, Causal causal,
                       Layout layout, std::vector<int32_t> lengths = {}) {
    return with_v_dim(testing::make_case(dtype, batch, heads, kv_heads, seq_q, seq_k, 192, causal, layout, true,
                                         std::move(lengths), Path::fused),
                      128);
  };
  std::vector<AttentionCase> cases = {
      mla(DType::bf16, 2, 4, 2, rows + 1, 3 * keys + 1, Causal::bottom_right, Layout::bshd, {3 * keys + 1, keys - 1}),
      mla(DType::f16, 1, 2, 1, rows - 1, keys, Causal::none, Layout::bhsd),
      mla(DType::f16, 2, 2, 2, keys + 1, rows + 1, Causal::top_left, Layout::bshd, {0, rows}),
      mla(DType::bf16, 1, 1, 1, 1, 1, Causal::bottom_right, Layout::bhsd),
  };
  AttentionCase gapped = mla(DType::bf16, 2, 2, 1, 19, 2 * keys - 1, Causal::none, Layout::bshd);
  gapped.row_gap = 8;
  cases.push_back(gapped);
  AttentionCase mods = mla(DType::f16, 2, 3, 1, 21, 2 * keys + 5, Causal::bottom_right, Layout::bhsd);
  mods.mods.window_left = keys - 1;
  mods.mods.window_right = 3;
  mods.mods.softcap = 8.0f;
  mods.mods.alibi = testing::AlibiSlopes::heads;
  mods.mods.bias = testing::BiasLayout::heads;
  mods.mods.sinks = true;
  cases.push_back(mods);
  AttentionCase padded = mla(DType::bf16, 2, 2, 2, 9, 2 * keys + 3, Causal::bottom_right, Layout::bshd);
  padded.key_start = {keys + 1, 0};
  padded.q_offset = {5, 2 * keys};
  cases.push_back(padded);
  AttentionCase dropout = mla(DType::bf16, 1, 2, 2, 17, keys + 7, Causal::top_left, Layout::bhsd);
  dropout.mods.dropout_p = 0.2f;
  dropout.mods.dropout_seed = 5;
  cases.push_back(dropout);
  testing::expect_all_pass(ctx, cases);

  VarlenCase varlen;
  varlen.dtype = DType::f16;
  varlen.heads = 4;
  varlen.kv_heads = 1;
  varlen.head_dim = 192;
  varlen.head_dim_v = 128;
  varlen.seq_q = {5, 0, rows + 2, 1};
  varlen.seq_k = {keys + 2, 3, 40, 0};
  varlen.causal = Causal::bottom_right;
  varlen.with_lse = true;
  varlen.path = Path::fused;
  varlen.unowned_q_rows = 2;
  varlen.unowned_k_rows = 3;
  EXPECT_TRUE(testing::check_attention_varlen(ctx, varlen)) << varlen.name();
}

// The automatic choice runs MLA's prefill pair on the fused path (the kernel list has it).
TEST(TwoHeadDims, AutomaticRunsTheFusedMlaPair) {
  Context ctx;
  DeviceBuffer<uint16_t> q(ctx, 8 * 192), k(ctx, 8 * 192), v(ctx, 8 * 128);
  EXPECT_EQ(resolve_path(ctx, TensorView::bhsd(q.data(), DType::bf16, 1, 1, 8, 192),
                         TensorView::bhsd(k.data(), DType::bf16, 1, 1, 8, 192),
                         TensorView::bhsd(v.data(), DType::bf16, 1, 1, 8, 128), AttentionOptions{}),
            Path::fused);
}

// GPU-sized (support/gpu_sized.h): MLA's prefill pair at thousands of keys on the fused and cublas
// paths, key lengths cutting the last tiles.
using TwoHeadDimsOnGpu = testing::GpuSized<>;

TEST_F(TwoHeadDimsOnGpu, MlaPrefillPairAtLength) {
  std::vector<AttentionCase> cases;
  for (Path path : {Path::fused, Path::cublas})
    for (DType dtype : {DType::bf16, DType::f16})
      cases.push_back(with_v_dim(testing::make_case(dtype, 2, 4, 2, 1000, 2049, 192, Causal::bottom_right,
                                                    Layout::bshd, true, {2049, 1500}, path),
                                 128));
  testing::expect_all_pass(ctx, cases);
}

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
