// attention_backward() on the naive path (sim): the sweep of backward_check.h, row chunking
// under a small workspace limit, bitwise determinism, and the kernel choice.
#include <gtest/gtest.h>

#include <string>

#include "backward_check.h"
#include "kernels/registry.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

using backward_check::Case;

TEST(NaiveBackward, Sweep) {
  Context ctx(Backend::sim);
  for (const Case& c : backward_check::sweep(Path::naive)) EXPECT_TRUE(backward_check::check(ctx, c));
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
  Context ctx(Backend::sim);
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

}  // namespace
}  // namespace selfattn
