// GPU twin of test_backward_cublas: the same sweep, NaN key padding, chunking and determinism checks
// on the cuda backend (the nvcc build of the kernels, cuBLAS). Skips, saying why, where no GPU is
// usable.
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "backward_check.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

using backward_check::Case;

TEST(CublasBackwardGpu, Sweep) {
  std::string reason;
  std::optional<Context> ctx = testing::cuda_context(reason);
  if (!ctx) GTEST_SKIP() << reason;
  for (const Case& c : backward_check::sweep(Path::cublas)) EXPECT_TRUE(backward_check::check(*ctx, c));
}

// cuBLAS sums over all keys and the elements that came out NaN are recomputed over the key length
// (device_cuda.cu): the same gradients up to summation order (a few units in the last place of
// bf16 / f16 at most), not bitwise.
TEST(CublasBackwardGpu, NanKeyPaddingReachesNoGradient) {
  std::string reason;
  std::optional<Context> ctx = testing::cuda_context(reason);
  if (!ctx) GTEST_SKIP() << reason;
  EXPECT_TRUE(testing::check_backward_ignores_key_padding(*ctx, Path::cublas, 1.0 / 128));
}

TEST(CublasBackwardGpu, LargerShapesChunksAndDeterminism) {
  std::string reason;
  std::optional<Context> ctx = testing::cuda_context(reason, size_t(2) << 20);  // 2 MB: forces row chunks
  if (!ctx) GTEST_SKIP() << reason;
  Case c;
  c.name = "larger";
  c.path = Path::cublas;
  c.dtype = DType::bf16;
  c.grad_f32 = true;
  c.batch = 2, c.heads = 4, c.kv_heads = 2, c.seq_q = 300, c.seq_k = 1000, c.head_dim = 128;
  c.causal = Causal::bottom_right;
  c.key_lengths = {1000, 517};
  c.deterministic_rerun = true;
  EXPECT_TRUE(backward_check::check(*ctx, c));
  c.name = "larger_f16";
  c.dtype = DType::f16;
  c.grad_f32 = false;
  c.causal = Causal::none;
  c.key_lengths = {};
  c.head_dim = 64;
  EXPECT_TRUE(backward_check::check(*ctx, c));
}

}  // namespace
}  // namespace selfattn
