// GPU twin of test_score_mods: masks and score modifiers through the cuda backend (the nvcc build of
// the same kernels, cuBLAS for the cublas path) on every path, at sizes the sim would take long
// over: every head dim of the tensor-core kernel, a narrow window over many keys, every feature
// combined, varlen. Skips, saying why, where no GPU is usable.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "attention_harness.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

using testing::AlibiSlopes;
using testing::AttentionCase;
using testing::BiasLayout;
using testing::cuda_context;
using testing::Layout;
using testing::make_case;
using testing::ScoreModsCase;

class ScoreModsGpu : public ::testing::TestWithParam<Path> {
 protected:
  Path path() const { return GetParam(); }
};

ScoreModsCase everything() {
  ScoreModsCase m;
  m.window_left = 100;
  m.window_right = 20;
  m.softcap = 8.0f;
  m.alibi = AlibiSlopes::batch_heads;
  m.bias = BiasLayout::full;
  m.masked_row_period = 37;
  m.masked_key_period = 13;
  return m;
}

TEST_P(ScoreModsGpu, EveryFeatureEveryDtype) {
  std::string reason;
  std::optional<Context> ctx = cuda_context(reason);
  if (!ctx) GTEST_SKIP() << reason;
  std::vector<AttentionCase> cases;
  const Causal causals[] = {Causal::none, Causal::top_left, Causal::bottom_right};
  int i = 0;
  for (DType dtype : {DType::f32, DType::f16, DType::bf16})
    for (int head_dim : {32, 64, 96, 128, 256}) {
      AttentionCase c = make_case(dtype, 2, 4, 2, 300 + 7 * i, 700 - 11 * i, head_dim, causals[i % 3],
                                  i % 2 ? Layout::bshd : Layout::bhsd, true, i % 4 ? std::vector<int32_t>{}
                                                                                   : std::vector<int32_t>{650, 300},
                                  path());
      c.mods = everything();
      c.mods.bias = i % 2 ? BiasLayout::heads : BiasLayout::full;
      c.mods.bias_in_input_dtype = i % 3 == 1;
      cases.push_back(c);
      ++i;
    }
  testing::expect_all_pass(*ctx, cases);
}

// A window of 128 keys over 8k: the fused kernels visit only the window's tiles.
TEST_P(ScoreModsGpu, NarrowWindowOverLongKeys) {
  std::string reason;
  std::optional<Context> ctx = cuda_context(reason);
  if (!ctx) GTEST_SKIP() << reason;
  ScoreModsCase window;
  window.window_left = 128;
  window.window_right = 0;
  AttentionCase c = make_case(DType::bf16, 1, 4, 1, 1000, 8192, 128, Causal::bottom_right, Layout::bhsd, true, {}, path());
  c.mods = window;
  AttentionCase no_causal = make_case(DType::f16, 1, 2, 2, 2000, 2000, 64, Causal::none, Layout::bshd, true, {}, path());
  no_causal.mods = window;
  no_causal.mods.window_right = 64;
  testing::expect_all_pass(*ctx, {c, no_causal});
}

TEST_P(ScoreModsGpu, Varlen) {
  std::string reason;
  std::optional<Context> ctx = cuda_context(reason);
  if (!ctx) GTEST_SKIP() << reason;
  testing::VarlenCase c{DType::bf16, 4, 2, 128, {170, 0, 513}, {500, 30, 513}, Causal::bottom_right, Layout::bshd,
                        true, path()};
  EXPECT_TRUE(testing::check_attention_varlen(*ctx, c, everything())) << c.name() << everything().name();
}

INSTANTIATE_TEST_SUITE_P(EveryPath, ScoreModsGpu, ::testing::Values(Path::naive, Path::cublas, Path::fused),
                         [](const ::testing::TestParamInfo<Path>& info) { return std::string(to_string(info.param)); });

}  // namespace
}  // namespace selfattn
