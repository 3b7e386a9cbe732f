#pragma once
// After a GEMM over all keys (cuBLAS, or the sim's GEMM: both take k from the host), the sum it
// should have had: over the keys before a length that lives on the device. Where op(B) is 0 past
// the bound (P and dS past a key length are), each term past it is 0 * op(A): a zero where op(A) is
// finite, which changes nothing, and NaN where it is not (an unused cache row), which makes the
// element non-finite. So recomputing, over the bound only, just the elements that came out
// non-finite gives the bounded sum everywhere (an element non-finite for another reason is
// recomputed to the same). With finite padding the kernel only reads C.
#include <cstdint>

#include "common/compat.h"
#include "launch.h"
#include "params.h"
#include "simt_tile.cuh"

SELFATTN_KERNELS_BEGIN

__device__ inline float gemm_repair_load(const void* base, Element element, int64_t index) {
  switch (element) {
    case Element::f32: return static_cast<const float*>(base)[index];
    case Element::f16: return to_float(static_cast<const __half*>(base)[index]);
    case Element::bf16: return to_float(static_cast<const __nv_bfloat16*>(base)[index]);
  }
  return 0.0f;
}

__device__ inline void gemm_repair_store(void* base, Element element, int64_t index, float value) {
  switch (element) {
    case Element::f32: static_cast<float*>(base)[index] = value; return;
    case Element::f16: static_cast<__half*>(base)[index] = from_float<__half>(value); return;
    case Element::bf16: static_cast<__nv_bfloat16*>(base)[index] = from_float<__nv_bfloat16>(value); return;
  }
}

// One thread per element of C (a grid-stride loop), row fastest: neighbouring threads read
// neighbouring elements of C.
__global__ void gemm_key_repair_kernel(const GemmKeyRepairParams p) {
  const int given = *p.key_length - p.key_offset;
  const int bound = given < 0 ? 0 : (given < p.k ? given : p.k);
  const int64_t per_problem = int64_t(p.m) * p.n;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < per_problem * p.batch_count; e += stride) {
    const int64_t problem = e / per_problem, within = e % per_problem;
    const int64_t row = within % p.m, col = within / p.m;
    const int64_t c_index = problem * p.stride_c + row + col * p.ldc;
    if (isfinite(gemm_repair_load(p.c, p.c_element, c_index))) continue;
    float sum = 0.0f;
    for (int i = 0; i < bound; ++i) {
      const int64_t a_index = problem * p.stride_a + (p.trans_a ? i + row * p.lda : row + i * p.lda);
      const int64_t b_index = problem * p.stride_b + (p.trans_b ? col + i * p.ldb : i + col * p.ldb);
      sum += gemm_repair_load(p.a, p.a_element, a_index) * gemm_repair_load(p.b, p.a_element, b_index);
    }
    gemm_repair_store(p.c, p.c_element, c_index, p.alpha * sum);
  }
}

SELFATTN_KERNELS_END
