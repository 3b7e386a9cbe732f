// The fused backward path (kernels/backward/flash_bwd_dkdv.cuh, flash_bwd_dq.cuh) on the sim, judged by
// the shared backward check (tests/support/backward_check.h): f16 and bf16, every shipped head dim,
// causal both alignments, GQA, odd shapes, key lengths, varlen with empty sequences, the masks and
// score modifiers, gradients in f32 and in the input dtype, in both modes (dQ by atomics, and the
// deterministic dQ kernel); the deterministic mode bitwise identical run to run.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backward_check.h"
#include "selfattn_sim/sim.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

using backward_check::Case;

TEST(FusedBackward, Sweep) {
  Context ctx;
  for (const Case& c : backward_check::fused_sweep()) EXPECT_TRUE(backward_check::check(ctx, c));
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

}  // namespace
}  // namespace selfattn
