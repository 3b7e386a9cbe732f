#include "self_attention_reference.h"

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

  const std::vector<double> q = matmul_rounded(p.x, p.wq, rows, c.d_model, c.heads * c.head_dim, c.dtype);
  const std::vector<double> k = matmul_rounded(p.x, p.wk, rows, c.d_model, c.kv_heads * c.head_dim, c.dtype);
  const std::vector<double> v = matmul_rounded(p.x, p.wv, rows, c.d_model, c.kv_heads * c.head_dim, c.dtype);
  reference::Problem problem;
  problem.batch = c.batch, problem.heads = c.heads, problem.kv_heads = c.kv_heads;
  problem.seq_q = problem.seq_k = c.seq, problem.head_dim = c.head_dim, problem.causal = c.causal;
  const reference::Result attended = reference::attention(problem, to_bhsd(q, c.batch, c.seq, c.heads, c.head_dim),
                                                          to_bhsd(k, c.batch, c.seq, c.kv_heads, c.head_dim),
                                                          to_bhsd(v, c.batch, c.seq, c.kv_heads, c.head_dim));
  p.out = attended.out;
  p.lse = attended.lse;
  if (c.d_out > 0) {
    std::vector<double> concat = to_bshd(attended.out, c.batch, c.seq, c.heads, c.head_dim);
    for (double& value : concat) value = round_to(c.dtype, float(value));
    p.out = matmul_rounded(concat, p.wo, rows, c.heads * c.head_dim, c.d_out, DType::f32);
  }
  return p;
}

double self_attention_tolerance(DType dtype) { return dtype == DType::f32 ? 2e-5 : dtype == DType::f16 ? 5e-3 : 3e-2; }

DeviceBuffer<unsigned char> upload(Context& ctx, const std::vector<double>& values, DType dtype) {
  std::vector<unsigned char> bytes(values.size() * dtype_size(dtype));
  for (size_t i = 0; i < values.size(); ++i) testing::store_element(bytes.data(), dtype, i, float(values[i]));
  DeviceBuffer<unsigned char> buffer(ctx, bytes.size());
  buffer.copy_from_host(bytes);
  return buffer;
}

}  // namespace selfattn::host_test
