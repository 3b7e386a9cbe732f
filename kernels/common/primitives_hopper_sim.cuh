#pragma once
// The arithmetic and address maps behind the sim twins of primitives_hopper.cuh: how wgmma reads a
// GMMA shared-memory descriptor, where its fragments live, what it computes, and where a TMA box
// lands. Pure functions, no engine calls; tests/primitives/test_hopper_layouts*.cpp check each one
// against NVIDIA's CUTLASS/CuTe definitions (the GMMA canonical layouts, make_gmma_desc, the MMA
// traits' thread/value layouts, the TMA swizzles).
//
// Shared-memory offsets here are relative to the block's dynamic shared memory, whose base is
// 1024-byte aligned (on the GPU and on the sim): a swizzle computed on these offsets is the one the
// hardware computes on the absolute address bits.
// Host compiler only: nvcc never sees this file.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "compat.h"
#include "primitives_fragments.cuh"
#include "primitives_sim.cuh"
#include "tma_descriptor.h"

#if !SELFATTN_SIM
#error "primitives_hopper_sim.cuh is the sim's half of primitives_hopper.cuh; nvcc builds use the inline PTX"
#endif

SELFATTN_KERNELS_BEGIN
namespace sim_hopper {

// ---- swizzles -----------------------------------------------------------------------------------
// The 128-, 64- and 32-byte swizzles permute the 16-byte chunks of an address: bits [4, 4+b) are
// XORed with bits [7, 7+b), b = 3, 2, 1 (CuTe's Swizzle<b,4,3> on byte addresses). `phase_shift`
// is subtracted from the row bits [7, ...) first: a GMMA descriptor's base offset (below); 0 for
// TMA and for every layout that starts on its pattern.
inline int swizzle_bits(int swizzle_bytes) {
  return swizzle_bytes == 128 ? 3 : swizzle_bytes == 64 ? 2 : swizzle_bytes == 32 ? 1 : 0;
}
inline uint32_t swizzle_address(uint32_t address, int swizzle_bytes, uint32_t phase_shift = 0) {
  const int b = swizzle_bits(swizzle_bytes);
  if (b == 0) return address;
  const uint32_t mask = (1u << b) - 1;
  const uint32_t row = ((address >> 7) - phase_shift) & mask;
  return address ^ (row << 4);
}

// ---- GMMA shared-memory matrix descriptor ------------------------------------------------------
// PTX ISA, "Matrix Descriptor Format" (wgmma): bits 0-13 start address >> 4, 16-29 leading
// dimension byte offset >> 4, 32-45 stride dimension byte offset >> 4, 49-51 base offset,
// 62-63 swizzle mode (0 none/interleave, 1 128B, 2 64B, 3 32B).
struct GmmaDescFields {
  uint32_t start_bytes, leading_bytes, stride_bytes, base_offset;
  int swizzle_bytes;  // 0 (no swizzle: the interleaved core-matrix layout), 32, 64 or 128
};

inline GmmaDescFields gmma_desc_fields(uint64_t desc) {
  GmmaDescFields f{};
  f.start_bytes = uint32_t(desc & 0x3fffu) << 4;
  f.leading_bytes = uint32_t((desc >> 16) & 0x3fffu) << 4;
  f.stride_bytes = uint32_t((desc >> 32) & 0x3fffu) << 4;
  f.base_offset = uint32_t((desc >> 49) & 0x7u);
  static constexpr int kSwizzle[4] = {0, 128, 64, 32};
  f.swizzle_bytes = kSwizzle[(desc >> 62) & 0x3u];
  return f;
}

// Byte offset of element (mn, k), 0 <= k < 16 (k < 32 for 8-bit), of a wgmma operand of
// `element_bytes`-byte elements described by `desc`.
// k_major: K is the contiguous dimension (A with tnspA = 0, B with tnspB = 0); otherwise M or N
// is (MN-major, tnsp = 1). The canonical layouts (PTX ISA "Shared Memory Matrix Layout"; CuTe's
// make_gmma_desc spells them as the same layouts in 16-byte units), with W the swizzle's row in
// bytes and a "core matrix" 8 rows of 16 bytes (8 elements):
//   K-major,  none:  (mn%8)*16 + (mn/8)*SBO + (k%8)*2 + (k/8)*LBO
//   K-major,  W:     (mn%8)*W  + (mn/8)*SBO + (k%8)*2 + (k/8)*16            (LBO unused)
//   MN-major, none:  (mn%8)*2  + (mn/8)*SBO + (k%8)*16 + (k/8)*LBO
//   MN-major, W:     (mn%(W/2))*2 + (mn/(W/2))*LBO + (k%8)*W + (k/8)*SBO
// added to the start address, then swizzled as an address (so a start that is not on a pattern
// row, as when a kernel advances the descriptor by k inside a 128-byte row, swizzles the way the
// data was stored). The base offset: the ISA asks for (pattern start >> 7) & 7 when the pattern
// (1024 / 512 / 256 bytes for 128B / 64B / 32B) does not start on that boundary; read here as
// shifting the row bits by it. CuTe and our kernels always use 0, so only 0 is checked against
// CuTe; the non-zero reading is the ISA text's, unverified on hardware.
// 8-bit operands (FP8 wgmma, m64nNk32) are K-major only (the ISA has no transpose for them): the
// same layouts in bytes, a core matrix 8 rows of 16 one-byte elements, so element k sits k bytes
// into its row (K-major, W: (mn%8)*W + (mn/8)*SBO + k; none: ... + (k%16) + (k/16)*LBO).
inline uint32_t gmma_element_offset(uint64_t desc, bool k_major, int mn, int k, int element_bytes = 2) {
  const GmmaDescFields f = gmma_desc_fields(desc);
  const uint32_t m = uint32_t(mn), kk = uint32_t(k);
  uint32_t linear;
  if (element_bytes == 1) {
    // Callers never pass MN-major here: the sim's wgmma refuses it first.
    linear = f.swizzle_bytes == 0 ? (m % 8) * 16 + (m / 8) * f.stride_bytes + (kk % 16) + (kk / 16) * f.leading_bytes
                                  : (m % 8) * uint32_t(f.swizzle_bytes) + (m / 8) * f.stride_bytes + kk;
    return f.swizzle_bytes == 0 ? f.start_bytes + linear
                                : swizzle_address(f.start_bytes + linear, f.swizzle_bytes, f.base_offset);
  }
  if (f.swizzle_bytes == 0) {
    linear = k_major ? (m % 8) * 16 + (m / 8) * f.stride_bytes + (kk % 8) * 2 + (kk / 8) * f.leading_bytes
                     : (m % 8) * 2 + (m / 8) * f.stride_bytes + (kk % 8) * 16 + (kk / 8) * f.leading_bytes;
    return f.start_bytes + linear;
  }
  const uint32_t w = uint32_t(f.swizzle_bytes), row_elements = w / 2;
  linear = k_major ? (m % 8) * w + (m / 8) * f.stride_bytes + (kk % 8) * 2 + (kk / 8) * 16
                   : (m % row_elements) * 2 + (m / row_elements) * f.leading_bytes + (kk % 8) * w +
                         (kk / 8) * f.stride_bytes;
  return swizzle_address(f.start_bytes + linear, f.swizzle_bytes, f.base_offset);
}

// ---- wgmma register fragments (m64nNk16, 16-bit inputs, f32 accumulators) -----------------------
// PTX ISA, "Register Fragments" for wgmma .m64nNk16: the warpgroup's warp w (threads 32w..32w+31)
// owns rows 16w..16w+15, and inside them each warp holds exactly the mma.m16n8k16 fragments:
//   accumulator D (64 x N): register i of thread t is in the n8 column tile i/4, where it is the
//     m16n8 C element i%4: row 16w + lane/4 + 8*((i/2)%2), col 8*(i/4) + 2*(lane%4) + i%2.
//   A from registers (64 x 16): element i (register i/2, half i%2) is the m16n8k16 A element i of
//     the warp's 16 rows.
// (CuTe: MMA_Traits<SM90_64xNx16_F32{F16,BF16}...>::CLayout / ALayout, checked by the tests.)
inline FragmentCoord wgmma_accumulator_coord(int thread, int i) {
  const int warp = thread / 32, lane = thread % 32;
  const FragmentCoord c = mma_m16n8k16_c(lane, i % 4);
  return {16 * warp + c.row, 8 * (i / 4) + c.col};
}
inline FragmentCoord wgmma_a_coord(int thread, int i) {
  const int warp = thread / 32, lane = thread % 32;
  const FragmentCoord a = mma_m16n8k16_a(lane, i);
  return {16 * warp + a.row, a.col};
}
// 8-bit A from registers (m64nNk32, 64 x 32; PTX ISA "Register Fragments", wgmma .m64nNk32 A):
// element i is byte i%4 of register i/4; registers 0 and 2 hold row 16w + lane/4, 1 and 3 that
// row + 8; registers 0 and 1 hold columns 4*(lane%4) + i%4, 2 and 3 those + 16. (CuTe:
// MMA_Traits<SM90_64xNx32_F32E4M3E4M3_RS...>::ALayout, checked by test_hopper_layouts.) The
// accumulator of an 8-bit wgmma is the 16-bit one's (wgmma_accumulator_coord).
inline FragmentCoord wgmma_a8_coord(int thread, int i) {
  const int warp = thread / 32, lane = thread % 32, reg = i / 4;
  return {16 * warp + lane / 4 + 8 * (reg % 2), 4 * (lane % 4) + i % 4 + 16 * (reg / 2)};
}
// An e4m3 byte as a float (exact: every e4m3 value is one).
inline float e4m3_bits_to_float(uint8_t bits) {
  __nv_fp8_e4m3 x;
  x.__x = bits;
  return float(x);
}

// ---- wgmma arithmetic ---------------------------------------------------------------------------
// d (64 x n, row-major) = a (64 x 16, row-major) * b (16 x n, row-major) + (accumulate ? d : 0).
// The inputs are f16 or bf16 values already widened to float. Rounding model, as mma_m16n8 in
// primitives_sim.cuh: each product of two 16-bit inputs is exact in f32, and the products are added
// to the accumulator one at a time in k order with fmaf (round to nearest even); without
// `accumulate` the sum starts from +0. The GPU's adder tree differs by a few f32 ulps of
// sum |a*b|; tests compare with a tolerance. T is the operand type, which fixes K (16 for 16-bit
// inputs, 32 for e4m3: a is then 64 x 32, b 32 x n) and the exactness of the products: every
// type's products fit f32. (The GPU's FP8 wgmma is known to keep fewer accumulator bits than f32
// inside one instruction; the sim's rounding is f32's, and the tests' tolerances allow more.)
template <sim_warp::Operand T>
void wgmma_tile(int n, const float* a, const float* b, float* d, bool accumulate) {
  constexpr int K = T == sim_warp::Operand::e4m3 ? 32 : 16;
  for (int row = 0; row < 64; ++row)
    for (int col = 0; col < n; ++col) {
      float sum = accumulate ? d[size_t(row) * n + col] : 0.0f;
      for (int k = 0; k < K; ++k) sum = std::fmaf(a[row * K + k], b[size_t(k) * n + col], sum);
      d[size_t(row) * n + col] = sum;
    }
}

// ---- TMA ----------------------------------------------------------------------------------------
// Where the TMA puts the byte it would put at `smem_offset` without a swizzle
// (CU_TENSOR_MAP_SWIZZLE_{32B,64B,128B}: CuTe's Swizzle<1,4,3>, <2,4,3>, <3,4,3>).
inline uint32_t tma_swizzle_offset(uint32_t smem_offset, int swizzle_bytes) {
  return swizzle_address(smem_offset, swizzle_bytes);
}

// The bytes a tiled TMA load of `map`'s box at `coords` (map.rank entries, elements, innermost
// first; any may be negative or past the tensor) writes starting at `dst_smem_offset`: the box's
// elements in row-major order, dimension 0 innermost, packed, each 16-byte chunk then moved by the
// swizzle of its absolute shared-memory offset. Elements outside the tensor are zeros and are never
// read from global memory; each element read is checked against its device buffer (sim::check_access,
// `site` the kernel's issue). `image` gets exactly the box's bytes. Returns "" or why the copy is
// invalid (then `image` is untouched).
inline std::string tma_box_image(const SimTmaMap& map, const int32_t* coords, uint32_t dst_smem_offset,
                                 std::vector<unsigned char>& image, const void* site = nullptr) {
  if (map.magic != SimTmaMap::kMagic) return "the tensor map was not made by sim_encode_tma_tiled (bad magic)";
  if (map.rank < 1 || map.rank > 5) return "the tensor map's rank is not 1..5";
  const int eb = map.element_bytes;
  const int sw = map.swizzle_bytes;
  if (sw != 0 && sw != 32 && sw != 64 && sw != 128) return "the tensor map's swizzle is not 0, 32, 64 or 128 bytes";
  const uint32_t align = sw ? 128u : 16u;
  if (dst_smem_offset % align != 0)
    return "shared-memory destination is not " + std::to_string(align) + "-byte aligned" +
           (sw ? " (swizzled copy)" : "");
  uint64_t elements = 1;
  for (int i = 0; i < map.rank; ++i) elements *= map.box[i];
  const uint64_t bytes = elements * uint64_t(eb);
  // A swizzle permutes chunks inside each aligned span of its size; a box that ends inside a span
  // would scatter chunks past its own end, which the kernels never ask for and the sim does not model.
  if (sw && bytes % uint64_t(sw) != 0)
    return "a swizzled box's size (" + std::to_string(bytes) + " bytes) must be a multiple of the swizzle span";
  std::vector<unsigned char> out(bytes, 0);
  const auto* base = static_cast<const unsigned char*>(map.base);
  uint32_t index[5] = {0, 0, 0, 0, 0};  // position inside the box, dimension 0 fastest
  for (uint64_t e = 0; e < elements; ++e) {
    bool inside = true;
    uint64_t global = 0;
    for (int i = 0; i < map.rank; ++i) {
      const int64_t c = int64_t(coords[i]) + int64_t(index[i]);
      if (c < 0 || uint64_t(c) >= map.dims[i]) {
        inside = false;
        break;
      }
      global += uint64_t(c) * map.strides_bytes[i];
    }
    if (inside) {
      const uint32_t packed = uint32_t(e * uint64_t(eb));
      const uint32_t placed = tma_swizzle_offset(dst_smem_offset + packed, sw) - dst_smem_offset;
      sim::check_access(base + global, size_t(eb), false, false, site);  // a map larger than its buffer
      if (sim::profiling()) sim::profile_bulk_read(base + global, size_t(eb));  // the issuer closes the request
      std::memcpy(out.data() + placed, base + global, size_t(eb));
    }
    for (int i = 0; i < map.rank; ++i) {
      if (++index[i] < map.box[i]) break;
      index[i] = 0;
    }
  }
  image = std::move(out);
  return "";
}

}  // namespace sim_hopper
SELFATTN_KERNELS_END
