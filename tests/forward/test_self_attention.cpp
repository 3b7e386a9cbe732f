// self_attention() on the sim against the reference pipeline (self_attention_reference.h):
// projections, attention per head (GQA, causal), the optional output projection, judged by the
// shared rule (judge.h) with the rounding of the stored intermediates part of the allowance.
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "attention_harness.h"
#include "self_attention_reference.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

using host_test::SelfAttentionCase;
using testing::load_element;

void check(Context& ctx, const SelfAttentionCase& c) {
  SCOPED_TRACE(c.name());
  std::mt19937 rng(uint32_t(std::hash<std::string>{}(c.name())));
  const host_test::SelfAttentionProblem p = host_test::make_self_attention_problem(c, rng);
  const testing::Expected& expected = p.out;

  // Library.
  using host_test::upload;
  DeviceBuffer<unsigned char> xd = upload(ctx, p.x, c.dtype), wqd = upload(ctx, p.wq, c.dtype),
                              wkd = upload(ctx, p.wk, c.dtype), wvd = upload(ctx, p.wv, c.dtype),
                              wod = upload(ctx, p.wo, c.dtype);
  DeviceBuffer<unsigned char> out(ctx, expected.size() * dtype_size(c.dtype));
  DeviceBuffer<float> lse(ctx, size_t(c.batch) * c.heads * c.seq);
  out.fill_bytes(0xFF);  // NaN in every dtype
  lse.fill_bytes(0xFF);
  const TensorView x_view = TensorView::bhsd(xd.data(), c.dtype, c.batch, 1, c.seq, c.d_model);
  auto matrix = [&](DeviceBuffer<unsigned char>& w, int rows_w, int cols) {
    return MatrixView::row_major(w.data(), c.dtype, rows_w, cols);
  };
  const MatrixView wo_matrix = matrix(wod, c.heads * c.head_dim, c.d_out);
  const TensorView out_view = c.d_out > 0 ? TensorView::bhsd(out.data(), c.dtype, c.batch, 1, c.seq, c.d_out)
                                          : TensorView::bhsd(out.data(), c.dtype, c.batch, c.heads, c.seq, c.head_dim);
  AttentionOptions options;
  options.causal = c.causal;
  options.lse = lse.data();
  self_attention(ctx, x_view, matrix(wqd, c.d_model, c.heads * c.head_dim), matrix(wkd, c.d_model, c.kv_heads * c.head_dim),
                 matrix(wvd, c.d_model, c.kv_heads * c.head_dim), c.heads, out_view, options,
                 c.d_out > 0 ? &wo_matrix : nullptr);
  const std::vector<unsigned char> got_bytes = out.to_host();
  std::vector<double> got(expected.size());
  for (size_t i = 0; i < got.size(); ++i) got[i] = load_element(got_bytes.data(), c.dtype, i);
  const std::vector<float> lse_got = lse.to_host();
  testing::Measured measured;
  EXPECT_TRUE(testing::judge("out", got, expected, &measured.out));
  EXPECT_TRUE(testing::judge("lse", std::vector<double>(lse_got.begin(), lse_got.end()), p.lse, &measured.lse));
  if (std::getenv("SELFATTN_TEST_REPORT") != nullptr) testing::print_report(c.name(), measured);
}

TEST(SelfAttention, MatchesTheReferencePipeline) {
  Context ctx(Backend::sim);
  const SelfAttentionCase cases[] = {
      {DType::f32, 2, 7, 12, 4, 2, 3, 0, Causal::none},
      {DType::f32, 1, 13, 5, 2, 2, 4, 5, Causal::top_left},
      {DType::f16, 1, 33, 64, 2, 1, 32, 16, Causal::bottom_right},
      {DType::bf16, 3, 1, 8, 1, 1, 8, 0, Causal::none},
  };
  for (const SelfAttentionCase& c : cases) check(ctx, c);
}

TEST(SelfAttention, WarmCallsDoNotGrowTheWorkspace) {
  Context ctx(Backend::sim);
  const SelfAttentionCase c{DType::f32, 2, 9, 8, 2, 1, 4, 3, Causal::none};
  check(ctx, c);
  const size_t held = ctx.workspace_bytes();
  EXPECT_GT(held, 0u);
  check(ctx, c);
  EXPECT_EQ(ctx.workspace_bytes(), held);
}

}  // namespace
}  // namespace selfattn
