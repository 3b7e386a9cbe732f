// The fused backward path (kernels/backward/flash_bwd_dkdv.cuh, flash_bwd_dq.cuh) on the sim, judged by
// the shared backward check (tests/support/backward_check.h): f16 and bf16, every shipped head dim,
// causal both alignments, GQA, odd shapes, key lengths, varlen with empty sequences, the masks and
// score modifiers, gradients in f32 and in the input dtype, in both modes (dQ by atomics, and the
// deterministic dQ kernel); the deterministic mode bitwise identical run to run.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "backward_check.h"
#include "gpu_sized.h"
#include "kernels/registry.h"
#include "selfattn_sim/sim.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

using backward_check::Case;

TEST(FusedBackward, Sweep) {
  Context ctx;
  for (const Case& c : backward_check::fused_sweep()) EXPECT_TRUE(backward_check::check(ctx, c));
}

// The fused backward's tiles for a head dim, from the registry: the dK/dV kernel's keys per block
// (16 per warp) and query rows per staged Q/dO tile; the deterministic dQ kernel's query rows per
// block (16 per warp) and keys per K/V tile.
struct BackwardTiles {
  int kv_block_keys, kv_warp_keys, kv_loop_rows, dq_block_rows, dq_warp_rows, dq_loop_keys;
  bool operator==(const BackwardTiles& o) const {
    return kv_block_keys == o.kv_block_keys && kv_warp_keys == o.kv_warp_keys && kv_loop_rows == o.kv_loop_rows &&
           dq_block_rows == o.dq_block_rows && dq_warp_rows == o.dq_warp_rows && dq_loop_keys == o.dq_loop_keys;
  }
};
BackwardTiles backward_tiles(int head_dim) {
  using kernels::Element;
  namespace sim = kernels::sim_target;
  kernels::FlashBwdInstance kv, dq;
  switch (head_dim) {
    case 32: kv = sim::flash_bwd_dkdv_instance<Element::f16, 32, 32>(), dq = sim::flash_bwd_dq_instance<Element::f16, 32, 32>(); break;
    case 64: kv = sim::flash_bwd_dkdv_instance<Element::f16, 64, 64>(), dq = sim::flash_bwd_dq_instance<Element::f16, 64, 64>(); break;
    case 96: kv = sim::flash_bwd_dkdv_instance<Element::f16, 96, 96>(), dq = sim::flash_bwd_dq_instance<Element::f16, 96, 96>(); break;
    default: kv = sim::flash_bwd_dkdv_instance<Element::f16, 128, 128>(), dq = sim::flash_bwd_dq_instance<Element::f16, 128, 128>(); break;
  }
  return {kv.block_tile, kv.block_tile / (kv.block_threads / 32), kv.loop_tile,
          dq.block_tile, dq.block_tile / (dq.block_threads / 32), dq.loop_tile};
}

// Every remainder of both kernels' work division, from their tiles: keys one below, at and one
// above a dK/dV block and past the first warp's 16 keys; query rows one below and above a staged
// Q/dO tile and a dQ block, and past the first warp's dQ rows; causal diagonals and key lengths
// ending at and one past a tile edge. Each distinct tiling once (the first head dim that has it),
// in both dQ modes (atomic and the deterministic dQ kernel).
TEST(FusedBackward, SinksOverManyRowsAndVarlenRowsNobodyOwns) {
  Context ctx;
  const int sink_threads = kernels::sim_target::sink_gradient_instance().threads;
  ASSERT_GT(sink_threads, 0);
  for (const Case& c : backward_check::sinks_and_tails(Path::fused, DType::bf16, 64, sink_threads))
    EXPECT_TRUE(backward_check::check(ctx, c));
}

TEST(FusedBackward, EveryTileEdge) {
  Context ctx;
  std::vector<Case> cases;
  const auto add = [&](Case c, const std::string& name) {
    c.path = Path::fused;
    for (bool deterministic : {false, true}) {
      c.deterministic = deterministic;
      c.name = "fused_edges_" + std::string(to_string(c.dtype)) + "_d" + std::to_string(c.head_dim) + "_" + name +
               (deterministic ? "_deterministic" : "_atomic");
      cases.push_back(c);
    }
  };
  std::vector<BackwardTiles> tested;
  for (const auto& [dtype, d] : {std::pair{DType::f16, 32}, std::pair{DType::bf16, 64}, std::pair{DType::f16, 96},
                                 std::pair{DType::bf16, 128}}) {
    const BackwardTiles t = backward_tiles(d);
    if (std::find(tested.begin(), tested.end(), t) != tested.end()) continue;
    tested.push_back(t);
    ASSERT_GT(t.kv_loop_rows, 0);
    ASSERT_GT(t.dq_loop_keys, 0);
    Case c;
    c.dtype = dtype;
    c.head_dim = d;
    c.heads = 2, c.kv_heads = 1;
    c.seq_q = t.kv_loop_rows - 1, c.seq_k = t.kv_block_keys + 1;
    add(c, "rows_below_tile_keys_above_block");
    c.heads = 1;
    c.seq_q = t.kv_loop_rows + 1, c.seq_k = t.kv_block_keys - 1;
    c.causal = Causal::bottom_right;
    c.grad_f32 = true;
    add(c, "rows_above_tile_keys_below_block_bottom_right");
    c.seq_q = t.dq_block_rows + 1, c.seq_k = t.dq_loop_keys;
    c.causal = Causal::top_left;
    c.grad_f32 = false;
    c.bshd = true;
    add(c, "rows_above_dq_block_top_left");
    c.batch = 2;
    c.seq_q = t.dq_warp_rows + 1, c.seq_k = t.kv_warp_keys + 1 + t.dq_loop_keys;
    c.key_lengths = {t.kv_warp_keys + 1, t.dq_loop_keys};
    c.causal = Causal::none;
    add(c, "past_first_warps_lengths_at_edges");
  }
  for (const Case& c : cases) EXPECT_TRUE(backward_check::check(ctx, c));
}

// A sliding window whose edges sweep a whole key tile and both its edges (left edges at keys 1 ..
// tile + 2, right edges at tile + 1 .. 2 tile + 2), in both kernels: the dK/dV kernel skips query
// tiles outside a key block's window and the dQ kernel key tiles outside a row block's. Head dim 96:
// staged query tiles (32 rows) smaller than the key blocks (64).
TEST(FusedBackward, WindowEdgeAtEveryKeyOfATile) {
  Context ctx;
  for (int d : {96}) {
    const BackwardTiles t = backward_tiles(d);
    const int tile = std::max(t.dq_loop_keys, t.kv_block_keys);
    Case c;
    c.path = Path::fused;
    c.dtype = DType::bf16;
    c.head_dim = d;
    c.heads = 2, c.kv_heads = 1;
    c.seq_q = tile + 2, c.seq_k = 2 * tile + 2;
    c.window_left = tile - 1, c.window_right = 1;
    for (bool deterministic : {false, true}) {
      c.deterministic = deterministic;
      c.name = "fused_window_edges_d" + std::to_string(d) + (deterministic ? "_deterministic" : "_atomic");
      EXPECT_TRUE(backward_check::check(ctx, c));
    }
    // Row blocks skip key tiles by their first row's window: window_left 1 under top_left starts
    // row r's window at key r - 1, the last key of a tile for every block starting on a tile edge.
    c.heads = 1;
    c.seq_q = c.seq_k = 2 * tile + 2;
    c.causal = Causal::top_left;
    c.window_left = 1, c.window_right = -1;
    for (bool deterministic : {false, true}) {
      c.deterministic = deterministic;
      c.name = "fused_window_starts_at_a_tiles_last_key_d" + std::to_string(d) +
               (deterministic ? "_deterministic" : "_atomic");
      EXPECT_TRUE(backward_check::check(ctx, c));
    }
  }
}

TEST(FusedBackward, DeterministicIsBitwiseStable) {
  Context ctx;
  Case c;
  c.path = Path::fused;
  c.name = "fused_deterministic_rerun";
  c.dtype = DType::bf16;
  c.heads = 4, c.kv_heads = 2, c.seq_q = 65, c.seq_k = 97, c.head_dim = 64;
  c.causal = Causal::top_left;
  c.deterministic = true;
  c.deterministic_rerun = true;
  EXPECT_TRUE(backward_check::check(ctx, c));
}

// The deterministic mode does not depend on the order blocks and warps run in: the gradients under
// three sim scheduler seeds (different permutations of blocks and of threads) are bitwise equal.
TEST(FusedBackward, DeterministicAcrossSchedulerSeeds) {
  Context ctx;
  Case c;
  c.path = Path::fused;
  c.name = "fused_deterministic_seeds";
  c.dtype = DType::f16;
  c.heads = 2, c.kv_heads = 1, c.seq_q = 77, c.seq_k = 600, c.head_dim = 32;  // 5+ key tiles a row
  c.causal = Causal::bottom_right;
  c.grad_f32 = true;  // fp32 gradients: a last-bit difference of the sums is not rounded away
  c.deterministic = true;
  const sim::Options saved = sim::options();
  std::vector<backward_check::Gradients> runs;
  for (uint64_t seed : {11, 12, 13}) {
    sim::Options options = saved;
    options.seed = seed;
    sim::set_options(options);
    backward_check::Gradients g;
    EXPECT_TRUE(backward_check::check(ctx, c, &g));
    runs.push_back(g);
  }
  sim::set_options(saved);
  for (size_t i = 1; i < runs.size(); ++i) {
    EXPECT_EQ(runs[i].dq, runs[0].dq);
    EXPECT_EQ(runs[i].dk, runs[0].dk);
    EXPECT_EQ(runs[i].dv, runs[0].dv);
  }
}

TEST(FusedBackward, UnsupportedCallsSayWhy) {
  Context ctx;
  Case c;
  c.path = Path::fused;
  c.name = "fused_fp32";
  c.dtype = DType::f32;
  c.seq_q = c.seq_k = 8, c.head_dim = 32;
  try {
    (void)backward_check::check(ctx, c);
    ADD_FAILURE() << "fp32 on the fused backward path: expected NotAvailable";
  } catch (const NotAvailable& e) {
    EXPECT_NE(std::string(e.what()).find("fused"), std::string::npos) << e.what();
  }
}

// GPU-sized (support/gpu_sized.h): 517 x 1000 rows, GQA 4, head_dim 64 and 128, in both modes, the
// deterministic one rerun bitwise.
using FusedBackwardOnGpu = testing::GpuSized<>;

TEST_F(FusedBackwardOnGpu, LargerShapesBothModes) {
  for (int head_dim : {64, 128}) {
    for (bool deterministic : {false, true}) {
      Case c;
      c.path = Path::fused;
      c.name = "fused_larger_d" + std::to_string(head_dim) + (deterministic ? "_deterministic" : "_atomic");
      c.dtype = DType::bf16;
      c.batch = 2, c.heads = 8, c.kv_heads = 2, c.seq_q = 517, c.seq_k = 1000, c.head_dim = head_dim;
      c.causal = Causal::bottom_right;
      c.key_lengths = {1000, 611};
      c.deterministic = deterministic;
      c.deterministic_rerun = deterministic;
      EXPECT_TRUE(backward_check::check(ctx, c));
    }
  }
}

}  // namespace
}  // namespace selfattn
