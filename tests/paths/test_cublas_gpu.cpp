// GPU twin of test_cublas: the same sweep and a few larger shapes through the cuda backend (cuBLAS and
// the nvcc build of the softmax kernel). Skips, saying why, where no GPU is usable.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "attention_harness.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

using testing::Layout;
using testing::make_case;

std::optional<Context> cuda_context(std::string& reason, size_t workspace_limit = size_t(1) << 30) {
  try {
    ContextOptions options;
    options.backend = Backend::cuda;
    options.workspace_limit = workspace_limit;
    return Context(options);
  } catch (const NotAvailable& e) {
    reason = e.what();
    return std::nullopt;
  }
}

TEST(CublasPathGpu, SweepEveryDtype) {
  std::string reason;
  std::optional<Context> ctx = cuda_context(reason);
  if (!ctx) GTEST_SKIP() << reason;
  for (DType dtype : {DType::f32, DType::f16, DType::bf16})
    testing::expect_all_pass(*ctx, testing::sweep_cases(dtype, Path::cublas));
}

TEST(CublasPathGpu, LargerShapesAndChunks) {
  std::string reason;
  std::optional<Context> ctx = cuda_context(reason, size_t(4) << 20);  // 4 MB: forces chunks below
  if (!ctx) GTEST_SKIP() << reason;
  testing::expect_all_pass(*ctx, {
      make_case(DType::f16, 2, 4, 2, 512, 1000, 128, Causal::bottom_right, Layout::bshd, true, {1000, 517}, Path::cublas),
      make_case(DType::bf16, 1, 4, 4, 700, 3000, 64, Causal::top_left, Layout::bhsd, true, {}, Path::cublas),
      make_case(DType::f32, 3, 2, 1, 513, 257, 80, Causal::none, Layout::bshd, true, {0, 257, 100}, Path::cublas),
  });
}

TEST(CublasPathGpu, VariableLengthSequences) {
  std::string reason;
  std::optional<Context> ctx = cuda_context(reason);
  if (!ctx) GTEST_SKIP() << reason;
  using testing::VarlenCase;
  const std::vector<VarlenCase> cases = {
      {DType::f32, 2, 1, 7, {7, 0, 64}, {70, 9, 0}, Causal::bottom_right, Layout::bshd, true, Path::cublas},
      {DType::f16, 4, 2, 64, {33, 1, 513}, {33, 100, 700}, Causal::top_left, Layout::bshd, true, Path::cublas},
      {DType::bf16, 2, 2, 128, {170, 40}, {500, 0}, Causal::none, Layout::bhsd, true, Path::cublas},
  };
  for (const VarlenCase& c : cases) EXPECT_TRUE(testing::check_attention_varlen(*ctx, c));
}

}  // namespace
}  // namespace selfattn
