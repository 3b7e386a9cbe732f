#pragma once
// Small kernels that run one primitive each, compiled by the host compiler for the sim test and by
// nvcc for the GPU test. Fragments are loaded and stored with the PTX ISA's formulas written out
// here (groupID g = lane/4, threadID_in_group t = lane%4), independently of primitives_fragments.cuh.
#include <cstdint>

#include "common/primitives.cuh"
#include "launch.h"

SELFATTN_KERNELS_BEGIN
namespace primitive_tests {

// ---- mma: one 16x8 tile of D = A B + C per warp, operands read straight from global memory ----
struct MmaParams {
  const uint16_t* a;  // [warps][16][k] row-major, f16 or bf16 bits
  const uint16_t* b;  // [warps][k][8] row-major
  const float* c;     // [warps][16][8]
  float* d;           // [warps][16][8]
  int k;              // 16 or 8
  bool bf16;
};

__global__ void mma_kernel(const MmaParams p) {
  const int lane = int(threadIdx.x % 32), warp = int(threadIdx.x / 32);
  const int g = lane / 4, t = lane % 4, k = p.k;
  const uint16_t* a = p.a + warp * 16 * k;
  const uint16_t* b = p.b + warp * k * 8;
  auto pair = [](uint16_t lo, uint16_t hi) { return uint32_t(lo) | uint32_t(hi) << 16; };
  uint32_t ar[4] = {pair(a[g * k + 2 * t], a[g * k + 2 * t + 1]),  // rows g, g+8; columns 2t, 2t+1 (+8)
                    pair(a[(g + 8) * k + 2 * t], a[(g + 8) * k + 2 * t + 1]), 0, 0};
  uint32_t br[2] = {pair(b[2 * t * 8 + g], b[(2 * t + 1) * 8 + g]), 0};  // rows 2t, 2t+1 (+8) of column g
  if (k == 16) {
    ar[2] = pair(a[g * k + 2 * t + 8], a[g * k + 2 * t + 9]);
    ar[3] = pair(a[(g + 8) * k + 2 * t + 8], a[(g + 8) * k + 2 * t + 9]);
    br[1] = pair(b[(2 * t + 8) * 8 + g], b[(2 * t + 9) * 8 + g]);
  }
  const float* c = p.c + warp * 128;
  const float cr[4] = {c[g * 8 + 2 * t], c[g * 8 + 2 * t + 1], c[(g + 8) * 8 + 2 * t], c[(g + 8) * 8 + 2 * t + 1]};
  float dr[4];
  if (k == 16) {
    if (p.bf16) mma_m16n8k16_bf16(dr, ar, br, cr);
    else mma_m16n8k16_f16(dr, ar, br, cr);
  } else {
    const uint32_t a8[2] = {ar[0], ar[1]}, b8[1] = {br[0]};
    if (p.bf16) mma_m16n8k8_bf16(dr, a8, b8, cr);
    else mma_m16n8k8_f16(dr, a8, b8, cr);
  }
  float* d = p.d + warp * 128;
  d[g * 8 + 2 * t] = dr[0], d[g * 8 + 2 * t + 1] = dr[1];
  d[(g + 8) * 8 + 2 * t] = dr[2], d[(g + 8) * 8 + 2 * t + 1] = dr[3];
}

// ---- ldmatrix: four 8x8 matrices placed in shared memory with padded, interleaved rows ----------
constexpr int kLdmatrixRowStride = 24;  // elements; 48 bytes keeps every row 16-byte aligned
__host__ __device__ constexpr int ldmatrix_row_offset(int matrix, int row) {
  return (row * 4 + (3 - matrix)) * kLdmatrixRowStride;  // matrices interleaved, in reverse order
}

struct LdmatrixParams {
  const uint16_t* matrices;  // [4][8][8] row-major
  uint32_t* regs;            // [32 lanes][4]: what each lane received
  int count;                 // 1, 2 or 4
  bool transposed;
};

__global__ void ldmatrix_kernel(const LdmatrixParams p) {
  uint16_t* smem = dynamic_smem<uint16_t>();
  const int lane = int(threadIdx.x);
  for (int i = lane; i < 4 * 64; i += 32) smem[ldmatrix_row_offset(i / 64, i / 8 % 8) + i % 8] = p.matrices[i];
  __syncthreads();
  // Lanes past 8*count repeat lane%8's row, as kernels commonly do (the instruction ignores them).
  const int matrix = lane < 8 * p.count ? lane / 8 : 0;
  const uint16_t* row = smem + ldmatrix_row_offset(matrix, lane % 8);
  uint32_t r[4] = {0, 0, 0, 0};
  if (p.count == 1) {
    uint32_t x[1];
    p.transposed ? ldmatrix_trans<1>(x, row) : ldmatrix<1>(x, row);
    r[0] = x[0];
  } else if (p.count == 2) {
    uint32_t x[2];
    p.transposed ? ldmatrix_trans<2>(x, row) : ldmatrix<2>(x, row);
    r[0] = x[0], r[1] = x[1];
  } else {
    p.transposed ? ldmatrix_trans<4>(r, row) : ldmatrix<4>(r, row);
  }
  for (int m = 0; m < 4; ++m) p.regs[lane * 4 + m] = r[m];
}

// ---- the flash kernel's pattern: cp.async tiles into shared memory, ldmatrix fragments, mma ------
// D (16x8) = A (16x16) * B, with B stored either k-major as [16 k][8 n] (like V: ldmatrix .trans)
// or n-major as [8 n][16 k] (like K: plain ldmatrix).
struct TileGemmParams {
  const uint16_t* a;  // [16][16]
  const uint16_t* b;  // [16][8] when !b_n_major, else [8][16]
  float* d;           // [16][8]
  bool bf16;
  bool b_n_major;
};

constexpr int kTileRowStride = 24;  // elements per shared row: 16 used + 8 padding, 48 bytes

__global__ void tile_gemm_kernel(const TileGemmParams p) {
  uint16_t* a_tile = dynamic_smem<uint16_t>();
  uint16_t* b_tile = a_tile + 16 * kTileRowStride;
  const int lane = int(threadIdx.x);
  // 16-byte chunks: A has 16 rows x 2, B 16 rows x 1 (k-major) or 8 rows x 2 (n-major).
  cp_async_cg(a_tile + (lane / 2) * kTileRowStride + (lane % 2) * 8, p.a + lane * 8);
  if (lane < 16) {
    const int row = p.b_n_major ? lane / 2 : lane, col = p.b_n_major ? (lane % 2) * 8 : 0;
    cp_async_cg(b_tile + row * kTileRowStride + col, p.b + lane * 8);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  // A's registers 0..3 are the 8x8 blocks (rows 0-7 | 8-15) x (cols 0-7 | 8-15), rows first.
  uint32_t a[4], b[2];
  ldmatrix<4>(a, a_tile + (lane % 8 + 8 * (lane / 8 % 2)) * kTileRowStride + 8 * (lane / 16));
  if (p.b_n_major) {
    ldmatrix<2>(b, b_tile + (lane % 8) * kTileRowStride + 8 * (lane / 8 % 2));  // matrix m: k 8m..8m+7
  } else {
    ldmatrix_trans<2>(b, b_tile + (lane % 16) * kTileRowStride);  // matrix m: k rows 8m..8m+7
  }
  float acc[4] = {0, 0, 0, 0};
  if (p.bf16) mma_m16n8k16<__nv_bfloat16>(acc, a, b, acc);
  else mma_m16n8k16<__half>(acc, a, b, acc);
  const int g = lane / 4, t = lane % 4;
  p.d[g * 8 + 2 * t] = acc[0], p.d[g * 8 + 2 * t + 1] = acc[1];
  p.d[(g + 8) * 8 + 2 * t] = acc[2], p.d[(g + 8) * 8 + 2 * t + 1] = acc[3];
}

// ---- cp.async groups: what a thread sees of its own copies before and after each wait ----------
// Each thread owns four 16-byte regions of shared memory (region r at float (r*blockDim + tid)*4):
//   group 0: region 0 by one cp.async.cg of 16 bytes
//   group 1: region 1 by ca<4>, ca<4>, then ca<8> of which only 4 source bytes (the rest zero-filled)
//   group 2: region 2 by ca<8> of 8 bytes and ca<8> with src_bytes 0 (all zeros)
//   uncommitted: region 3 by cp.async.cg, completed only by wait_all
// Snapshots of all 16 floats: 0 before any wait (the missing wait), 1 after wait<2>, 2 after wait<1>,
// 3 after wait<0>, 4 after wait_all.
constexpr int kCpAsyncSnapshots = 5;

struct CpAsyncParams {
  const float* source;  // [4 regions][threads][4]
  float* snapshots;     // [snapshots][threads][16]
};

__global__ void cp_async_kernel(const CpAsyncParams p) {
  const int tid = int(threadIdx.x), threads = int(blockDim.x);
  float* smem = dynamic_smem<float>();
  auto region = [&](int r) { return smem + (r * threads + tid) * 4; };
  auto source = [&](int r) { return p.source + (r * threads + tid) * 4; };
  auto snapshot = [&](int s) {
    for (int r = 0; r < 4; ++r)
      for (int i = 0; i < 4; ++i) p.snapshots[(s * threads + tid) * 16 + r * 4 + i] = region(r)[i];
  };
  cp_async_cg(region(0), source(0));
  cp_async_commit();
  cp_async_ca<4>(region(1), source(1));
  cp_async_ca<4>(region(1) + 1, source(1) + 1);
  cp_async_ca<8>(region(1) + 2, source(1) + 2, 4);
  cp_async_commit();
  cp_async_ca<8>(region(2), source(2));
  cp_async_ca<8>(region(2) + 2, source(2) + 2, 0);
  cp_async_commit();
  cp_async_cg(region(3), source(3));
  snapshot(0);
  cp_async_wait<2>();
  snapshot(1);
  cp_async_wait<1>();
  snapshot(2);
  cp_async_wait<0>();
  snapshot(3);
  cp_async_wait_all();
  snapshot(4);
}

// A misaligned destination (8 bytes into a 16-byte copy): the sim reports it.
struct MisalignedParams {
  const float* source;
  int which;  // 0: cp.async dst, 1: ldmatrix row
};
__global__ void misaligned_kernel(const MisalignedParams p) {
  float* smem = dynamic_smem<float>();
  if (p.which == 0) {
    cp_async_cg(smem + 2, p.source);
    cp_async_wait_all();
  } else {
    uint32_t r[1];
    ldmatrix<1>(r, smem + 2 + 4 * (threadIdx.x % 8));
  }
}

// ---- shuffles, reductions and 16-bit packing ----------------------------------------------------
constexpr int kReduceOutputs = 11;  // sum and max for widths 2..32, and one shuffle_xor
struct ReduceParams {
  const float* in;  // [threads]
  float* out;       // [kReduceOutputs][threads]
  int xor_mask;
};
__global__ void reduce_kernel(const ReduceParams p) {
  const int tid = int(threadIdx.x), threads = int(blockDim.x);
  const float v = p.in[tid];
  float* out = p.out + tid;
  out[0 * threads] = warp_reduce_sum<2>(v), out[1 * threads] = warp_reduce_max<2>(v);
  out[2 * threads] = warp_reduce_sum<4>(v), out[3 * threads] = warp_reduce_max<4>(v);
  out[4 * threads] = warp_reduce_sum<8>(v), out[5 * threads] = warp_reduce_max<8>(v);
  out[6 * threads] = warp_reduce_sum<16>(v), out[7 * threads] = warp_reduce_max<16>(v);
  out[8 * threads] = warp_reduce_sum<32>(v), out[9 * threads] = warp_reduce_max<32>(v);
  out[10 * threads] = shuffle_xor(v, p.xor_mask);
}

struct PackParams {
  const float* in;   // [n][2]
  uint32_t* packed;  // [n][2]: half2, bf162
  float* unpacked;   // [n][4]: the two pairs read back
  int n;
};
__global__ void pack_kernel(const PackParams p) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= p.n) return;
  const uint32_t h = pack2<__half>(p.in[2 * i], p.in[2 * i + 1]);
  const uint32_t b = pack2<__nv_bfloat16>(p.in[2 * i], p.in[2 * i + 1]);
  p.packed[2 * i] = h, p.packed[2 * i + 1] = b;
  const float2 hu = unpack2<__half>(h), bu = unpack2<__nv_bfloat16>(b);
  p.unpacked[4 * i] = hu.x, p.unpacked[4 * i + 1] = hu.y, p.unpacked[4 * i + 2] = bu.x, p.unpacked[4 * i + 3] = bu.y;
}

struct Kernels {
  KernelRef mma, ldmatrix, tile_gemm, cp_async, misaligned, reduce, pack;
};
inline Kernels kernels() {
  return {make_kernel_ref<MmaParams, mma_kernel>("mma_kernel"),
          make_kernel_ref<LdmatrixParams, ldmatrix_kernel>("ldmatrix_kernel"),
          make_kernel_ref<TileGemmParams, tile_gemm_kernel>("tile_gemm_kernel"),
          make_kernel_ref<CpAsyncParams, cp_async_kernel>("cp_async_kernel"),
          make_kernel_ref<MisalignedParams, misaligned_kernel>("misaligned_kernel"),
          make_kernel_ref<ReduceParams, reduce_kernel>("reduce_kernel"),
          make_kernel_ref<PackParams, pack_kernel>("pack_kernel")};
}

}  // namespace primitive_tests
SELFATTN_KERNELS_END
