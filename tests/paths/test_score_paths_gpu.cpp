// GPU twin of test_score_paths: the naive and cublas paths' sweep and a few larger shapes through the
// cuda backend (cuBLAS and the nvcc build of the same kernels). Skips, saying why, where no GPU is usable.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "attention_harness.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

using testing::cuda_context;
using testing::Layout;
using testing::make_case;

class ScorePathGpu : public ::testing::TestWithParam<Path> {
 protected:
  Path path() const { return GetParam(); }
};

TEST_P(ScorePathGpu, SweepEveryDtype) {
  std::string reason;
  std::optional<Context> ctx = cuda_context(reason);
  if (!ctx) GTEST_SKIP() << reason;
  for (DType dtype : {DType::f32, DType::f16, DType::bf16})
    testing::expect_all_pass(*ctx, testing::sweep_cases(dtype, path()));
}

TEST_P(ScorePathGpu, LargerShapesAndChunks) {
  std::string reason;
  std::optional<Context> ctx = cuda_context(reason, size_t(4) << 20);  // 4 MB: forces chunks below
  if (!ctx) GTEST_SKIP() << reason;
  testing::expect_all_pass(*ctx, {
      make_case(DType::f16, 2, 4, 2, 512, 1000, 128, Causal::bottom_right, Layout::bshd, true, {1000, 517}, path()),
      make_case(DType::bf16, 1, 4, 4, 700, 3000, 64, Causal::top_left, Layout::bhsd, true, {}, path()),
      make_case(DType::f32, 3, 2, 1, 513, 257, 80, Causal::none, Layout::bshd, true, {0, 257, 100}, path()),
  });
}

TEST_P(ScorePathGpu, VariableLengthSequences) {
  std::string reason;
  std::optional<Context> ctx = cuda_context(reason);
  if (!ctx) GTEST_SKIP() << reason;
  using testing::VarlenCase;
  const std::vector<VarlenCase> cases = {
      {DType::f32, 2, 1, 7, {7, 0, 64}, {70, 9, 0}, Causal::bottom_right, Layout::bshd, true, path()},
      {DType::f16, 4, 2, 64, {33, 1, 513}, {33, 100, 700}, Causal::top_left, Layout::bshd, true, path()},
      {DType::bf16, 2, 2, 128, {170, 40}, {500, 0}, Causal::none, Layout::bhsd, true, path()},
  };
  for (const VarlenCase& c : cases) EXPECT_TRUE(testing::check_attention_varlen(*ctx, c));
}

INSTANTIATE_TEST_SUITE_P(NaiveAndCublas, ScorePathGpu, ::testing::Values(Path::naive, Path::cublas),
                         [](const ::testing::TestParamInfo<Path>& info) { return std::string(to_string(info.param)); });

}  // namespace
}  // namespace selfattn
