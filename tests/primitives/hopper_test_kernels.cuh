#pragma once
// Small kernels that run the Hopper primitives (kernels/common/primitives_hopper.cuh) the way
// kernels/hopper/flash_fwd_hopper.cuh does, each next to the project's mma.sync primitives on the
// same shared memory. Compiled by the host compiler for the sim (test_hopper_primitives_sim.cpp) and
// by nvcc for sm_90a (test_hopper_primitives_gpu.cu); checked by hopper_checks.h.
//
// Shared-memory tiles are stored as the TMA lands them with the 128-byte swizzle: 64-column blocks
// of `rows` x 128 bytes, 16-byte chunk j of row r at chunk j ^ (r % 8). swizzled_offset() writes
// that map out here, independently of kernels/hopper/smem_layout.h (whose descriptors the wgmma
// kernels use): the mma.sync halves read the tiles through it, the host builds the expected images
// with it. Fragments follow the PTX ISA's formulas (groupID g = lane/4, threadID_in_group t = lane%4).
#include <cstdint>

#include "common/primitives.cuh"
#include "common/primitives_hopper.cuh"
#include "hopper/smem_layout.h"
#include "launch.h"

#if SELFATTN_SIM
#define SELFATTN_HOPPER_TEST_UNROLL
#else
#define SELFATTN_HOPPER_TEST_UNROLL _Pragma("unroll")
#endif

SELFATTN_KERNELS_BEGIN
namespace hopper_tests {

// Byte offset of element (r, c) (16-bit) of a tile of `rows` rows, as TMA lands it (128-byte swizzle,
// tile base 1024-byte aligned).
__host__ __device__ constexpr uint32_t swizzled_offset(int rows, int r, int c) {
  return uint32_t((c / 64) * rows * 128 + r * 128 + ((((c % 64) * 2 / 16) ^ (r % 8)) * 16) + (c * 2) % 16);
}

// Coordinates of one tile in a 4-D tensor map (innermost first): column, row, head, batch. A tile of
// `column_blocks` x 64 columns is that many boxes, at columns col + 64 c.
struct TileCoords {
  int32_t col, row, head, batch;
};

// Issues the boxes of one tile (`rows` rows per box) into `dst`, counting on `bar`. One thread.
__device__ __forceinline__ void tma_load_tile(unsigned char* dst, const TmaDescriptor* map, TileCoords at, int rows,
                                              int column_blocks, uint64_t* bar) {
  for (int c = 0; c < column_blocks; ++c)
    tma_load_4d(dst + c * rows * 128, map, at.col + 64 * c, at.row, at.head, at.batch, bar);
}

// Thread 0 initialises `count` barriers with the given arrival counts; then the block meets.
__device__ __forceinline__ void init_barriers(uint64_t* bars, int count, const unsigned* arrivals) {
  if (threadIdx.x == 0) {
    for (int i = 0; i < count; ++i) mbarrier_init(&bars[i], arrivals[i]);
    fence_barrier_init();
  }
  __syncthreads();
}

// The f32 m16n8 C fragment of warp `warp`'s rows (16 warp + g, + 8), n8 tile j, into out[64][n].
__device__ __forceinline__ void store_c_fragment(float* out, int n, int warp, int lane, int j, const float* c) {
  const int g = lane / 4, t = lane % 4, row = 16 * warp + g, col = 8 * j + 2 * t;
  out[row * n + col] = c[0], out[row * n + col + 1] = c[1];
  out[(row + 8) * n + col] = c[2], out[(row + 8) * n + col + 1] = c[3];
}

// ---- TMA: tiles of a 4-D map land in shared memory; raw bytes and an unswizzled read-back out -----
constexpr int kTmaMaxTiles = 4;
struct TmaParams {
  TmaDescriptor map;  // first: 64-byte aligned at the start of the parameter
  TileCoords tiles[kTmaMaxTiles];
  int tile_count;
  int rows;           // box rows
  int column_blocks;  // boxes per tile
  unsigned char* raw;     // [tile_count * column_blocks * rows * 128]: shared memory as landed
  uint16_t* unswizzled;   // [tile_count][rows][64 * column_blocks]: read back through swizzled_offset
  uint32_t* smem_base;    // [1]: smem_address() of the dynamic shared memory (1024-byte aligned?)
};

__global__ void tma_kernel(const __grid_constant__ TmaParams p) {
  unsigned char* smem = dynamic_smem<unsigned char>();
  const int tid = int(threadIdx.x), threads = int(blockDim.x);
  const uint32_t tile_bytes = uint32_t(p.rows) * 128 * p.column_blocks;
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem + p.tile_count * tile_bytes);
  const unsigned one = 1;
  init_barriers(bar, 1, &one);
  if (tid == 0) {
    mbarrier_arrive_expect_tx(bar, p.tile_count * tile_bytes);
    for (int t = 0; t < p.tile_count; ++t)
      tma_load_tile(smem + t * tile_bytes, &p.map, p.tiles[t], p.rows, p.column_blocks, bar);
  }
  mbarrier_wait(bar, 0);
  const int words = int(p.tile_count * tile_bytes / 16);
  for (int i = tid; i < words; i += threads)
    reinterpret_cast<uint4*>(p.raw)[i] = reinterpret_cast<const uint4*>(smem)[i];
  const int cols = 64 * p.column_blocks, per_tile = p.rows * cols;
  for (int i = tid; i < p.tile_count * per_tile; i += threads) {
    const int t = i / per_tile, r = i / cols % p.rows, c = i % cols;
    p.unswizzled[i] = *reinterpret_cast<const uint16_t*>(smem + t * tile_bytes + swizzled_offset(p.rows, r, c));
  }
  if (tid == 0) *p.smem_base = smem_address(smem);
}

// ---- wgmma SS: S = A B^T (A 64 x K, B N x K, both K-major, loaded by TMA) and mma.sync beside it ---
struct WgmmaSsParams {
  TmaDescriptor a_map, b_map;  // boxes {64, 64} and {64, N}
  TileCoords a_at, b_at;
  float* wgmma_out;  // [64][N]
  float* mma_out;    // [64][N]
};

template <int K, int N>
struct WgmmaSsLayout {
  static constexpr uint32_t kABytes = 64u * K * 2, kBBytes = uint32_t(N) * K * 2;
  static constexpr size_t kSmemBytes = kABytes + kBBytes + 8;  // A, B, one barrier
};

template <class T, int K, int N>
__global__ void __launch_bounds__(128, 1) wgmma_ss_kernel(const __grid_constant__ WgmmaSsParams p) {
  using L = WgmmaSsLayout<K, N>;
  unsigned char* smem = dynamic_smem<unsigned char>();
  unsigned char* a = smem;
  unsigned char* b = smem + L::kABytes;
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem + L::kABytes + L::kBBytes);
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const unsigned one = 1;
  init_barriers(bar, 1, &one);
  if (tid == 0) {
    mbarrier_arrive_expect_tx(bar, L::kABytes + L::kBBytes);
    tma_load_tile(a, &p.a_map, p.a_at, 64, K / 64, bar);
    tma_load_tile(b, &p.b_map, p.b_at, N, K / 64, bar);
  }
  mbarrier_wait(bar, 0);

  // wgmma, as flash_fwd_hopper_kernel's S = Q K^T.
  {
    float d[N / 2];
    SELFATTN_HOPPER_TEST_UNROLL
    for (int i = 0; i < N / 2; ++i) d[i] = 0.0f;
    const uint32_t a_address = smem_address(a), b_address = smem_address(b);
    wgmma_fence();
    SELFATTN_HOPPER_TEST_UNROLL
    for (int ks = 0; ks < K / 16; ++ks)
      wgmma_ss<T, N>(d, k_major_desc(a_address, 64, 0, 16 * ks), k_major_desc(b_address, N, 0, 16 * ks), ks > 0);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operands(d);
    SELFATTN_HOPPER_TEST_UNROLL
    for (int j = 0; j < N / 8; ++j) store_c_fragment(p.wgmma_out, N, warp, lane, j, d + 4 * j);
  }

  // mma.sync on the same shared memory, ldmatrix rows at their swizzled addresses. A: registers 0..3
  // are (rows 0-7 | 8-15) x (k 0-7 | 8-15), rows first; B (N x K, K-major): matrix m is k 8m..8m+7.
  for (int j = 0; j < N / 8; ++j) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int kk = 0; kk < K / 16; ++kk) {
      uint32_t af[4], bf[2];
      ldmatrix<4>(af, a + swizzled_offset(64, 16 * warp + lane % 8 + 8 * (lane / 8 % 2), 16 * kk + 8 * (lane / 16)));
      ldmatrix<2>(bf, b + swizzled_offset(N, 8 * j + lane % 8, 16 * kk + 8 * (lane / 8 % 2)));
      mma_m16n8k16<T>(acc, af, bf, acc);
    }
    store_c_fragment(p.mma_out, N, warp, lane, j, acc);
  }
}

// ---- wgmma RS with an MN-major B: O = P V (P 64 x Keys in registers, V Keys x N by TMA) ----------
struct WgmmaRsParams {
  TmaDescriptor v_map;  // box {64, Keys}
  TileCoords v_at;
  const uint16_t* a;  // [64][Keys] row-major: P's values (f16/bf16 bits)
  float* wgmma_out;   // [64][N]
  float* mma_out;     // [64][N]
};

template <int Keys, int N>
struct WgmmaRsLayout {
  static constexpr uint32_t kVBytes = uint32_t(Keys) * N * 2;
  static constexpr size_t kSmemBytes = kVBytes + 8;
};

template <class T, int Keys, int N>
__global__ void __launch_bounds__(128, 1) wgmma_rs_kernel(const __grid_constant__ WgmmaRsParams p) {
  using L = WgmmaRsLayout<Keys, N>;
  unsigned char* smem = dynamic_smem<unsigned char>();
  unsigned char* v = smem;
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem + L::kVBytes);
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const unsigned one = 1;
  init_barriers(bar, 1, &one);
  if (tid == 0) {
    mbarrier_arrive_expect_tx(bar, L::kVBytes);
    tma_load_tile(v, &p.v_map, p.v_at, Keys, N / 64, bar);
  }
  // P's m16n8k16 A fragments of this warp's rows, straight from global memory (the ISA's formula).
  uint32_t pf[Keys / 16][4];
  const uint16_t* row0 = p.a + (16 * warp + g) * Keys;
  const uint16_t* row8 = row0 + 8 * Keys;
  auto pair = [](uint16_t lo, uint16_t hi) { return uint32_t(lo) | uint32_t(hi) << 16; };
  SELFATTN_HOPPER_TEST_UNROLL
  for (int kk = 0; kk < Keys / 16; ++kk) {
    const int c = 16 * kk + 2 * t;
    pf[kk][0] = pair(row0[c], row0[c + 1]);
    pf[kk][1] = pair(row8[c], row8[c + 1]);
    pf[kk][2] = pair(row0[c + 8], row0[c + 9]);
    pf[kk][3] = pair(row8[c + 8], row8[c + 9]);
  }
  mbarrier_wait(bar, 0);

  {
    float d[N / 2];
    SELFATTN_HOPPER_TEST_UNROLL
    for (int i = 0; i < N / 2; ++i) d[i] = 0.0f;
    const uint32_t v_address = smem_address(v);
    wgmma_fence();
    SELFATTN_HOPPER_TEST_UNROLL
    for (int kk = 0; kk < Keys / 16; ++kk)
      wgmma_rs<T, N, /*TransposeB=*/1>(d, pf[kk], mn_major_desc(v_address, Keys, 16 * kk), true);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operands(d);
    wgmma_fence_operands(pf);  // pf is read again by the mma.sync below
    SELFATTN_HOPPER_TEST_UNROLL
    for (int j = 0; j < N / 8; ++j) store_c_fragment(p.wgmma_out, N, warp, lane, j, d + 4 * j);
  }

  // mma.sync: the same registers for A; B (Keys x N, rows are keys) by ldmatrix.trans, as
  // flash_fwd.cuh reads V: matrix m is keys 16 kk + 8m .. + 7 of columns 8j .. 8j + 7.
  for (int j = 0; j < N / 8; ++j) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    SELFATTN_HOPPER_TEST_UNROLL
    for (int kk = 0; kk < Keys / 16; ++kk) {
      uint32_t bf[2];
      ldmatrix_trans<2>(bf, v + swizzled_offset(Keys, 16 * kk + lane % 16, 8 * j));
      mma_m16n8k16<T>(acc, pf[kk], bf, acc);
    }
    store_c_fragment(p.mma_out, N, warp, lane, j, acc);
  }
}

// ---- mbarrier ring: flash_fwd_hopper_kernel's pipeline on its own -------------------------------
// Warpgroup 0 is the producer (setmaxnreg down; thread 0 issues the TMA boxes of tile i into stage
// i % kRingStages once the consumers have released it), warpgroups 1 and 2 the consumers (setmaxnreg
// up; they wait for the stage, copy it out unswizzled, and release it: 256 arrivals). With `tiles`
// tiles each stage goes through tiles / kRingStages phases, so both parities are waited on.
constexpr int kRingStages = 2;
constexpr int kRingThreads = 384;
struct RingParams {
  TmaDescriptor map;  // box {64, rows}
  int tiles, rows, column_blocks;
  int32_t head, batch;  // tile i is rows i * rows .. of (head, batch)
  uint16_t* out;        // [tiles][rows][64 * column_blocks]
};
inline size_t ring_smem_bytes(int rows, int column_blocks) {
  return size_t(kRingStages) * rows * 128 * column_blocks + 8 * 2 * kRingStages;
}

__global__ void __launch_bounds__(kRingThreads, 1) ring_kernel(const __grid_constant__ RingParams p) {
  unsigned char* smem = dynamic_smem<unsigned char>();
  const uint32_t tile_bytes = uint32_t(p.rows) * 128 * p.column_blocks;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kRingStages * tile_bytes);
  uint64_t* empty = full + kRingStages;
  const unsigned arrivals[2 * kRingStages] = {1, 1, 256, 256};
  init_barriers(full, 2 * kRingStages, arrivals);
  const int tid = int(threadIdx.x);
  if (tid < 128) {
    setmaxnreg_dec<40>();
    if (tid != 0) return;
    for (int tile = 0; tile < p.tiles; ++tile) {
      const int s = tile % kRingStages, round = tile / kRingStages;
      mbarrier_wait(&empty[s], (round & 1) ^ 1);  // round 0: the phase "before" the first passes at once
      mbarrier_arrive_expect_tx(&full[s], tile_bytes);
      tma_load_tile(smem + s * tile_bytes, &p.map, TileCoords{0, tile * p.rows, p.head, p.batch}, p.rows,
                    p.column_blocks, &full[s]);
    }
    return;
  }
  setmaxnreg_inc<232>();
  const int consumer = tid - 128, cols = 64 * p.column_blocks, per_tile = p.rows * cols;
  for (int tile = 0; tile < p.tiles; ++tile) {
    const int s = tile % kRingStages, round = tile / kRingStages;
    mbarrier_wait(&full[s], round & 1);
    const unsigned char* stage = smem + s * tile_bytes;
    for (int i = consumer; i < per_tile; i += 256)
      p.out[size_t(tile) * per_tile + i] =
          *reinterpret_cast<const uint16_t*>(stage + swizzled_offset(p.rows, i / cols, i % cols));
    mbarrier_arrive(&empty[s]);
  }
}

// ---- sim only: what reading too early looks like ------------------------------------------------
#if SELFATTN_SIM
// One wgmma_ss (K = 64, N = 64, f16, operands written by ordinary stores + fence_proxy_async), its
// accumulators copied out before wgmma_wait (the sim's twin has set them to NaN), after it but
// before wgmma_fence_operands (still NaN: the sim writes the results back at the fence, the latest
// point a compiler could read them), and after both.
struct EarlyReadParams {
  const uint16_t* a;  // [64][64]
  const uint16_t* b;  // [64][64] (N x K)
  float* before_wait;   // [64][64]
  float* before_fence;  // [64][64]
  float* after_wait;    // [64][64]
};
__global__ void wgmma_early_read_kernel(const EarlyReadParams p) {
  unsigned char* smem = dynamic_smem<unsigned char>();
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  for (int i = tid; i < 64 * 64; i += 128) {
    *reinterpret_cast<uint16_t*>(smem + swizzled_offset(64, i / 64, i % 64)) = p.a[i];
    *reinterpret_cast<uint16_t*>(smem + 8192 + swizzled_offset(64, i / 64, i % 64)) = p.b[i];
  }
  fence_proxy_async();
  __syncthreads();
  float d[32];
  for (int i = 0; i < 32; ++i) d[i] = 0.0f;
  wgmma_fence();
  for (int ks = 0; ks < 4; ++ks)
    wgmma_ss<__half, 64>(d, k_major_desc(smem_address(smem), 64, 0, 16 * ks),
                         k_major_desc(smem_address(smem + 8192), 64, 0, 16 * ks), ks > 0);
  wgmma_commit();
  for (int j = 0; j < 8; ++j) store_c_fragment(p.before_wait, 64, warp, lane, j, d + 4 * j);
  wgmma_wait<0>();
  for (int j = 0; j < 8; ++j) store_c_fragment(p.before_fence, 64, warp, lane, j, d + 4 * j);
  wgmma_fence_operands(d);
  for (int j = 0; j < 8; ++j) store_c_fragment(p.after_wait, 64, warp, lane, j, d + 4 * j);
}

// A TMA destination read by the issuing thread before the barrier wait (then waited for, so the
// block does not end with the copy in flight).
struct TmaEarlyReadParams {
  TmaDescriptor map;  // box {64, 8}
  uint16_t* out;      // [1]
};
__global__ void tma_early_read_kernel(const __grid_constant__ TmaEarlyReadParams p) {
  unsigned char* smem = dynamic_smem<unsigned char>();
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem + 1024);
  const unsigned one = 1;
  init_barriers(bar, 1, &one);
  if (threadIdx.x == 0) {
    mbarrier_arrive_expect_tx(bar, 1024);
    tma_load_4d(smem, &p.map, 0, 0, 0, 0, bar);
    *p.out = *reinterpret_cast<const uint16_t*>(smem);  // the hazard
  }
  mbarrier_wait(bar, 0);
}
#endif

struct Kernels {
  KernelRef tma, ring;
  KernelRef ss_f16[3], ss_bf16[3];  // (K, N) = (64, 256), (128, 128), (256, 64)
  KernelRef rs_f16[3], rs_bf16[3];  // (Keys, N) = (128, 64), (128, 128), (64, 256)
};
constexpr int kSsShapes[3][2] = {{64, 256}, {128, 128}, {256, 64}};
constexpr int kRsShapes[3][2] = {{128, 64}, {128, 128}, {64, 256}};

inline Kernels kernels() {
  Kernels k;
  k.tma = make_kernel_ref<TmaParams, tma_kernel>("tma_kernel");
  k.ring = make_kernel_ref<RingParams, ring_kernel>("ring_kernel");
  k.ss_f16[0] = make_kernel_ref<WgmmaSsParams, wgmma_ss_kernel<__half, 64, 256>>("wgmma_ss_kernel");
  k.ss_f16[1] = make_kernel_ref<WgmmaSsParams, wgmma_ss_kernel<__half, 128, 128>>("wgmma_ss_kernel");
  k.ss_f16[2] = make_kernel_ref<WgmmaSsParams, wgmma_ss_kernel<__half, 256, 64>>("wgmma_ss_kernel");
  k.ss_bf16[0] = make_kernel_ref<WgmmaSsParams, wgmma_ss_kernel<__nv_bfloat16, 64, 256>>("wgmma_ss_kernel");
  k.ss_bf16[1] = make_kernel_ref<WgmmaSsParams, wgmma_ss_kernel<__nv_bfloat16, 128, 128>>("wgmma_ss_kernel");
  k.ss_bf16[2] = make_kernel_ref<WgmmaSsParams, wgmma_ss_kernel<__nv_bfloat16, 256, 64>>("wgmma_ss_kernel");
  k.rs_f16[0] = make_kernel_ref<WgmmaRsParams, wgmma_rs_kernel<__half, 128, 64>>("wgmma_rs_kernel");
  k.rs_f16[1] = make_kernel_ref<WgmmaRsParams, wgmma_rs_kernel<__half, 128, 128>>("wgmma_rs_kernel");
  k.rs_f16[2] = make_kernel_ref<WgmmaRsParams, wgmma_rs_kernel<__half, 64, 256>>("wgmma_rs_kernel");
  k.rs_bf16[0] = make_kernel_ref<WgmmaRsParams, wgmma_rs_kernel<__nv_bfloat16, 128, 64>>("wgmma_rs_kernel");
  k.rs_bf16[1] = make_kernel_ref<WgmmaRsParams, wgmma_rs_kernel<__nv_bfloat16, 128, 128>>("wgmma_rs_kernel");
  k.rs_bf16[2] = make_kernel_ref<WgmmaRsParams, wgmma_rs_kernel<__nv_bfloat16, 64, 256>>("wgmma_rs_kernel");
  return k;
}
inline size_t ss_smem_bytes(int shape) {
  static constexpr size_t bytes[3] = {WgmmaSsLayout<64, 256>::kSmemBytes, WgmmaSsLayout<128, 128>::kSmemBytes,
                                      WgmmaSsLayout<256, 64>::kSmemBytes};
  return bytes[shape];
}
inline size_t rs_smem_bytes(int shape) {
  static constexpr size_t bytes[3] = {WgmmaRsLayout<128, 64>::kSmemBytes, WgmmaRsLayout<128, 128>::kSmemBytes,
                                      WgmmaRsLayout<64, 256>::kSmemBytes};
  return bytes[shape];
}

#if SELFATTN_SIM
// Registers an RS wgmma owns until its wait, touched before it: `touch` 1 changes one A register,
// 2 writes one accumulator, 3 leaves out the wgmma.fence before the wgmma, 0 does everything right
// (the control).
struct RegisterTouchParams {
  int touch;
};
__global__ void wgmma_register_touch_kernel(const RegisterTouchParams p) {
  unsigned char* smem = dynamic_smem<unsigned char>();
  const int tid = int(threadIdx.x);
  for (int i = tid; i < 64 * 64; i += 128) reinterpret_cast<uint16_t*>(smem)[i] = 0x3c00;  // V = 1 (f16)
  fence_proxy_async();
  __syncthreads();
  uint32_t a[4] = {0x3c003c00u, 0x3c003c00u, 0x3c003c00u, 0x3c003c00u};
  float d[32];
  if (p.touch != 3) wgmma_fence();
  wgmma_rs<__half, 64, /*TransposeB=*/1>(d, a, mn_major_desc(smem_address(smem), 64, 0), false);
  wgmma_commit();
  if (p.touch == 1 && tid == 37) a[2] = 0;
  if (p.touch == 2 && tid == 90) d[5] = 1.0f;
  wgmma_wait<0>();
  wgmma_fence_operands(d);
}

struct SimOnlyKernels {
  KernelRef wgmma_early_read, tma_early_read, wgmma_register_touch;
};
inline SimOnlyKernels sim_only_kernels() {
  return {make_kernel_ref<EarlyReadParams, wgmma_early_read_kernel>("wgmma_early_read_kernel"),
          make_kernel_ref<TmaEarlyReadParams, tma_early_read_kernel>("tma_early_read_kernel"),
          make_kernel_ref<RegisterTouchParams, wgmma_register_touch_kernel>("wgmma_register_touch_kernel")};
}
#endif

}  // namespace hopper_tests
SELFATTN_KERNELS_END
