// GPU twin of test_backward_fused: the same sweep on the cuda backend (the nvcc build of the fused
// backward kernels), a larger shape in both modes, and the deterministic mode bitwise stable. Skips,
// saying why, where no GPU is usable.
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "backward_check.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

using backward_check::Case;

TEST(FusedBackwardGpu, Sweep) {
  std::string reason;
  std::optional<Context> ctx = testing::cuda_context(reason);
  if (!ctx) GTEST_SKIP() << reason;
  for (const Case& c : backward_check::fused_sweep()) EXPECT_TRUE(backward_check::check(*ctx, c));
}

TEST(FusedBackwardGpu, LargerShapesBothModes) {
  std::string reason;
  std::optional<Context> ctx = testing::cuda_context(reason);
  if (!ctx) GTEST_SKIP() << reason;
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
      EXPECT_TRUE(backward_check::check(*ctx, c));
    }
  }
}

}  // namespace
}  // namespace selfattn
