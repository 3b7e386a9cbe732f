#pragma once
// Where each element of a warp-level matrix fragment lives: which lane holds it, in which slot.
// These are the PTX ISA's definitions written as functions, for three readers: kernels (to know which
// row/column an accumulator element belongs to), the sim twins in primitives_sim.cuh (to compute the
// instruction), and humans. The tests deliberately re-derive the layouts from the ISA text instead of
// calling these, so a mistake here cannot hide behind itself.
//
// Vocabulary of the ISA: groupID = laneid >> 2, threadID_in_group = laneid % 4. Elements of one
// fragment are numbered "low to high": element 2r is the low 16 bits of b32 register r, 2r+1 the high.
#include "compat.h"

SELFATTN_KERNELS_BEGIN

struct FragmentCoord {
  int row;
  int col;
};

__host__ __device__ constexpr int fragment_group(int lane) { return lane >> 2; }
__host__ __device__ constexpr int fragment_thread_in_group(int lane) { return lane & 3; }

// PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type" (section 9.7.14.5.8),
// .f16/.bf16 multiplicands, f32 accumulators.
//   A (16x16, row-major view): elements a0..a7 in four b32 registers.
//     row = groupID for a0,a1,a4,a5; groupID+8 otherwise
//     col = threadID_in_group*2 + (i & 1), plus 8 for i >= 4
//   B (16x8, K x N): elements b0..b3 in two b32 registers.
//     row = threadID_in_group*2 + (i & 1), plus 8 for i >= 2;  col = groupID
//   C/D (16x8): c0..c3, one f32 each.
//     row = groupID for c0,c1; groupID+8 for c2,c3;  col = threadID_in_group*2 + (i & 1)
__host__ __device__ constexpr FragmentCoord mma_m16n8k16_a(int lane, int i) {
  return {fragment_group(lane) + 8 * ((i >> 1) & 1), fragment_thread_in_group(lane) * 2 + (i & 1) + 8 * (i >> 2)};
}
__host__ __device__ constexpr FragmentCoord mma_m16n8k16_b(int lane, int i) {
  return {fragment_thread_in_group(lane) * 2 + (i & 1) + 8 * (i >> 1), fragment_group(lane)};
}
__host__ __device__ constexpr FragmentCoord mma_m16n8k16_c(int lane, int i) {
  return {fragment_group(lane) + 8 * (i >> 1), fragment_thread_in_group(lane) * 2 + (i & 1)};
}

// PTX ISA, "Matrix Fragments for mma.m16n8k8" (.f16/.bf16): A is the left half of the k16 layout
// (a0..a3 in two registers), B its upper half (b0,b1 in one register), C/D identical.
__host__ __device__ constexpr FragmentCoord mma_m16n8k8_a(int lane, int i) {
  return {fragment_group(lane) + 8 * (i >> 1), fragment_thread_in_group(lane) * 2 + (i & 1)};
}
__host__ __device__ constexpr FragmentCoord mma_m16n8k8_b(int lane, int i) {
  return {fragment_thread_in_group(lane) * 2 + (i & 1), fragment_group(lane)};
}

// PTX ISA, "ldmatrix" (Warp-level matrix load), shape .m8n8 with .b16 elements: matrix m's row r is
// addressed by lane 8m + r. Lane l receives, in register m, the two elements of matrix m at
//   without .trans: row l/4, columns 2*(l%4) and 2*(l%4)+1          (a row-major 8x8 as stored)
//   with .trans:    rows 2*(l%4) and 2*(l%4)+1, column l/4           (the stored matrix transposed)
// `i` (0 or 1) selects the low or high half of the register.
__host__ __device__ constexpr FragmentCoord ldmatrix_element(int lane, int i, bool transposed) {
  return transposed ? FragmentCoord{fragment_thread_in_group(lane) * 2 + i, fragment_group(lane)}
                    : FragmentCoord{fragment_group(lane), fragment_thread_in_group(lane) * 2 + i};
}

SELFATTN_KERNELS_END
