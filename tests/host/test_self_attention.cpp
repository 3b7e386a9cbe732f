// self_attention() on the sim against a double-precision reference of the whole pipeline:
// projections, attention per head (GQA, causal), the optional output projection. The reference
// rounds each intermediate the library stores (Q, K, V, and the attention output before W^O) to
// the dtype, so the comparison measures the computation, not the storage format.
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "attention_harness.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

using testing::load_element;
using testing::round_to;
using testing::store_element;

struct Case {
  DType dtype = DType::f32;
  int batch = 1, seq = 1, d_model = 1, heads = 1, kv_heads = 1, head_dim = 1;
  int d_out = 0;  // 0: no W^O
  Causal causal = Causal::none;
  std::string name() const {
    return std::string(to_string(dtype)) + " b" + std::to_string(batch) + " s" + std::to_string(seq) + " m" +
           std::to_string(d_model) + " h" + std::to_string(heads) + "/" + std::to_string(kv_heads) + " d" +
           std::to_string(head_dim) + " wo" + std::to_string(d_out) + " " + to_string(causal);
  }
};

// Random values already representable in the dtype.
std::vector<double> random_values(size_t n, DType dtype, std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(-1, 1);
  std::vector<double> values(n);
  for (double& x : values) x = round_to(dtype, uniform(rng));
  return values;
}

DeviceBuffer<unsigned char> upload(Context& ctx, const std::vector<double>& values, DType dtype) {
  std::vector<unsigned char> bytes(values.size() * dtype_size(dtype));
  for (size_t i = 0; i < values.size(); ++i) store_element(bytes.data(), dtype, i, float(values[i]));
  DeviceBuffer<unsigned char> buffer(ctx, bytes.size());
  buffer.copy_from_host(bytes);
  return buffer;
}

// Row-major [rows x inner] * [inner x cols], each result rounded to the dtype the library stores it in.
std::vector<double> matmul_rounded(const std::vector<double>& a, const std::vector<double>& b, int rows, int inner,
                                   int cols, DType dtype) {
  std::vector<double> c(size_t(rows) * cols);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) {
      double sum = 0;
      for (int p = 0; p < inner; ++p) sum += a[size_t(i) * inner + p] * b[size_t(p) * cols + j];
      c[size_t(i) * cols + j] = round_to(dtype, float(sum));
    }
  return c;
}

// [batch, seq, heads, dim] (a projection's rows) -> [batch, heads, seq, dim] (the reference's layout), and back.
std::vector<double> to_bhsd(const std::vector<double>& bshd, int batch, int seq, int heads, int dim) {
  std::vector<double> out(bshd.size());
  for (int b = 0; b < batch; ++b)
    for (int s = 0; s < seq; ++s)
      for (int h = 0; h < heads; ++h)
        for (int d = 0; d < dim; ++d)
          out[((size_t(b) * heads + h) * seq + s) * dim + d] = bshd[((size_t(b) * seq + s) * heads + h) * dim + d];
  return out;
}
std::vector<double> to_bshd(const std::vector<double>& bhsd, int batch, int seq, int heads, int dim) {
  std::vector<double> out(bhsd.size());
  for (int b = 0; b < batch; ++b)
    for (int s = 0; s < seq; ++s)
      for (int h = 0; h < heads; ++h)
        for (int d = 0; d < dim; ++d)
          out[((size_t(b) * seq + s) * heads + h) * dim + d] = bhsd[((size_t(b) * heads + h) * seq + s) * dim + d];
  return out;
}

double tolerance(DType dtype) { return dtype == DType::f32 ? 2e-5 : dtype == DType::f16 ? 5e-3 : 3e-2; }

void check(Context& ctx, const Case& c) {
  SCOPED_TRACE(c.name());
  std::mt19937 rng(uint32_t(std::hash<std::string>{}(c.name())));
  const int rows = c.batch * c.seq;
  const std::vector<double> x = random_values(size_t(rows) * c.d_model, c.dtype, rng);
  const std::vector<double> wq = random_values(size_t(c.d_model) * c.heads * c.head_dim, c.dtype, rng);
  const std::vector<double> wk = random_values(size_t(c.d_model) * c.kv_heads * c.head_dim, c.dtype, rng);
  const std::vector<double> wv = random_values(wk.size(), c.dtype, rng);
  const std::vector<double> wo = random_values(size_t(c.heads) * c.head_dim * c.d_out, c.dtype, rng);

  // Reference.
  const std::vector<double> q = matmul_rounded(x, wq, rows, c.d_model, c.heads * c.head_dim, c.dtype);
  const std::vector<double> k = matmul_rounded(x, wk, rows, c.d_model, c.kv_heads * c.head_dim, c.dtype);
  const std::vector<double> v = matmul_rounded(x, wv, rows, c.d_model, c.kv_heads * c.head_dim, c.dtype);
  reference::Problem problem;
  problem.batch = c.batch, problem.heads = c.heads, problem.kv_heads = c.kv_heads;
  problem.seq_q = problem.seq_k = c.seq, problem.head_dim = c.head_dim, problem.causal = c.causal;
  const reference::Result attended =
      reference::attention(problem, to_bhsd(q, c.batch, c.seq, c.heads, c.head_dim),
                           to_bhsd(k, c.batch, c.seq, c.kv_heads, c.head_dim), to_bhsd(v, c.batch, c.seq, c.kv_heads, c.head_dim));
  std::vector<double> expected = attended.out;
  if (c.d_out > 0) {
    std::vector<double> concat = to_bshd(attended.out, c.batch, c.seq, c.heads, c.head_dim);
    for (double& value : concat) value = round_to(c.dtype, float(value));
    expected = matmul_rounded(concat, wo, rows, c.heads * c.head_dim, c.d_out, DType::f32);
  }

  // Library.
  DeviceBuffer<unsigned char> xd = upload(ctx, x, c.dtype), wqd = upload(ctx, wq, c.dtype), wkd = upload(ctx, wk, c.dtype),
                              wvd = upload(ctx, wv, c.dtype), wod = upload(ctx, wo, c.dtype);
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

  double error = 0, norm = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double got = load_element(got_bytes.data(), c.dtype, i);
    ASSERT_TRUE(std::isfinite(got)) << "element " << i << " not written (or NaN)";
    error += (got - expected[i]) * (got - expected[i]);
    norm += expected[i] * expected[i];
  }
  EXPECT_LE(std::sqrt(error / norm), tolerance(c.dtype));
  const std::vector<float> lse_got = lse.to_host();
  for (size_t i = 0; i < lse_got.size(); ++i) {
    EXPECT_NEAR(lse_got[i], attended.lse[i], 1e-3 * std::max(1.0, std::abs(attended.lse[i]))) << "lse row " << i;
  }
}

TEST(SelfAttention, MatchesTheReferencePipeline) {
  Context ctx(Backend::sim);
  const Case cases[] = {
      {DType::f32, 2, 7, 12, 4, 2, 3, 0, Causal::none},
      {DType::f32, 1, 13, 5, 2, 2, 4, 5, Causal::top_left},
      {DType::f16, 1, 33, 64, 2, 1, 32, 16, Causal::bottom_right},
      {DType::bf16, 3, 1, 8, 1, 1, 8, 0, Causal::none},
  };
  for (const Case& c : cases) check(ctx, c);
}

TEST(SelfAttention, WarmCallsDoNotGrowTheWorkspace) {
  Context ctx(Backend::sim);
  const Case c{DType::f32, 2, 9, 8, 2, 1, 4, 3, Causal::none};
  check(ctx, c);
  const size_t held = ctx.workspace_bytes();
  EXPECT_GT(held, 0u);
  check(ctx, c);
  EXPECT_EQ(ctx.workspace_bytes(), held);
}

}  // namespace
}  // namespace selfattn
