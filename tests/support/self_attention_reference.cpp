#include "self_attention_reference.h"

#include <cmath>

#include "attention_expected.h"
#include "attention_harness.h"

namespace selfattn::host_test {
namespace {

using testing::round_to;

std::vector<double> random_values(size_t n, DType dtype, std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(-1, 1);
  std::vector<double> values(n);
  for (double& x : values) x = round_to(dtype, uniform(rng));
  return values;
}

// Row-major [rows x inner] * [inner x cols] in double: the exact product.
std::vector<double> matmul(const std::vector<double>& a, const std::vector<double>& b, int rows, int inner, int cols) {
  std::vector<double> c(size_t(rows) * cols);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) {
      double sum = 0;
      for (int p = 0; p < inner; ++p) sum += a[size_t(i) * inner + p] * b[size_t(p) * cols + j];
      c[size_t(i) * cols + j] = sum;
    }
  return c;
}

// The same product as the library may compute it: summed in fp32, stored in the dtype.
std::vector<double> matmul_stored(const std::vector<double>& a, const std::vector<double>& b, int rows, int inner,
                                  int cols, DType dtype) {
  std::vector<double> c(size_t(rows) * cols);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) {
      float sum = 0;
      for (int p = 0; p < inner; ++p) sum += float(a[size_t(i) * inner + p]) * float(b[size_t(p) * cols + j]);
      c[size_t(i) * cols + j] = round_to(dtype, sum);
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

// The expected out and lse of the pipeline (judge.h): exact in double, nothing rounded between its
// steps; allowed as the library may compute it, each product summed in fp32 and stored in the dtype
// (Q, K, V, the attention output before W^O, the result) and attention as a path may compute it, so
// the rounding of the stored intermediates, propagated through the rest, is part of the allowance.
void expect_pipeline(const SelfAttentionCase& c, SelfAttentionProblem& e) {
  const std::vector<double>&x = e.x, &wq = e.wq, &wk = e.wk, &wv = e.wv, &wo = e.wo;
  const int rows = c.batch * c.seq, q_cols = c.heads * c.head_dim, kv_cols = c.kv_heads * c.head_dim;
  reference::Problem problem;
  problem.batch = c.batch, problem.heads = c.heads, problem.kv_heads = c.kv_heads;
  problem.seq_q = problem.seq_k = c.seq, problem.head_dim = c.head_dim, problem.causal = c.causal;
  auto heads_of = [&](const std::vector<double>& projected, int heads) {
    return to_bhsd(projected, c.batch, c.seq, heads, c.head_dim);
  };
  const reference::Result exact =
      reference::attention(problem, heads_of(matmul(x, wq, rows, c.d_model, q_cols), c.heads),
                           heads_of(matmul(x, wk, rows, c.d_model, kv_cols), c.kv_heads),
                           heads_of(matmul(x, wv, rows, c.d_model, kv_cols), c.kv_heads));
  // Which kernel runs inside is not visible from here: for f16/bf16 allow the tensor-core one,
  // which rounds P.
  testing::AttentionArithmetic arithmetic;
  arithmetic.dtype = c.dtype;
  arithmetic.p_rounded = c.dtype != DType::f32;
  const testing::AttentionExpected attention = testing::expected_attention(
      problem, heads_of(matmul_stored(x, wq, rows, c.d_model, q_cols, c.dtype), c.heads),
      heads_of(matmul_stored(x, wk, rows, c.d_model, kv_cols, c.dtype), c.kv_heads),
      heads_of(matmul_stored(x, wv, rows, c.d_model, kv_cols, c.dtype), c.kv_heads), arithmetic);

  e.lse = attention.lse;
  e.lse.exact = exact.lse;
  if (c.d_out == 0) {
    e.out = attention.out;
    e.out.exact = exact.out;
    return;
  }
  // y = concat(heads) W^O. Its scale: each term a_m w_mc with the attention output a_m counted at
  // its own scale (its error is proportional to that, not to |a_m|).
  auto concat = [&](const std::vector<double>& per_head) { return to_bshd(per_head, c.batch, c.seq, c.heads, c.head_dim); };
  const std::vector<double> a_scale = concat(attention.out.scale);
  e.out.row_length = c.d_out;
  e.out.exact = matmul(concat(exact.out), wo, rows, q_cols, c.d_out);
  e.out.allowed = matmul_stored(concat(attention.out.allowed), wo, rows, q_cols, c.d_out, c.dtype);
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < c.d_out; ++j) {
      double terms2 = 0;
      for (int m = 0; m < q_cols; ++m) {
        const double term = a_scale[size_t(r) * q_cols + m] * wo[size_t(m) * c.d_out + j];
        terms2 += term * term;
      }
      const double scale = std::abs(e.out.exact[size_t(r) * c.d_out + j]) + std::sqrt(terms2);
      e.out.scale.push_back(scale);
      e.out.floor.push_back(testing::rounding_floor(c.dtype, 4 + std::sqrt(double(q_cols)), scale));
    }
}

}  // namespace

std::string SelfAttentionCase::name() const {
  return std::string(to_string(dtype)) + " b" + std::to_string(batch) + " s" + std::to_string(seq) + " m" +
         std::to_string(d_model) + " h" + std::to_string(heads) + "/" + std::to_string(kv_heads) + " d" +
         std::to_string(head_dim) + " wo" + std::to_string(d_out) + " " + to_string(causal);
}

SelfAttentionProblem make_self_attention_problem(const SelfAttentionCase& c, std::mt19937& rng) {
  SelfAttentionProblem p;
  const int rows = c.batch * c.seq;
  p.x = random_values(size_t(rows) * c.d_model, c.dtype, rng);
  p.wq = random_values(size_t(c.d_model) * c.heads * c.head_dim, c.dtype, rng);
  p.wk = random_values(size_t(c.d_model) * c.kv_heads * c.head_dim, c.dtype, rng);
  p.wv = random_values(p.wk.size(), c.dtype, rng);
  p.wo = random_values(size_t(c.heads) * c.head_dim * c.d_out, c.dtype, rng);
  expect_pipeline(c, p);
  return p;
}

DeviceBuffer<unsigned char> upload(Context& ctx, const std::vector<double>& values, DType dtype) {
  std::vector<unsigned char> bytes(values.size() * dtype_size(dtype));
  for (size_t i = 0; i < values.size(); ++i) testing::store_element(bytes.data(), dtype, i, float(values[i]));
  DeviceBuffer<unsigned char> buffer(ctx, bytes.size());
  buffer.copy_from_host(bytes);
  return buffer;
}

}  // namespace selfattn::host_test
