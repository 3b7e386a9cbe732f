// attention_backward() on the naive path (sim): the sweep of backward_check.h, row chunking
// under a small workspace limit, bitwise determinism, and the kernel choice.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <tuple>

#include "backward_check.h"
#include "gpu_sized.h"
#include "kernels/registry.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

using backward_check::Case;

TEST(NaiveBackward, Sweep) {
  Context ctx;
  for (const Case& c : backward_check::sweep(Path::naive)) EXPECT_TRUE(backward_check::check(ctx, c));
}

TEST(NaiveBackward, SinksOverManyRowsAndVarlenRowsNobodyOwns) {
  Context ctx;
  const int sink_threads = kernels::sim_target::sink_gradient_instance().threads;
  ASSERT_GT(sink_threads, 0);
  for (const Case& c : backward_check::sinks_and_tails(Path::naive, DType::f32, 16, sink_threads))
    EXPECT_TRUE(backward_check::check(ctx, c));
}

// Every remainder of the naive backward's work division, from its kernels' tiles in the registry:
// S recomputed by the Q K^T tiles (keys per block), dK/dV by grad_kv (keys per block), dQ by the
// P V tiles (query rows per block), P and dS by backward_scores (rows per block): keys and rows
// one below, at and one above each, tensor-core (f16, d32) and SIMT (f32, d7) variants, causal
// diagonals and key lengths at the edges. And a sliding window whose edges sweep a whole Q K^T
// key tile and both its edges (left edges at keys 1 .. tile + 2, right at tile + 1 .. 2 tile + 2),
// and one whose left edge is a key tile's last key for the first row of every row tile.
TEST(NaiveBackward, EveryTileEdge) {
  using kernels::Element;
  namespace sim = kernels::sim_target;
  Context ctx;
  for (const auto& [dtype, element, d] : {std::tuple{DType::f16, Element::f16, 32}, std::tuple{DType::f32, Element::f32, 7}}) {
    const kernels::TiledKernel qk = sim::qk_tiled_instance(element, d), kv = sim::grad_kv_tiled_instance(element, d),
                              dq = sim::dq_tiled_instance(element, Element::f32, d);
    const int score_rows = sim::backward_scores_instance(Element::f32).rows_per_block;
    ASSERT_GT(qk.tile_cols, 0);
    ASSERT_GT(kv.tile_rows, 0);
    ASSERT_GT(dq.tile_rows, 0);
    ASSERT_GT(score_rows, 0);
    Case c;
    c.path = Path::naive;
    c.dtype = dtype;
    c.grad_f32 = true;
    c.head_dim = d;
    const std::string prefix = "naive_edges_" + std::string(to_string(dtype)) + "_";
    c.name = prefix + "keys_above_tiles";
    c.heads = 2, c.kv_heads = 1;
    c.seq_q = dq.tile_rows - 1, c.seq_k = std::max(qk.tile_cols, kv.tile_rows) + 1;
    EXPECT_TRUE(backward_check::check(ctx, c));
    c.name = prefix + "rows_above_tiles_keys_below_bottom_right";
    c.heads = 1;
    c.seq_q = std::max(dq.tile_rows, score_rows) + 1, c.seq_k = std::min(qk.tile_cols, kv.tile_rows) - 1;
    c.causal = Causal::bottom_right;
    EXPECT_TRUE(backward_check::check(ctx, c));
    c.name = prefix + "at_tiles_top_left_lengths";
    c.batch = 2;
    c.seq_q = dq.tile_rows, c.seq_k = kv.tile_rows + qk.tile_cols;
    c.key_lengths = {kv.tile_rows + 1, qk.tile_cols};
    c.causal = Causal::top_left;
    EXPECT_TRUE(backward_check::check(ctx, c));
    c = Case{};
    c.path = Path::naive;
    c.dtype = dtype;
    c.head_dim = d;
    c.name = prefix + "window_edges";
    c.heads = 2, c.kv_heads = 2;
    c.seq_q = qk.tile_cols + 2, c.seq_k = 2 * qk.tile_cols + 2;
    c.window_left = qk.tile_cols - 1, c.window_right = 1;
    EXPECT_TRUE(backward_check::check(ctx, c));
    // The kernels skip work by the window of a row tile's (or row slice's) first row: with
    // window_left 1 under top_left, row r's window starts at key r - 1, so every tile of rows
    // starting at a multiple of a key tile begins its window at that key tile's last key.
    const int key_tile = std::max(qk.tile_cols, kv.tile_rows);
    c.name = prefix + "window_starts_at_a_tiles_last_key";
    c.heads = 1, c.kv_heads = 1;
    c.seq_q = c.seq_k = 2 * key_tile + 2;
    c.causal = Causal::top_left;
    c.window_left = 1, c.window_right = -1;
    EXPECT_TRUE(backward_check::check(ctx, c));
  }
}

// A workspace limit that leaves room for a few score rows only: the chunks run row ranges of one
// head, and dK/dV accumulate across them. dQ rows are complete within a chunk, so dq is the same
// bits as with one chunk.
TEST(NaiveBackward, RowChunksGiveTheSameResult) {
  Case c;
  c.name = "chunked";
  c.dtype = DType::f16;
  c.heads = 4, c.kv_heads = 2, c.seq_q = 75, c.seq_k = 90, c.head_dim = 20;
  c.causal = Causal::bottom_right;
  c.path = Path::naive;
  backward_check::Gradients whole, chunked;
  Context big(Backend::sim);
  ASSERT_TRUE(backward_check::check(big, c, &whole));
  ContextOptions options;
  options.backend = Backend::sim;
  // D (4 * 300 rounded to 1280) + two accumulators (4 * 20 * 180 = 14400 each) + 9 rows of 2 * 4 * 92.
  options.workspace_limit = 1280 + 2 * 14592 + 9 * 2 * 4 * 92;
  Context small(options);
  ASSERT_TRUE(backward_check::check(small, c, &chunked));
  EXPECT_EQ(whole.dq, chunked.dq);
}

TEST(NaiveBackward, WorkspaceTooSmallOnlyWhenOneRowDoesNotFit) {
  Case c;
  c.name = "too_small";
  c.heads = 2, c.kv_heads = 1, c.seq_q = 5, c.seq_k = 300, c.head_dim = 8;
  c.path = Path::naive;
  ContextOptions options;
  options.backend = Backend::sim;
  // D 256 + two accumulators of 4 * 8 * 300 = 9600 -> 9728 each; one row needs 2 * 4 * 300 = 2400.
  options.workspace_limit = 256 + 2 * 9728 + 2400 - 1;
  Context small(options);
  EXPECT_THROW(backward_check::check(small, c), WorkspaceTooSmall);
  small.set_workspace_limit(options.workspace_limit + 1);
  EXPECT_TRUE(backward_check::check(small, c));
}

TEST(NaiveBackward, BitwiseDeterministic) {
  Context ctx;
  Case c;
  c.name = "determinism";
  c.dtype = DType::bf16;
  c.heads = 4, c.kv_heads = 2, c.seq_q = 65, c.seq_k = 130, c.head_dim = 40;
  c.path = Path::naive;
  c.deterministic_rerun = true;
  EXPECT_TRUE(backward_check::check(ctx, c));
}

TEST(NaiveBackward, RegistryPicksTensorCoresForHalfTypes) {
  using kernels::Element;
  namespace sim = kernels::sim_target;
  EXPECT_NE(std::string(sim::grad_kv_tiled_instance(Element::f16, 64).kernel.name).find("mma"), std::string::npos);
  EXPECT_NE(std::string(sim::grad_kv_tiled_instance(Element::bf16, 7).kernel.name).find("simt"), std::string::npos);
  EXPECT_NE(std::string(sim::grad_kv_tiled_instance(Element::f32, 64).kernel.name).find("simt"), std::string::npos);
  EXPECT_NE(std::string(sim::dq_tiled_instance(Element::bf16, Element::f32, 32).kernel.name).find("mma"),
            std::string::npos);
  EXPECT_NE(std::string(sim::dq_tiled_instance(Element::f16, Element::f32, 8).kernel.name).find("simt"),
            std::string::npos);
  EXPECT_EQ(sim::dq_tiled_instance(Element::f32, Element::f16, 32).kernel.name, nullptr);
}

// GPU-sized (support/gpu_sized.h): 300 x 1000 rows at head_dim 128, a 2 MB workspace that forces row
// chunks, and the deterministic rerun.
using NaiveBackwardOnGpu = testing::GpuSized<>;

TEST_F(NaiveBackwardOnGpu, LargerShapesChunksAndDeterminism) {
  ctx.set_workspace_limit(size_t(2) << 20);
  for (const Case& c : backward_check::larger_shapes(Path::naive)) EXPECT_TRUE(backward_check::check(ctx, c));
}

}  // namespace
}  // namespace selfattn
