// The sim's strided-batched GEMM (gemm_sim.cpp) against a plain loop written from cuBLAS's
// documentation: column-major, op(A) op(B), leading dimensions larger than the rows, batch strides
// with gaps, alpha/beta, f32/f16/bf16 storage; judged by the shared rule (judge.h). It runs on host
// memory directly.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "attention_harness.h"
#include "runtime/device.h"
#include "selfattn/error.h"

namespace selfattn {
namespace {

using detail::GemmBatch;

// Storage of one operand: `count` elements of `type`, random values already rounded to the type.
struct Storage {
  DType type;
  std::vector<unsigned char> bytes;
  float at(int64_t i) const { return testing::load_element(bytes.data(), type, size_t(i)); }
};
Storage random_storage(DType type, int64_t count, std::mt19937_64& rng) {
  Storage s{type, std::vector<unsigned char>(size_t(count) * dtype_size(type))};
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (int64_t i = 0; i < count; ++i) testing::store_element(s.bytes.data(), type, size_t(i), testing::round_to(type, uniform(rng)));
  return s;
}

struct GemmCase {
  bool trans_a, trans_b;
  int m, n, k, batch;
  DType in_type, out_type;
  float alpha, beta;
};

void check_gemm(const GemmCase& t, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int a_rows = t.trans_a ? t.k : t.m, a_cols = t.trans_a ? t.m : t.k;
  const int b_rows = t.trans_b ? t.n : t.k, b_cols = t.trans_b ? t.k : t.n;
  const int64_t lda = a_rows + 3, ldb = b_rows + 1, ldc = t.m + 2;  // padded leading dimensions
  const int64_t stride_a = lda * a_cols + 5, stride_b = ldb * b_cols + 7, stride_c = ldc * t.n + 3;  // gaps
  Storage a = random_storage(t.in_type, stride_a * t.batch, rng);
  Storage b = random_storage(t.in_type, stride_b * t.batch, rng);
  Storage c = random_storage(t.out_type, stride_c * t.batch, rng);
  const Storage c_before = c;

  GemmBatch g;
  g.trans_a = t.trans_a;
  g.trans_b = t.trans_b;
  g.m = t.m;
  g.n = t.n;
  g.k = t.k;
  g.alpha = t.alpha;
  g.beta = t.beta;
  g.a = a.bytes.data(); g.a_type = t.in_type; g.lda = lda; g.stride_a = stride_a;
  g.b = b.bytes.data(); g.b_type = t.in_type; g.ldb = ldb; g.stride_b = stride_b;
  g.c = c.bytes.data(); g.c_type = t.out_type; g.ldc = ldc; g.stride_c = stride_c;
  g.batch_count = t.batch;
  detail::sim_gemm_strided_batched(g);

  // Judged by the shared rule (judge.h): the exact product in double; the allowed one summed in fp32
  // in one chain and stored in C's type; each element's scale is |result| + the root sum of its
  // terms squared (|beta c| included).
  testing::Expected expected;
  expected.row_length = t.m;  // a column of C
  std::vector<double> got;
  for (int p = 0; p < t.batch; ++p) {
    for (int col = 0; col < t.n; ++col) {
      for (int row = 0; row < t.m; ++row) {
        double sum = 0, terms2 = 0;
        float allowed_sum = 0;
        for (int i = 0; i < t.k; ++i) {
          // op(A)(row, i) and op(B)(i, col), read from the stored column-major matrices.
          const float a_value = t.trans_a ? a.at(p * stride_a + i + row * lda) : a.at(p * stride_a + row + i * lda);
          const float b_value = t.trans_b ? b.at(p * stride_b + col + i * ldb) : b.at(p * stride_b + i + col * ldb);
          sum += double(a_value) * b_value;
          allowed_sum += a_value * b_value;
          terms2 += double(t.alpha) * a_value * b_value * (double(t.alpha) * a_value * b_value);
        }
        const int64_t c_index = p * stride_c + row + col * ldc;
        const double c_term = t.beta == 0 ? 0.0 : t.beta * double(c_before.at(c_index));
        const double exact = t.alpha * sum + c_term;
        const float allowed = t.alpha * allowed_sum + (t.beta == 0 ? 0.0f : t.beta * c_before.at(c_index));
        const double scale = std::abs(exact) + std::sqrt(terms2 + c_term * c_term);
        expected.exact.push_back(exact);
        expected.allowed.push_back(testing::round_to(t.out_type, allowed));
        expected.scale.push_back(scale);
        expected.floor.push_back(testing::rounding_floor(t.out_type, 4 + std::sqrt(double(t.k)), scale));
        got.push_back(c.at(c_index));
      }
    }
  }
  EXPECT_TRUE(testing::judge("C", got, expected))
      << "m " << t.m << " n " << t.n << " k " << t.k << " trans " << t.trans_a << t.trans_b;
  // Nothing outside the matrices was written: the padding rows and the gaps keep their values.
  for (int64_t i = 0; i < stride_c * t.batch; ++i) {
    const int64_t within = i % stride_c, col = within / ldc, row = within % ldc;
    if (col >= t.n || row >= t.m) {
      ASSERT_EQ(c.at(i), c_before.at(i)) << "element " << i << " outside C was written";
    }
  }
}

TEST(SimGemm, MatchesPlainLoopForEveryTransposeAndType) {
  uint64_t seed = testing::input_seed("SimGemm");
  for (bool trans_a : {false, true})
    for (bool trans_b : {false, true}) {
      check_gemm({trans_a, trans_b, 7, 5, 9, 3, DType::f32, DType::f32, 1.0f, 0.0f}, ++seed);
      check_gemm({trans_a, trans_b, 16, 3, 33, 2, DType::f16, DType::f32, 0.5f, 0.0f}, ++seed);
      check_gemm({trans_a, trans_b, 5, 11, 8, 2, DType::bf16, DType::bf16, 1.0f, 0.0f}, ++seed);
      check_gemm({trans_a, trans_b, 4, 4, 1, 1, DType::f16, DType::f16, -2.0f, 0.75f}, ++seed);
      check_gemm({trans_a, trans_b, 1, 1, 64, 4, DType::f32, DType::f32, 0.125f, 1.0f}, ++seed);
    }
}

TEST(SimGemm, BetaZeroDoesNotReadC) {
  std::vector<float> a = {1, 2}, b = {3, 4};  // 1x2 . 2x1
  std::vector<float> c = {std::numeric_limits<float>::quiet_NaN()};
  GemmBatch g;
  g.m = 1; g.n = 1; g.k = 2; g.alpha = 1; g.beta = 0;
  g.a = a.data(); g.lda = 1;
  g.b = b.data(); g.ldb = 2;
  g.c = c.data(); g.ldc = 1;
  detail::sim_gemm_strided_batched(g);
  EXPECT_EQ(c[0], 11.0f);
}

TEST(SimGemm, RejectsWhatCublasRejects) {
  std::vector<float> buffer(64);
  GemmBatch g;
  g.m = 4; g.n = 4; g.k = 4;
  g.a = buffer.data(); g.lda = 3;  // < m rows of A
  g.b = buffer.data(); g.ldb = 4;
  g.c = buffer.data(); g.ldc = 4;
  EXPECT_THROW(detail::sim_gemm_strided_batched(g), BackendError);
  g.lda = 4;
  g.trans_b = true;
  g.ldb = 3;  // < n rows of stored B^T
  EXPECT_THROW(detail::sim_gemm_strided_batched(g), BackendError);
  g.ldb = 4;
  g.b_type = DType::f16;  // A and B must share a type
  EXPECT_THROW(detail::sim_gemm_strided_batched(g), BackendError);
}

}  // namespace
}  // namespace selfattn
