#pragma once
// How the Hopper kernel's 16-bit tiles sit in shared memory, and the GMMA descriptors (wgmma's
// shared-memory operands) that describe them. For nvcc and the host compiler alike.
//
// Every tile is written by TMA with CU_TENSOR_MAP_SWIZZLE_128B boxes of 64 columns (128 bytes) by
// R rows, R a multiple of 8, and starts on a 1024-byte boundary (the 128-byte swizzle's period):
// a "row tile" of R rows x D columns (D a multiple of 64) is D/64 column blocks, block c at byte
// c * R * 128, row r of a block at r * 128, element (r, col) at 2 * (col % 64) within the row, and
// then the 16-byte chunk index (address bits 4-6) XORed with the row's index mod 8 (bits 7-9).
// That is CuTe's tile_to_shape(GMMA::Layout_K_SW128_Atom<T>, (R, D)), the (8 x 64) atoms stacked
// down the rows first; tests/primitives/test_hopper_layouts_tiles.cpp checks it and every descriptor
// below against CuTe's make_gmma_desc, bit for bit.
//
// The descriptors (PTX ISA "Matrix Descriptor Format"; LBO / SBO as CuTe's make_gmma_desc sets them
// for these layouts):
//   K-major (Q as A of S = Q K^T, K as its B; K = head dim): start = the (row0, k0) element's
//     unswizzled address, LBO = 16 bytes (unused by the swizzled K-major layouts; CuTe writes 1),
//     SBO = 1024 bytes (from one 8-row core-matrix group to the next).
//   MN-major (V as B of O += P V, N = head dim contiguous, K = keys): start = row key0 of column
//     block d0 / 64, LBO = R * 128 bytes (from one 64-column block to the next along N),
//     SBO = 1024 bytes (from one 8-key group to the next along K).
// The descriptors' base offset stays 0: every start is a multiple of 1024 plus at most 96 bytes
// inside the first row of a pattern, and the hardware swizzles the computed address, so advancing
// the start by k inside a 128-byte row reads what the TMA stored.
#include <cstdint>

#include "common/compat.h"

SELFATTN_KERNELS_BEGIN

// The descriptor's 2-bit layout type (bits 62-63).
enum class GmmaSwizzle : uint32_t { none = 0, b128 = 1, b64 = 2, b32 = 3 };

// The 14-bit fields hold an 18-bit byte address or offset >> 4 (PTX: (x & 0x3FFFF) >> 4).
__host__ __device__ inline uint64_t gmma_desc_encode(uint32_t bytes) { return uint64_t((bytes & 0x3ffffu) >> 4); }

__host__ __device__ inline uint64_t gmma_desc(uint32_t start_bytes, uint32_t lbo, uint32_t sbo, GmmaSwizzle swizzle) {
  return gmma_desc_encode(start_bytes) | gmma_desc_encode(lbo) << 16 | gmma_desc_encode(sbo) << 32 |
         uint64_t(uint32_t(swizzle)) << 62;
}

// Bytes from a row tile's start to element (row, col), swizzle included (R rows per column block).
__host__ __device__ inline uint32_t row_tile_offset(int rows, int row, int col) {
  const uint32_t linear = uint32_t(col / 64) * uint32_t(rows) * 128u + uint32_t(row) * 128u + uint32_t(col % 64) * 2u;
  return linear ^ (((linear >> 7) & 7u) << 4);
}

// wgmma K-major operand: the 64 (A) or N (B) rows from row0 (a multiple of 8) and the 16 columns
// from k0 (a multiple of 16) of the row tile at shared address tile_address (1024-aligned).
__host__ __device__ inline uint64_t k_major_desc(uint32_t tile_address, int rows, int row0, int k0) {
  const uint32_t start =
      tile_address + uint32_t(k0 / 64) * uint32_t(rows) * 128u + uint32_t(row0) * 128u + uint32_t(k0 % 64) * 2u;
  return gmma_desc(start, 16u, 1024u, GmmaSwizzle::b128);
}

// wgmma MN-major B (tnspB = 1) from V's row tile: the 16 keys from key0 (a multiple of 8; 16 for
// whole k-steps), N = the columns from d0 (a multiple of 64) to the wgmma's N.
__host__ __device__ inline uint64_t mn_major_desc(uint32_t tile_address, int rows, int key0, int d0 = 0) {
  const uint32_t start = tile_address + uint32_t(d0 / 64) * uint32_t(rows) * 128u + uint32_t(key0) * 128u;
  return gmma_desc(start, uint32_t(rows) * 128u, 1024u, GmmaSwizzle::b128);
}

// ---- 8-bit (e4m3) tiles: the FP8 forward (flash_fwd_hopper_fp8.cuh) ----
// TMA writes 1-byte boxes of W columns (W bytes, the swizzle's row: W = 128, or 64 for V^T tiles of
// 64 keys) by R rows with the W-byte swizzle: a row tile of R rows x C columns (C a multiple of W) is
// C/W column blocks, block c at byte c * R * W, element (r, col) at byte col % W of row r, then the
// 16-byte chunk index XORed with address bits 7.. (3 bits for W = 128, 2 for 64). That is CuTe's
// tile_to_shape(GMMA::Layout_K_SW{128,64}_Atom<float_e4m3_t>, (R, C)) (atoms: 8 rows x W
// elements); test_hopper_layouts checks it and the descriptors against CuTe.
__host__ __device__ inline uint32_t row_tile_offset_8bit(int rows, int row, int col, int row_bytes = 128) {
  const uint32_t w = uint32_t(row_bytes);
  const uint32_t linear = uint32_t(col) / w * uint32_t(rows) * w + uint32_t(row) * w + uint32_t(col) % w;
  return linear ^ (((linear >> 7) & (w / 16 - 1)) << 4);
}

// 8-bit wgmma K-major operand (A or B; 8-bit wgmma is K-major only): the 64 (A) or N (B) rows from
// row0 (a multiple of 8) and the 32 columns from k0 (a multiple of 32): a k-step advances the start
// by 32 bytes inside the W-byte row. LBO as for 16 bits (unused), SBO 8 rows of W bytes.
__host__ __device__ inline uint64_t k_major_desc_8bit(uint32_t tile_address, int rows, int row0, int k0,
                                                      int row_bytes = 128) {
  const uint32_t w = uint32_t(row_bytes);
  const uint32_t start = tile_address + uint32_t(k0) / w * uint32_t(rows) * w + uint32_t(row0) * w + uint32_t(k0) % w;
  return gmma_desc(start, 16u, 8u * w, w == 128 ? GmmaSwizzle::b128 : GmmaSwizzle::b64);
}

// P as the A operand of the FP8 P V, without shuffles. S's accumulator gives thread (g = lane/4,
// t = lane%4) keys 8n + 2t and 8n + 2t + 1 of each 8-key column tile n (registers 4n + {0,1} for row
// g, 4n + {2,3} for row g + 8); the 8-bit A fragment of a k32 step wants, in its register 0 (row
// g), A-columns 4t..4t+3, in register 2 columns 16 + 4t..16 + 4t + 3 (1 and 3: row g + 8). Each
// register is packed from the thread's own scores: register r of k32 step m, byte b, holds S
// register fp8_p_score_index(m, r, b) (column tiles 4m + 2*(r/2) + b/2). So A-column c of each
// 16-key half holds key fp8_pv_key(c) of that half: a fixed permutation of the keys inside every
// aligned 16-key group. The V^T pre-pass (transpose_v_fp8.cuh) stores V^T's keys in the same order
// inside each 16-key group, counted from the sequence's first key (key tiles start at multiples of
// 16 from it), so that sum_c P[:, c] Vt[:, c] = sum_key P[:, key] V[key, :]: the right product.
__host__ __device__ constexpr int fp8_pv_key(int column) {  // column of a 16-key group -> its key
  return 8 * ((column % 4) >> 1) + 2 * (column / 4) + (column & 1);
}
__host__ __device__ constexpr int fp8_p_score_index(int step, int reg, int byte) {
  return 4 * (4 * step + 2 * (reg / 2) + byte / 2) + 2 * (reg % 2) + byte % 2;
}

SELFATTN_KERNELS_END
