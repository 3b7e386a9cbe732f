// attention_backward() with two head dims: q, k, dq, dk of head_dim_qk; v, out, dout, dv of
// head_dim_v (issue 48 items 1 and 4). The naive and cublas paths run any pair, the fused path MLA's
// prefill pair (192, 128), judged by backward_check.h against the double reference with two head
// dims; the fused path refuses other pairs by name with nothing written.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backward_check.h"
#include "gpu_sized.h"
#include "kernels/registry.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

using backward_check::Case;

// The pairs the models use (MLA prefill 192/128; absorbed decode 576/512 at a few rows), odd pairs
// either way round, a head_dim_v of 1, and pairs that put one product on tensor cores and the other
// on the SIMT kernels (head dims below 16 and above), with every mask, modifier and call form.
std::vector<Case> two_head_dim_cases(Path path) {
  std::vector<Case> cases;
  const auto add = [&](const Case& c) { cases.push_back(backward_check::on_path(path, c)); };
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    Case c;
    c.dtype = dtype;
    c.grad_f32 = dtype == DType::bf16;
    c.name = "mla_prefill_192_128_gqa_bottom_right_lengths";
    c.batch = 2, c.heads = 4, c.kv_heads = 2, c.seq_q = 19, c.seq_k = 41, c.head_dim = 192, c.head_dim_v = 128;
    c.causal = Causal::bottom_right;
    c.key_lengths = {41, 0};
    add(c);
    c = Case{};
    c.dtype = dtype;
    c.name = "absorbed_576_512_mqa_two_rows_dlse";
    c.heads = 4, c.kv_heads = 1, c.seq_q = 2, c.seq_k = 37, c.head_dim = 576, c.head_dim_v = 512;
    c.dlse = true;
    add(c);
    c = Case{};
    c.dtype = dtype;
    c.name = "odd_7_40_top_left_bshd";
    c.heads = 2, c.kv_heads = 2, c.seq_q = 23, c.seq_k = 17, c.head_dim = 7, c.head_dim_v = 40;
    c.causal = Causal::top_left;
    c.bshd = true;
    add(c);
    c = Case{};
    c.dtype = dtype;
    c.name = "odd_40_9_varlen_empty_sequences";
    c.heads = 2, c.kv_heads = 1, c.head_dim = 40, c.head_dim_v = 9;
    c.causal = Causal::bottom_right;
    c.varlen_q = {7, 0, 20, 1};
    c.varlen_k = {13, 5, 0, 9};
    c.unowned_q_rows = 3, c.unowned_k_rows = 2;
    add(c);
  }
  Case c;
  c.dtype = DType::bf16;
  c.name = "v_dim_1_sinks_window";
  c.heads = 3, c.kv_heads = 1, c.seq_q = 30, c.seq_k = 30, c.head_dim = 24, c.head_dim_v = 1;
  c.sinks = true;
  c.window_left = 5, c.window_right = 2;
  add(c);
  c = Case{};
  c.dtype = DType::f16;
  c.grad_f32 = true;
  c.name = "48_16_softcap_alibi_bias_key_start_q_offset";
  c.batch = 2, c.heads = 2, c.kv_heads = 2, c.seq_q = 11, c.seq_k = 29, c.head_dim = 48, c.head_dim_v = 16;
  c.softcap = 20;
  c.alibi = true;
  c.bias = true;
  c.key_start = {3, 0};
  c.q_offset = {5, 18};
  c.causal = Causal::bottom_right;
  add(c);
  c = Case{};
  c.dtype = DType::bf16;
  c.name = "64_32_dropout_sinks";
  c.heads = 2, c.kv_heads = 1, c.seq_q = 33, c.seq_k = 50, c.head_dim = 64, c.head_dim_v = 32;
  c.dropout_p = 0.2f, c.dropout_seed = 7, c.dropout_offset = 11;
  c.sinks = true;
  add(c);
  c = Case{};
  c.dtype = DType::f16;
  c.name = "12_80_bool_bias_deterministic";
  c.heads = 2, c.kv_heads = 2, c.seq_q = 21, c.seq_k = 26, c.head_dim = 12, c.head_dim_v = 80;
  c.bias = true, c.bias_bool = true;
  c.deterministic_rerun = true;
  add(c);
  return cases;
}

class BackwardTwoHeadDims : public ::testing::TestWithParam<Path> {};

TEST_P(BackwardTwoHeadDims, AgreeWithTheReference) {
  Context ctx;
  for (const Case& c : two_head_dim_cases(GetParam())) EXPECT_TRUE(backward_check::check(ctx, c));
}

INSTANTIATE_TEST_SUITE_P(ScorePaths, BackwardTwoHeadDims, ::testing::Values(Path::naive, Path::cublas),
                         [](const ::testing::TestParamInfo<Path>& info) { return to_string(info.param); });

// A workspace limit that leaves room for a few score rows: the chunks split the rows of a head and
// dK (192 columns) and dV (128) accumulate across them in accumulators of their own sizes; dQ's
// rows are complete within a chunk, so dq is the same bits as with one chunk.
TEST(BackwardTwoHeadDims, RowChunksGiveTheSameResult) {
  for (Path path : {Path::naive, Path::cublas}) {
    Case c;
    c.name = std::string(to_string(path)) + "_chunked_192_128";
    c.dtype = DType::bf16;
    c.grad_f32 = true;
    c.heads = 4, c.kv_heads = 2, c.seq_q = 45, c.seq_k = 60, c.head_dim = 192, c.head_dim_v = 128;
    c.causal = Causal::bottom_right;
    c.path = path;
    backward_check::Gradients whole, chunked;
    Context big(Backend::sim);
    ASSERT_TRUE(backward_check::check(big, c, &whole));
    ContextOptions options;
    options.backend = Backend::sim;
    // D (4 * 180 rounded to 768), the dK accumulator (4 * 192 * 120) and dV's (4 * 128 * 120), then
    // 768 bytes per row: 7 rows of cublas's scores (2 fp32 and 2 bf16 values per key), 11 of naive's.
    options.workspace_limit = 768 + 4 * 192 * 120 + 4 * 128 * 120 + 7 * (2 * 4 + 2 * 2) * 64;
    Context small(options);
    ASSERT_TRUE(backward_check::check(small, c, &chunked));
    EXPECT_EQ(whole.dq, chunked.dq) << c.name;
  }
}

// The fused backward at MLA's prefill pair (kernels (192, 128) of flash_bwd_kernels.inc), in both dQ
// modes, with sizes on each edge of both kernels' work division (from the instances: keys per dK/dV
// block and per warp, query rows per staged Q/dO tile; query rows per dQ block and per warp, keys
// per K/V tile), every causal mode, GQA, both layouts with row gaps, key lengths, left padding and
// query offsets, every modifier, sinks, dropout, dlse, and varlen with empty sequences and unowned
// rows.
TEST(BackwardTwoHeadDims, FusedMlaPrefillPair) {
  namespace sim = kernels::sim_target;
  using kernels::Element;
  const kernels::FlashBwdInstance kv = sim::flash_bwd_dkdv_instance<Element::bf16, 192, 128>();
  const kernels::FlashBwdInstance dq = sim::flash_bwd_dq_instance<Element::bf16, 192, 128>();
  ASSERT_TRUE(kv.kernel && dq.kernel);
  ASSERT_TRUE((sim::flash_bwd_dkdv_instance<Element::f16, 192, 128>().kernel));
  const int block_keys = kv.block_tile, warp_keys = kv.block_tile / (kv.block_threads / 32);
  const int loop_rows = kv.loop_tile, dq_rows = dq.block_tile, dq_warp_rows = dq.block_tile / (dq.block_threads / 32);
  const int loop_keys = dq.loop_tile;
  ASSERT_GT(loop_rows, 0);
  ASSERT_GT(loop_keys, 0);

  std::vector<Case> cases;
  const auto add = [&](Case c) {
    c.path = Path::fused;
    c.head_dim = 192, c.head_dim_v = 128;
    const std::string name = c.name;
    for (bool deterministic : {false, true}) {
      c.deterministic = deterministic;
      c.name = "fused_mla_" + std::string(to_string(c.dtype)) + "_" + name +
               (deterministic ? "_deterministic" : "_atomic");
      cases.push_back(c);
    }
  };
  Case c;
  c.name = "rows_above_tile_keys_above_block_gqa_lengths";
  c.dtype = DType::bf16;
  c.grad_f32 = true;
  c.batch = 2, c.heads = 4, c.kv_heads = 2, c.seq_q = loop_rows + 1, c.seq_k = block_keys + 1;
  c.causal = Causal::bottom_right;
  c.key_lengths = {block_keys + 1, block_keys - 1};
  add(c);
  c = Case{};
  c.name = "rows_above_dq_block_keys_below_tile_top_left_bshd";
  c.dtype = DType::f16;
  c.heads = 2, c.kv_heads = 1, c.seq_q = dq_rows + 1, c.seq_k = loop_keys - 1;
  c.causal = Causal::top_left;
  c.bshd = true;
  add(c);
  c = Case{};
  c.name = "past_first_warps_rows_below_tile";
  c.dtype = DType::bf16;
  c.heads = 1, c.kv_heads = 1, c.seq_q = loop_rows - 1, c.seq_k = warp_keys + 1 + loop_keys;
  add(c);
  c = Case{};
  c.name = "past_first_dq_warp_shared_layout_gap";
  c.dtype = DType::f16;
  c.grad_f32 = true;
  c.heads = 2, c.kv_heads = 2, c.seq_q = dq_warp_rows + 1, c.seq_k = 2 * block_keys - 1;
  c.strides = testing::Strides::shared;
  c.row_gap = 8;
  add(c);
  c = Case{};
  c.name = "one_by_one";
  c.dtype = DType::bf16;
  c.seq_q = 1, c.seq_k = 1;
  c.causal = Causal::bottom_right;
  add(c);
  c = Case{};
  c.name = "window_softcap_alibi_bias_sinks";
  c.dtype = DType::f16;
  c.batch = 2, c.heads = 3, c.kv_heads = 1, c.seq_q = 21, c.seq_k = block_keys + 5;
  c.causal = Causal::bottom_right;
  c.window_left = loop_keys - 1, c.window_right = 3;
  c.softcap = 8;
  c.alibi = true;
  c.bias = true;
  c.sinks = true;
  add(c);
  c = Case{};
  c.name = "key_start_q_offset_dlse";
  c.dtype = DType::bf16;
  c.batch = 2, c.heads = 2, c.kv_heads = 2, c.seq_q = 9, c.seq_k = 2 * loop_keys + 3;
  c.causal = Causal::bottom_right;
  c.key_start = {loop_keys + 1, 0};
  c.q_offset = {5, 2 * loop_keys};
  c.dlse = true;
  add(c);
  c = Case{};
  c.name = "dropout_bool_bias";
  c.dtype = DType::bf16;
  c.heads = 2, c.kv_heads = 2, c.seq_q = 17, c.seq_k = loop_keys + 7;
  c.causal = Causal::top_left;
  c.dropout_p = 0.2f, c.dropout_seed = 5, c.dropout_offset = 3;
  c.bias = true, c.bias_bool = true;
  add(c);
  c = Case{};
  c.name = "varlen_empty_sequences_unowned_rows";
  c.dtype = DType::f16;
  c.heads = 4, c.kv_heads = 1;
  c.causal = Causal::bottom_right;
  c.varlen_q = {5, 0, loop_rows + 2, 1};
  c.varlen_k = {block_keys + 2, 3, 40, 0};
  c.unowned_q_rows = 2, c.unowned_k_rows = 3;
  add(c);
  c = Case{};
  c.name = "deterministic_rerun";
  c.dtype = DType::bf16;
  c.heads = 2, c.kv_heads = 1, c.seq_q = 40, c.seq_k = 70;
  c.causal = Causal::bottom_right;
  c.deterministic_rerun = true;
  add(c);
  Context ctx;
  for (const Case& one : cases) EXPECT_TRUE(backward_check::check(ctx, one));
}

// The automatic choice runs a path that takes the pair: the fused path for MLA's (192, 128), and
// another for a pair no fused kernel has.
TEST(BackwardTwoHeadDims, AutomaticRunsAPathThatTakesThem) {
  Context ctx;
  Case c;
  c.name = "automatic_f16_96_64";
  c.dtype = DType::f16;
  c.heads = 2, c.kv_heads = 1, c.seq_q = 40, c.seq_k = 64, c.head_dim = 96, c.head_dim_v = 64;
  c.causal = Causal::bottom_right;
  c.path = Path::automatic;
  EXPECT_TRUE(backward_check::check(ctx, c));
  c.name = "automatic_bf16_192_128";
  c.dtype = DType::bf16;
  c.head_dim = 192, c.head_dim_v = 128;
  EXPECT_TRUE(backward_check::check(ctx, c));
}

TEST(BackwardTwoHeadDims, FusedPathRefusesOtherPairsByName) {
  Context ctx;
  const int seq = 16, d_qk = 64, d_v = 32;
  DeviceBuffer<uint16_t> q(ctx, seq * d_qk), k(ctx, seq * d_qk), v(ctx, seq * d_v), out(ctx, seq * d_v),
      dout(ctx, seq * d_v), dq(ctx, seq * d_qk), dk(ctx, seq * d_qk), dv(ctx, seq * d_v);
  DeviceBuffer<float> lse(ctx, seq);
  for (DeviceBuffer<uint16_t>* input : {&q, &k, &v, &out, &dout}) input->fill_bytes(0);
  lse.fill_bytes(0);
  for (DeviceBuffer<uint16_t>* gradient : {&dq, &dk, &dv}) gradient->fill_bytes(0xFF);
  auto view = [](DeviceBuffer<uint16_t>& buffer, int d) {
    return TensorView::bhsd(buffer.data(), DType::f16, 1, 1, seq, d);
  };
  AttentionOptions options;
  options.path = Path::fused;
  try {
    attention_backward(ctx, view(q, d_qk), view(k, d_qk), view(v, d_v), view(out, d_v), view(dout, d_v), lse.data(),
                       view(dq, d_qk), view(dk, d_qk), view(dv, d_v), options);
    ADD_FAILURE() << "the fused backward ran head_dim_v 32 with head_dim_qk 64";
  } catch (const NotAvailable& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim_v != head_dim_qk except MLA's (192, 128)"), std::string::npos)
        << e.what();
  }
  for (DeviceBuffer<uint16_t>* gradient : {&dq, &dk, &dv})
    for (uint16_t bits : gradient->to_host()) ASSERT_EQ(bits, 0xFFFF);
}

// GPU-sized (support/gpu_sized.h): the MLA prefill pair at 300 x 1000 rows, both score paths (a
// 2 MB workspace that forces row chunks) and the fused path in both dQ modes.
using BackwardTwoHeadDimsOnGpu = testing::GpuSized<>;

TEST_F(BackwardTwoHeadDimsOnGpu, MlaPrefillPairAtLength) {
  ctx.set_workspace_limit(size_t(2) << 20);
  for (Path path : {Path::naive, Path::cublas}) {
    Case c;
    c.name = std::string(to_string(path)) + "_gpu_192_128";
    c.path = path;
    c.dtype = DType::bf16;
    c.grad_f32 = true;
    c.batch = 2, c.heads = 4, c.kv_heads = 2, c.seq_q = 300, c.seq_k = 1000, c.head_dim = 192, c.head_dim_v = 128;
    c.causal = Causal::bottom_right;
    EXPECT_TRUE(backward_check::check(ctx, c));
  }
  ctx.set_workspace_limit(size_t(64) << 20);  // the fused path's dQ accumulator: 1.8 MB
  for (bool deterministic : {false, true}) {
    Case c;
    c.name = std::string("fused_gpu_192_128") + (deterministic ? "_deterministic" : "_atomic");
    c.path = Path::fused;
    c.dtype = DType::bf16;
    c.batch = 2, c.heads = 4, c.kv_heads = 2, c.seq_q = 300, c.seq_k = 1000, c.head_dim = 192, c.head_dim_v = 128;
    c.causal = Causal::bottom_right;
    c.key_lengths = {1000, 611};
    c.deterministic = deterministic;
    c.deterministic_rerun = deterministic;
    EXPECT_TRUE(backward_check::check(ctx, c));
  }
}

}  // namespace
}  // namespace selfattn
