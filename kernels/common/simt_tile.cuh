#pragma once
// The fp32 SIMT tile engine shared by qk_tiled and pv_tiled (their fp32 variant, and the fallback
// for any head_dim): C[64 x 64] += A[64 x K] B[K x 64] per 256-thread block, with A and B staged
// through shared memory as fp32 in K-major slices, 4 x 4 outputs per thread held in registers.
//
// Thread (ty, tx) = (tid / 16, tid % 16) owns rows ty + 16 i and columns tx + 16 j (i, j < 4): in one
// warp tx runs over 16 consecutive columns, so the B reads hit 16 different banks and the A reads are
// two broadcasts; stores of C are 16 consecutive elements per row.
#include <cstdint>

#include "compat.h"
#include "primitives.cuh"

SELFATTN_KERNELS_BEGIN

struct SimtTileTraits {
  static constexpr int kTileM = 64;      // rows of C per block: 16 thread rows x 4
  static constexpr int kTileN = 64;      // columns of C per block: 16 thread columns x 4
  static constexpr int kTileK = 16;      // K slice staged per step: 2 x 16 x 68 floats = 8.5 KB of smem
  static constexpr int kThreads = 256;   // 16 x 16 threads, 16 accumulators each
  static constexpr int kPerThread = 4;   // kTileM / 16 = kTileN / 16
  static constexpr int kLd = kTileM + 4; // padded slice row: transposed stores of A spread over banks
  static constexpr size_t kSmemBytes = 2 * size_t(kTileK) * kLd * sizeof(float);
};

__host__ __device__ inline float to_float(float x) { return x; }
__host__ __device__ inline float to_float(__half x) { return __half2float(x); }
__host__ __device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
// FP8 (a KV cache's elements): exact, every FP8 value is a float.
__host__ __device__ inline float to_float(__nv_fp8_e4m3 x) { return float(x); }
__host__ __device__ inline float to_float(__nv_fp8_e5m2 x) { return float(x); }

template <class T>
__host__ __device__ inline T from_float(float x);
template <>
__host__ __device__ inline float from_float<float>(float x) { return x; }
template <>
__host__ __device__ inline __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__host__ __device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
// FP8: round to nearest even, saturating to the finite range (+-448 e4m3, +-57344 e5m2; infinities
// too), NaN stays NaN - vLLM's and FlashInfer's quantization of a KV cache.
template <>
__host__ __device__ inline __nv_fp8_e4m3 from_float<__nv_fp8_e4m3>(float x) {
  __nv_fp8_e4m3 r;
  r.__x = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
  return r;
}
template <>
__host__ __device__ inline __nv_fp8_e5m2 from_float<__nv_fp8_e5m2>(float x) {
  __nv_fp8_e5m2 r;
  r.__x = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2);
  return r;
}
// Whether T is an FP8 element (a cache stored with scales).
template <class T>
struct IsFp8 {
  static constexpr bool value = false;
};
template <>
struct IsFp8<__nv_fp8_e4m3> {
  static constexpr bool value = true;
};
template <>
struct IsFp8<__nv_fp8_e5m2> {
  static constexpr bool value = true;
};

// Stages rows [first, first + 64) x k [k0, k0 + 16) of a matrix whose K index is contiguous
// (row stride `ld`) as tile[k][row]; elements past `count` rows or `k_end` are zero, so ragged edges
// add nothing to the sums.
template <class T>
__device__ inline void stage_k_contiguous(float* tile, const T* src, int64_t ld, int first, int count, int k0,
                                          int k_end) {
  using Tile = SimtTileTraits;
  for (int e = threadIdx.x; e < Tile::kTileM * Tile::kTileK; e += Tile::kThreads) {
    const int m = e / Tile::kTileK, kk = e % Tile::kTileK;
    const int row = first + m, k = k0 + kk;
    tile[kk * Tile::kLd + m] = (row < count && k < k_end) ? to_float(src[int64_t(row) * ld + k]) : 0.0f;
  }
}

// Stages k [k0, k0 + 16) x columns [first, first + 64) of a matrix whose column index is contiguous
// (row = k, row stride `ld`) as tile[k][column]; zero past `k_end` or `count` columns.
template <class T>
__device__ inline void stage_n_contiguous(float* tile, const T* src, int64_t ld, int k0, int k_end, int first,
                                          int count) {
  using Tile = SimtTileTraits;
  for (int e = threadIdx.x; e < Tile::kTileN * Tile::kTileK; e += Tile::kThreads) {
    const int kk = e / Tile::kTileN, n = e % Tile::kTileN;
    const int k = k0 + kk, col = first + n;
    tile[kk * Tile::kLd + n] = (k < k_end && col < count) ? to_float(src[int64_t(k) * ld + col]) : 0.0f;
  }
}

// acc[i][j] += sum_k a_tile[k][ty + 16 i] * b_tile[k][tx + 16 j] over one staged slice.
__device__ inline void simt_tile_multiply(const float* a_tile, const float* b_tile,
                                          float (&acc)[SimtTileTraits::kPerThread][SimtTileTraits::kPerThread]) {
  using Tile = SimtTileTraits;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  for (int kk = 0; kk < Tile::kTileK; ++kk) {
    float a[Tile::kPerThread], b[Tile::kPerThread];
    for (int i = 0; i < Tile::kPerThread; ++i) a[i] = a_tile[kk * Tile::kLd + ty + 16 * i];
    for (int j = 0; j < Tile::kPerThread; ++j) b[j] = b_tile[kk * Tile::kLd + tx + 16 * j];
    for (int i = 0; i < Tile::kPerThread; ++i)
      for (int j = 0; j < Tile::kPerThread; ++j) acc[i][j] += a[i] * b[j];
  }
}

SELFATTN_KERNELS_END
