// GPU twin of test_fused / test_fused_varlen: the same sweeps, every tensor-core head dim at sizes
// with many query blocks and key tiles, and varlen batches, through the cuda backend (the nvcc build
// of the same kernels). Skips, saying why, where no GPU is usable.
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

using testing::cuda_context;

TEST(FusedPathGpu, SweepEveryDtype) {
  std::string reason;
  std::optional<Context> ctx = cuda_context(reason);
  if (!ctx) GTEST_SKIP() << reason;
  for (DType dtype : {DType::f32, DType::f16, DType::bf16})
    testing::expect_all_pass(*ctx, testing::sweep_cases(dtype, Path::fused));
}

TEST(FusedPathGpu, EveryTensorCoreHeadDimLarger) {
  std::string reason;
  std::optional<Context> ctx = cuda_context(reason);
  if (!ctx) GTEST_SKIP() << reason;
  std::vector<testing::AttentionCase> cases;
  const Causal causals[] = {Causal::none, Causal::top_left, Causal::bottom_right};
  int i = 0;
  for (DType dtype : {DType::f16, DType::bf16}) {
    for (int head_dim : {32, 64, 96, 128, 256}) {
      const Causal causal = causals[i % 3];
      const Layout layout = i % 2 ? Layout::bshd : Layout::bhsd;
      cases.push_back(make_case(dtype, 2, 4, 2, 517, 1000, head_dim, causal, layout, true, {1000, 301}, Path::fused));
      cases.push_back(make_case(dtype, 1, 2, 1, 1024, 777, head_dim, causals[(i + 1) % 3], layout, true, {}, Path::fused));
      ++i;
    }
  }
  cases.push_back(make_case(DType::f32, 2, 2, 1, 300, 700, 128, Causal::top_left, Layout::bshd, true, {700, 0}, Path::fused));
  cases.push_back(make_case(DType::f32, 1, 2, 2, 257, 513, 256, Causal::none, Layout::bhsd, true, {}, Path::fused));
  testing::expect_all_pass(*ctx, cases);
}

TEST(FusedPathGpu, Varlen) {
  std::string reason;
  std::optional<Context> ctx = cuda_context(reason);
  if (!ctx) GTEST_SKIP() << reason;
  constexpr Layout bhsd = Layout::bhsd, bshd = Layout::bshd;
  constexpr Path fused = Path::fused;
  const std::vector<testing::VarlenCase> cases = {
      {DType::f16, 4, 2, 128, {300, 0, 1, 129}, {512, 7, 0, 129}, Causal::bottom_right, bshd, true, fused},
      {DType::bf16, 2, 1, 64, {64, 700}, {1000, 65}, Causal::top_left, bhsd, true, fused},
      {DType::f16, 2, 2, 256, {33, 200}, {100, 300}, Causal::none, bshd, true, fused},
      {DType::f32, 2, 1, 96, {50, 0, 70}, {130, 3, 0}, Causal::bottom_right, bhsd, true, fused},
      {DType::bf16, 2, 1, 64, {90, 33}, {40, 170}, Causal::top_left, bhsd, true, fused, 1},
  };
  for (const testing::VarlenCase& c : cases) EXPECT_TRUE(testing::check_attention_varlen(*ctx, c));
}

}  // namespace
}  // namespace selfattn
