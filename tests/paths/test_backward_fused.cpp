// The fused backward path (kernels/backward/flash_bwd_dkdv.cuh, flash_bwd_dq.cuh) on the sim, judged by
// the shared backward check (tests/support/backward_check.h): f16 and bf16, every shipped head dim,
// causal both alignments, GQA, odd shapes, key lengths, varlen with empty sequences, the masks and
// score modifiers, gradients in f32 and in the input dtype, in both modes (dQ by atomics, and the
// deterministic dQ kernel); the deterministic mode bitwise identical run to run.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backward_check.h"
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
