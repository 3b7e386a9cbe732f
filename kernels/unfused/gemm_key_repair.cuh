#pragma once
// After a GEMM over all keys (cuBLAS, or the sim's GEMM: both take k from the host), the sum it
// should have had: over the keys its query row sees, which depend on a length that lives on the
// device (past the length, and, under a window aligned at the last key, before the window). Where
// op(B) is 0 outside those keys (P and dS are), each term there is 0 * op(A): a zero where op(A) is
// finite, which changes nothing, and NaN where it is not (an unused cache row, a dropped key),
// which makes the element non-finite. So recomputing, over the visible keys only, just the
// elements that came out non-finite gives the bounded sum everywhere (an element non-finite for
// another reason is recomputed to the same). With finite keys the kernel only reads C.
#include <cstdint>

#include "../common/causal_mask.cuh"
#include "../common/compat.h"
#include "../launch.h"
#include "../params.h"
#include "../common/simt_tile.cuh"

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
  const SequenceKeys sequence =
      sequence_keys(p.seq_q, key_length(p.key_length, 0, p.seq_k), p.causal, p.key_start, p.q_offset, 0);
  const int64_t per_problem = int64_t(p.m) * p.n;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < per_problem * p.batch_count; e += stride) {
    const int64_t problem = e / per_problem, within = e % per_problem;
    const int64_t row = within % p.m, col = within / p.m;
    const int64_t c_index = problem * p.stride_c + row + col * p.ldc;
    if (isfinite(gemm_repair_load(p.c, p.c_element, c_index))) continue;
    // The keys query row row_begin + col sees, as op(A)'s rows [begin, end).
    const KeyRange keys = visible_key_range(p.row_begin + int(col), sequence, p.causal, p.window_left, p.window_right);
    const int begin = keys.begin > p.key_offset ? keys.begin - p.key_offset : 0;
    const int end = keys.end - p.key_offset < p.k ? keys.end - p.key_offset : p.k;
    float sum = 0.0f;
    for (int i = begin; i < end; ++i) {
      const int64_t a_index = problem * p.stride_a + (p.trans_a ? i + row * p.lda : row + i * p.lda);
      const int64_t b_index = problem * p.stride_b + (p.trans_b ? col + i * p.ldb : i + col * p.ldb);
      sum += gemm_repair_load(p.a, p.a_element, a_index) * gemm_repair_load(p.b, p.a_element, b_index);
    }
    gemm_repair_store(p.c, p.c_element, c_index, p.alpha * sum);
  }
}

SELFATTN_KERNELS_END
