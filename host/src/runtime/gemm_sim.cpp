// The sim's strided-batched GEMM, with cuBLAS's exact conventions (cublasGemmStridedBatchedEx,
// CUBLAS_COMPUTE_32F), so the cublas path's argument logic is exercised on the CPU:
//   for p in [0, batch_count):  C_p = alpha * op(A_p) op(B_p) + beta * C_p
//   column-major: element (r, c) of a stored matrix X with leading dimension ldx is x[r + c * ldx];
//   op(A) is m x k (A stored m x k, or k x m when trans_a), op(B) is k x n (stored k x n, or n x k);
//   X_p starts stride_x elements after X_{p-1}; products accumulate in fp32; C is stored rounded to
//   nearest-even in its type; beta == 0 means C is not read (NaN in C does not propagate).
// Invalid arguments are reported as cuBLAS reports them (CUBLAS_STATUS_INVALID_VALUE), as BackendError.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "runtime/device.h"
#include "selfattn/error.h"

namespace selfattn::detail {
namespace {

float load(const void* base, DType type, int64_t index) {
  switch (type) {
    case DType::f32: return static_cast<const float*>(base)[index];
    case DType::f16: return __half2float(static_cast<const __half*>(base)[index]);
    case DType::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[index]);
    case DType::b8:
    case DType::e4m3:
    case DType::e5m2: break;  // never a GEMM operand
  }
  return 0;
}

void store(void* base, DType type, int64_t index, float value) {
  switch (type) {
    case DType::f32: static_cast<float*>(base)[index] = value; return;
    case DType::f16: static_cast<__half*>(base)[index] = __float2half_rn(value); return;
    case DType::bf16: static_cast<__nv_bfloat16*>(base)[index] = __float2bfloat16_rn(value); return;
    case DType::b8:
    case DType::e4m3:
    case DType::e5m2: return;  // never a GEMM operand
  }
}

const void* advance(const void* base, DType type, int64_t elements) {
  return static_cast<const unsigned char*>(base) + elements * int64_t(dtype_size(type));
}

[[noreturn]] void invalid(const std::string& what) {
  throw BackendError("sim gemm_strided_batched: CUBLAS_STATUS_INVALID_VALUE (" + what + ")");
}

void check_arguments(const GemmBatch& g) {
  if (g.m < 0 || g.n < 0 || g.k < 0 || g.batch_count < 0) invalid("m, n, k and batch_count must be >= 0");
  const int64_t a_rows = g.trans_a ? g.k : g.m;
  const int64_t b_rows = g.trans_b ? g.n : g.k;
  if (g.lda < std::max<int64_t>(1, a_rows)) invalid("lda " + std::to_string(g.lda) + " < rows of A " + std::to_string(a_rows));
  if (g.ldb < std::max<int64_t>(1, b_rows)) invalid("ldb " + std::to_string(g.ldb) + " < rows of B " + std::to_string(b_rows));
  if (g.ldc < std::max<int64_t>(1, g.m)) invalid("ldc " + std::to_string(g.ldc) + " < m " + std::to_string(g.m));
  // cublasGemmEx takes A and B of one type (f16/f16, bf16/bf16, f32/f32).
  if (g.a_type != g.b_type) invalid("A and B must have the same type");
  if (g.c_type != DType::f32 && g.c_type != g.a_type) invalid("C must be f32 or the type of A and B");
}

}  // namespace

void sim_gemm_strided_batched(const GemmBatch& g) {
  check_arguments(g);
  if (g.m == 0 || g.n == 0) return;
  // op(A) row-wise and op(B) column-wise in fp32, so the inner loop runs over contiguous floats.
  std::vector<float> a_rows(size_t(g.m) * g.k), b_cols(size_t(g.n) * g.k);
  for (int p = 0; p < g.batch_count; ++p) {
    const void* a = advance(g.a, g.a_type, p * g.stride_a);
    const void* b = advance(g.b, g.b_type, p * g.stride_b);
    void* c = const_cast<void*>(advance(g.c, g.c_type, p * g.stride_c));
    for (int row = 0; row < g.m; ++row)
      for (int i = 0; i < g.k; ++i)
        a_rows[size_t(row) * g.k + i] = load(a, g.a_type, g.trans_a ? i + int64_t(row) * g.lda : row + int64_t(i) * g.lda);
    for (int col = 0; col < g.n; ++col)
      for (int i = 0; i < g.k; ++i)
        b_cols[size_t(col) * g.k + i] = load(b, g.b_type, g.trans_b ? col + int64_t(i) * g.ldb : i + int64_t(col) * g.ldb);
    for (int col = 0; col < g.n; ++col) {
      const float* b_col = b_cols.data() + size_t(col) * g.k;
      for (int row = 0; row < g.m; ++row) {
        const float* a_row = a_rows.data() + size_t(row) * g.k;
        float sum = 0;
        for (int i = 0; i < g.k; ++i) sum += a_row[i] * b_col[i];
        const int64_t c_index = row + int64_t(col) * g.ldc;
        const float result = g.beta == 0.0f ? g.alpha * sum : g.alpha * sum + g.beta * load(c, g.c_type, c_index);
        store(c, g.c_type, c_index, result);
      }
    }
  }
}

}  // namespace selfattn::detail
