// The sim's reading of Hopper's shared-memory layouts (kernels/common/primitives_hopper_sim.cuh)
// and the kernel's tile layouts and descriptors (kernels/hopper/smem_layout.h), checked against
// NVIDIA's CUTLASS/CuTe: the GMMA canonical layout atoms placed with tile_to_shape, descriptors
// from make_gmma_desc, the wgmma MMA_Traits' thread/value layouts, CuTe's swizzle functors and its
// mapping of them onto the TMA's swizzle modes. CuTe is the ground truth here only; nothing of it
// reaches the library.
#include <cstddef>
#include <cstdint>

// make_gmma_desc takes the start address from cast_smem_ptr_to_uint, which on the host has no
// shared window to convert to (it prints an error and returns 0). Giving CuTe a host
// __cvta_generic_to_shared that measures from the test's 1024-aligned buffer makes its descriptors
// carry real start addresses, so they compare with ours bit for bit.
namespace {
const unsigned char* g_smem_base = nullptr;
}
#define CUTE_CVTA_GENERIC_TO_SHARED_ACTIVATED 1
inline size_t __cvta_generic_to_shared(const void* p) {
  return size_t(static_cast<const unsigned char*>(p) - g_smem_base);
}

#include <cute/arch/mma_sm90_desc.hpp>
#include <cute/atom/copy_traits_sm90_tma_swizzle.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

#include <array>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/primitives_hopper_sim.cuh"
#include "common/tma_descriptor.h"
#include "hopper/smem_layout.h"

namespace {
namespace k = selfattn::kernels;
namespace hs = selfattn::kernels::sim_target::sim_hopper;
namespace warp = selfattn::kernels::sim_target::sim_warp;
namespace GMMA = cute::SM90::GMMA;
using cute::_1;
using cute::_16;
using cute::_2;
using cute::_64;
using cute::Int;
using cute::Shape;

// A 1024-aligned stand-in for a block's dynamic shared memory, which CuTe's descriptors (through
// the hook above) and ours measure from.
struct Smem {
  static constexpr uint32_t kBytes = 256 * 1024;
  alignas(1024) unsigned char bytes[kBytes];
};
Smem& smem() {
  static std::unique_ptr<Smem> s = [] {
    auto p = std::make_unique<Smem>();
    g_smem_base = p->bytes;
    return p;
  }();
  return *s;
}
template <class T>
T* smem_at(uint32_t offset) {
  return reinterpret_cast<T*>(smem().bytes + offset);
}
template <class P>
uint32_t offset_of(const P* p) {
  return uint32_t(reinterpret_cast<const unsigned char*>(p) - smem().bytes);
}
uint16_t load16(uint32_t offset) {
  uint16_t v;
  std::memcpy(&v, smem().bytes + offset, 2);
  return v;
}
template <class Ref>
void store16(Ref&& element, uint16_t v) {
  std::memcpy(&element, &v, 2);
}

// The descriptor fields as CuTe's own bitfield holds them, against our decoding.
void expect_fields_match(uint64_t desc) {
  cute::GmmaDescriptor d(desc);
  const hs::GmmaDescFields f = hs::gmma_desc_fields(desc);
  EXPECT_EQ(f.start_bytes, uint32_t(d.bitfield.start_address_) << 4);
  EXPECT_EQ(f.leading_bytes, uint32_t(d.bitfield.leading_byte_offset_) << 4);
  EXPECT_EQ(f.stride_bytes, uint32_t(d.bitfield.stride_byte_offset_) << 4);
  EXPECT_EQ(f.base_offset, uint32_t(d.bitfield.base_offset_));
  const auto type = GMMA::LayoutType(d.bitfield.layout_type_);
  const int expected_swizzle = type == GMMA::LayoutType::B128  ? 128
                               : type == GMMA::LayoutType::B64 ? 64
                               : type == GMMA::LayoutType::B32 ? 32
                                                               : 0;
  EXPECT_EQ(f.swizzle_bytes, expected_swizzle);
}

// ---- wgmma operands: every canonical layout CuTe has, both major-nesses ---------------------------
// A (MN = 64) or B (MN = N) operand of KW = 64 columns of K (four wgmma k-steps) laid out by CuTe
// from one of its GMMA atoms, at `base` in shared memory; each element holds its own index. For
// every k-step, CuTe's descriptor of the 16-column sub-tensor, read through gmma_element_offset,
// must find each element where CuTe put it.
template <class T, GMMA::Major Major, class Atom, int MN>
void check_operand(uint32_t base) {
  constexpr int KW = 64;
  auto layout = cute::tile_to_shape(Atom{}, Shape<Int<MN>, Int<KW>>{});
  auto tensor = cute::make_tensor(cute::make_smem_ptr(smem_at<T>(base)), layout);
  ASSERT_LE(base + uint32_t(cute::cosize(layout)) * 2, Smem::kBytes);
  std::memset(smem().bytes, 0, Smem::kBytes);
  auto id = [](int mn, int kk) { return uint16_t(1 + mn * KW + kk); };  // distinct, never 0
  for (int mn = 0; mn < MN; ++mn)
    for (int kk = 0; kk < KW; ++kk) store16(tensor(mn, kk), id(mn, kk));
  const bool k_major = Major == GMMA::Major::K;
  for (int ks = 0; ks < KW / 16; ++ks) {
    auto sub = cute::local_tile(tensor, Shape<Int<MN>, _16>{}, cute::make_coord(0, ks));
    const uint64_t desc = GMMA::make_gmma_desc<Major>(sub);
    expect_fields_match(desc);
    int wrong = 0;
    for (int mn = 0; mn < MN; ++mn)
      for (int kk = 0; kk < 16; ++kk) {
        const uint32_t ours = hs::gmma_element_offset(desc, k_major, mn, kk);
        const uint32_t cutes = offset_of(&sub(mn, kk));
        if ((ours != cutes || load16(ours) != id(mn, 16 * ks + kk)) && wrong++ < 4)
          ADD_FAILURE() << "element (" << mn << "," << kk << ") of k-step " << ks << ": ours at " << ours
                        << ", CuTe's at " << cutes << " (descriptor 0x" << std::hex << desc << ")";
      }
    EXPECT_EQ(wrong, 0) << "k-step " << ks << " of an MN=" << MN << (k_major ? " K-major" : " MN-major") << " operand";
  }
}

template <class T, int MN>
void check_operands_of_width(uint32_t base) {
  SCOPED_TRACE("MN = " + std::to_string(MN) + ", base " + std::to_string(base));
  {
    SCOPED_TRACE("K-major, interleave (no swizzle)");
    check_operand<T, GMMA::Major::K, GMMA::Layout_K_INTER_Atom<T>, MN>(base);
  }
  {
    SCOPED_TRACE("K-major, 32B swizzle");
    check_operand<T, GMMA::Major::K, GMMA::Layout_K_SW32_Atom<T>, MN>(base);
  }
  {
    SCOPED_TRACE("K-major, 64B swizzle");
    check_operand<T, GMMA::Major::K, GMMA::Layout_K_SW64_Atom<T>, MN>(base);
  }
  {
    SCOPED_TRACE("K-major, 128B swizzle");
    check_operand<T, GMMA::Major::K, GMMA::Layout_K_SW128_Atom<T>, MN>(base);
  }
  {
    SCOPED_TRACE("MN-major, interleave (no swizzle)");
    check_operand<T, GMMA::Major::MN, GMMA::Layout_MN_INTER_Atom<T>, MN>(base);
  }
  {
    SCOPED_TRACE("MN-major, 32B swizzle");
    check_operand<T, GMMA::Major::MN, GMMA::Layout_MN_SW32_Atom<T>, MN>(base);
  }
  {
    SCOPED_TRACE("MN-major, 64B swizzle");
    check_operand<T, GMMA::Major::MN, GMMA::Layout_MN_SW64_Atom<T>, MN>(base);
  }
  {
    SCOPED_TRACE("MN-major, 128B swizzle");
    check_operand<T, GMMA::Major::MN, GMMA::Layout_MN_SW128_Atom<T>, MN>(base);
  }
}

template <class T>
void check_all_operands() {
  for (uint32_t base : {0u, 5u * 1024u}) {
    check_operands_of_width<T, 64>(base);  // A, and B with N = 64
    check_operands_of_width<T, 128>(base);
    check_operands_of_width<T, 256>(base);
  }
}

TEST(HopperLayouts, GmmaDescriptorsReadCuTeCanonicalLayoutsF16) { check_all_operands<cute::half_t>(); }
TEST(HopperLayouts, GmmaDescriptorsReadCuTeCanonicalLayoutsBF16) { check_all_operands<cute::bfloat16_t>(); }

// The fields by hand (PTX ISA "Matrix Descriptor Format").
TEST(HopperLayouts, GmmaDescriptorFieldsDecode) {
  const uint64_t desc = uint64_t(0x1234 & 0x3fff) | uint64_t(0x0567) << 16 | uint64_t(0x0040) << 32 |
                        uint64_t(5) << 49 | uint64_t(2) << 62;
  const hs::GmmaDescFields f = hs::gmma_desc_fields(desc);
  EXPECT_EQ(f.start_bytes, 0x1234u << 4);
  EXPECT_EQ(f.leading_bytes, 0x0567u << 4);
  EXPECT_EQ(f.stride_bytes, 0x40u << 4);
  EXPECT_EQ(f.base_offset, 5u);
  EXPECT_EQ(f.swizzle_bytes, 64);
  expect_fields_match(desc);
  for (uint64_t mode = 0; mode < 4; ++mode) expect_fields_match(mode << 62 | 0x3fff);
}

// The base offset: CuTe (and our kernels) always write 0, so a non-zero one is checked only against
// the reading documented in primitives_hopper_sim.cuh (the ISA's "(pattern start >> 7) & 7": the
// swizzle's row phase counted from the pattern's start). Not grounded in CuTe or hardware.
TEST(HopperLayouts, GmmaBaseOffsetShiftsTheSwizzlePhase) {
  const uint32_t pattern_start = 3 * 128;  // a 128B pattern starting three rows into a 1024-byte period
  const uint64_t plain = k::gmma_desc(pattern_start, 16, 1024, k::GmmaSwizzle::b128);
  const uint64_t based = plain | uint64_t((pattern_start >> 7) & 7) << 49;
  for (int mn = 0; mn < 64; ++mn)
    for (int kk = 0; kk < 16; ++kk) {
      const uint32_t linear = uint32_t(mn % 8) * 128 + uint32_t(mn / 8) * 1024 + uint32_t(kk) * 2;
      const uint32_t relative = linear ^ (((linear >> 7) & 7) << 4);  // swizzled as if the pattern were aligned
      EXPECT_EQ(hs::gmma_element_offset(based, true, mn, kk), pattern_start + relative);
      EXPECT_EQ(hs::gmma_element_offset(plain, true, mn, kk), hs::tma_swizzle_offset(pattern_start + linear, 128));
    }
}

// ---- wgmma fragments ---------------------------------------------------------------------------
// CuTe's (thread, value) -> (m, n) layouts give a column-major index m + 64 n (m + 64 k for A).
template <class Traits, int N>
void check_accumulator_layout() {
  using C = typename Traits::CLayout;
  static_assert(decltype(cute::size<0>(C{}))::value == 128 && decltype(cute::size<1>(C{}))::value == N / 2);
  for (int t = 0; t < 128; ++t)
    for (int i = 0; i < N / 2; ++i) {
      const int index = int(C{}(t, i));
      const auto at = hs::wgmma_accumulator_coord(t, i);
      ASSERT_EQ(at.row, index % 64) << "thread " << t << " register " << i << " N " << N;
      ASSERT_EQ(at.col, index / 64) << "thread " << t << " register " << i << " N " << N;
    }
}
template <class Traits>
void check_a_layout() {
  using A = typename Traits::ALayout;
  static_assert(decltype(cute::size<0>(A{}))::value == 128 && decltype(cute::size<1>(A{}))::value == 8);
  for (int t = 0; t < 128; ++t)
    for (int i = 0; i < 8; ++i) {
      const int index = int(A{}(t, i));
      const auto at = hs::wgmma_a_coord(t, i);
      ASSERT_EQ(at.row, index % 64) << "thread " << t << " element " << i;
      ASSERT_EQ(at.col, index / 64) << "thread " << t << " element " << i;
    }
}

TEST(HopperLayouts, WgmmaAccumulatorFragmentIsCuTeCLayout) {
  constexpr auto K = GMMA::Major::K;
  check_accumulator_layout<cute::MMA_Traits<cute::SM90_64x64x16_F32F16F16_SS<K, K>>, 64>();
  check_accumulator_layout<cute::MMA_Traits<cute::SM90_64x128x16_F32F16F16_SS<K, K>>, 128>();
  check_accumulator_layout<cute::MMA_Traits<cute::SM90_64x256x16_F32F16F16_SS<K, K>>, 256>();
  check_accumulator_layout<cute::MMA_Traits<cute::SM90_64x64x16_F32BF16BF16_SS<K, K>>, 64>();
  check_accumulator_layout<cute::MMA_Traits<cute::SM90_64x128x16_F32BF16BF16_SS<K, K>>, 128>();
  check_accumulator_layout<cute::MMA_Traits<cute::SM90_64x256x16_F32BF16BF16_SS<K, K>>, 256>();
  // B's major-ness and A in registers change nothing about D.
  check_accumulator_layout<cute::MMA_Traits<cute::SM90_64x128x16_F32F16F16_RS<K, GMMA::Major::MN>>, 128>();
}

TEST(HopperLayouts, WgmmaRegisterAFragmentIsCuTeALayout) {
  constexpr auto K = GMMA::Major::K, MN = GMMA::Major::MN;
  check_a_layout<cute::MMA_Traits<cute::SM90_64x64x16_F32F16F16_RS<K, K>>>();
  check_a_layout<cute::MMA_Traits<cute::SM90_64x128x16_F32F16F16_RS<K, MN>>>();
  check_a_layout<cute::MMA_Traits<cute::SM90_64x256x16_F32BF16BF16_RS<K, MN>>>();
  check_a_layout<cute::MMA_Traits<cute::SM90_64x64x16_F32BF16BF16_RS<K, K>>>();
}

// ---- swizzles ------------------------------------------------------------------------------------
template <int B>
void check_swizzle(int swizzle_bytes) {
  // CuTe's own mapping from a swizzle functor to the TMA's swizzle mode: the functor is the mode.
  const auto bits = cute::detail::get_tma_swizzle_bits(cute::Swizzle<B, 4, 3>{});
  EXPECT_EQ(int(bits), B);  // SmemSwizzleBits: B32 = 1, B64 = 2, B128 = 3, as CU_TENSOR_MAP_SWIZZLE_*
  const cute::Swizzle<B, 4, 3> swizzle;
  for (uint32_t offset = 0; offset < (1u << 18); ++offset)
    ASSERT_EQ(hs::tma_swizzle_offset(offset, swizzle_bytes), uint32_t(swizzle(int(offset)))) << offset;
}
TEST(HopperLayouts, TmaSwizzleIsCuTeSwizzle) {
  check_swizzle<3>(128);
  check_swizzle<2>(64);
  check_swizzle<1>(32);
  for (uint32_t offset = 0; offset < 4096; ++offset) EXPECT_EQ(hs::tma_swizzle_offset(offset, 0), offset);
}

// ---- TMA boxes -----------------------------------------------------------------------------------
// A 3-D global tensor (200 columns, 150 rows, 2 planes) of distinct non-zero 16-bit values.
struct GlobalTensor {
  static constexpr int kCols = 200, kRows = 150, kPlanes = 2;
  std::vector<uint16_t> data;
  GlobalTensor() : data(size_t(kCols) * kRows * kPlanes) {
    for (size_t i = 0; i < data.size(); ++i) data[i] = uint16_t(1 + i);
  }
  uint16_t at(int plane, int row, int col) const {
    if (plane < 0 || plane >= kPlanes || row < 0 || row >= kRows || col < 0 || col >= kCols) return 0;
    return data[(size_t(plane) * kRows + row) * kCols + col];
  }
  k::SimTmaMap map(uint32_t box_cols, uint32_t box_rows, k::TmaSwizzle swizzle) const {
    k::TmaTiledSpec spec;
    spec.base = data.data();
    spec.rank = 3;
    spec.element_bytes = 2;
    spec.dims[0] = kCols, spec.dims[1] = kRows, spec.dims[2] = kPlanes;
    spec.strides_bytes[1] = kCols * 2, spec.strides_bytes[2] = uint64_t(kCols) * kRows * 2;
    spec.box[0] = box_cols, spec.box[1] = box_rows, spec.box[2] = 1;
    spec.swizzle = swizzle;
    k::TmaDescriptor desc;
    EXPECT_EQ(k::sim_encode_tma_tiled(&desc, spec), "");
    k::SimTmaMap m;
    std::memcpy(&m, desc.bytes, sizeof m);
    return m;
  }
};

// The box lands where CuTe's K-major atom of the same swizzle, tiled to the box, puts each
// element (rows of box_cols * 2 = swizzle bytes); without a swizzle, packed row-major.
template <class Atom, int Cols, int Rows>
void check_tma_box(const GlobalTensor& g, k::TmaSwizzle swizzle, const int32_t (&coords)[3], uint32_t dst) {
  SCOPED_TRACE("box {" + std::to_string(Cols) + "," + std::to_string(Rows) + "} at (" + std::to_string(coords[0]) +
               "," + std::to_string(coords[1]) + "," + std::to_string(coords[2]) + ") to " + std::to_string(dst) +
               ", swizzle " + std::to_string(int(swizzle)));
  const k::SimTmaMap m = g.map(Cols, Rows, swizzle);
  std::vector<unsigned char> image;
  ASSERT_EQ(hs::tma_box_image(m, coords, dst, image), "");
  ASSERT_EQ(image.size(), size_t(Cols) * Rows * 2);
  std::memset(smem().bytes, 0xff, Smem::kBytes);
  std::memcpy(smem().bytes + dst, image.data(), image.size());
  auto layout = cute::tile_to_shape(Atom{}, Shape<Int<Rows>, Int<Cols>>{});
  auto tensor = cute::make_tensor(cute::make_smem_ptr(smem_at<cute::half_t>(dst)), layout);
  int wrong = 0;
  for (int r = 0; r < Rows; ++r)
    for (int c = 0; c < Cols; ++c) {
      const uint32_t where = swizzle == k::TmaSwizzle::none ? dst + uint32_t(r * Cols + c) * 2 : offset_of(&tensor(r, c));
      const uint16_t expected = g.at(coords[2], coords[1] + r, coords[0] + c);
      if (load16(where) != expected && wrong++ < 4)
        ADD_FAILURE() << "(row " << r << ", col " << c << ") at " << where << ": " << load16(where) << ", expected "
                      << expected;
    }
  EXPECT_EQ(wrong, 0);
}

TEST(HopperLayouts, TmaBoxLandsAsCuTeSwizzledAtomsWithZerosOutOfBounds) {
  const GlobalTensor g;
  const int32_t in_bounds[3] = {64, 16, 1}, cols_past_end[3] = {160, 8, 0}, negative[3] = {-16, -5, 0},
                rows_past_end[3] = {0, 120, 1}, all_outside[3] = {0, 0, 2};
  for (uint32_t dst : {0u, 3u * 1024u, 5u * 128u}) {
    for (const auto* c : {&in_bounds, &cols_past_end, &negative, &rows_past_end, &all_outside}) {
      check_tma_box<GMMA::Layout_K_SW128_Atom<cute::half_t>, 64, 64>(g, k::TmaSwizzle::b128, *c, dst);
      check_tma_box<GMMA::Layout_K_SW128_Atom<cute::half_t>, 64, 128>(g, k::TmaSwizzle::b128, *c, dst);
      check_tma_box<GMMA::Layout_K_SW128_Atom<cute::half_t>, 64, 176>(g, k::TmaSwizzle::b128, *c, dst);
      check_tma_box<GMMA::Layout_K_SW64_Atom<cute::half_t>, 32, 64>(g, k::TmaSwizzle::b64, *c, dst);
      check_tma_box<GMMA::Layout_K_SW32_Atom<cute::half_t>, 16, 64>(g, k::TmaSwizzle::b32, *c, dst);
      check_tma_box<GMMA::Layout_K_SW128_Atom<cute::half_t>, 64, 16>(g, k::TmaSwizzle::none, *c, dst);
    }
  }
}

TEST(HopperLayouts, TmaBoxRefusals) {
  const GlobalTensor g;
  const int32_t coords[3] = {0, 0, 0};
  std::vector<unsigned char> image;
  k::SimTmaMap m = g.map(64, 64, k::TmaSwizzle::b128);
  EXPECT_NE(hs::tma_box_image(m, coords, 64, image), "");    // swizzled: 128-byte aligned
  EXPECT_EQ(hs::tma_box_image(m, coords, 128, image), "");
  m = g.map(64, 64, k::TmaSwizzle::none);
  EXPECT_NE(hs::tma_box_image(m, coords, 8, image), "");     // otherwise 16
  EXPECT_EQ(hs::tma_box_image(m, coords, 16, image), "");
  m.magic = 0;
  EXPECT_NE(hs::tma_box_image(m, coords, 0, image), "");
  m = g.map(64, 3, k::TmaSwizzle::b128);                      // 384 bytes: whole 128-byte spans, fine
  EXPECT_EQ(hs::tma_box_image(m, coords, 0, image), "");
  m = g.map(32, 3, k::TmaSwizzle::b128);                      // 192 bytes end inside a span
  const std::string why = hs::tma_box_image(m, coords, 0, image);
  EXPECT_NE(why, "");
  EXPECT_EQ(image.size(), size_t(384)) << "a refused copy leaves the image alone";
}

// ---- the kernel's tiles: kernels/hopper/smem_layout.h --------------------------------------------
// Rows x D row tile at `base` (1024-aligned) as the TMA lands it: CuTe's tile_to_shape of the
// 128B K-major atom over (R, D), whose default (column-major) order stacks the 8 x 64 atoms down
// the rows first, i.e. column block c at c * R * 128 bytes.
template <class T, int R, int D>
void check_row_tile(uint32_t base) {
  SCOPED_TRACE("R " + std::to_string(R) + ", D " + std::to_string(D) + ", base " + std::to_string(base));
  auto layout = cute::tile_to_shape(GMMA::Layout_K_SW128_Atom<T>{}, Shape<Int<R>, Int<D>>{});
  auto tile = cute::make_tensor(cute::make_smem_ptr(smem_at<T>(base)), layout);
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < D; ++c) ASSERT_EQ(k::row_tile_offset(R, r, c), offset_of(&tile(r, c)) - base) << r << "," << c;

  // K-major: A (64 rows from 64 g) and B (all R rows) of every 16-column k-step.
  for (int k0 = 0; k0 < D; k0 += 16) {
    if constexpr (R % 64 == 0) {
      for (int g = 0; g < R / 64; ++g) {
        auto sub = cute::local_tile(tile, Shape<_64, _16>{}, cute::make_coord(g, k0 / 16));
        const uint64_t cutes = GMMA::make_gmma_desc<GMMA::Major::K>(sub);
        const uint64_t ours = k::k_major_desc(base, R, 64 * g, k0);
        ASSERT_EQ(ours, cutes) << "A rows from " << 64 * g << ", k0 " << k0;
        for (int mn = 0; mn < 64; ++mn)
          for (int kk = 0; kk < 16; ++kk)
            ASSERT_EQ(hs::gmma_element_offset(ours, true, mn, kk), base + k::row_tile_offset(R, 64 * g + mn, k0 + kk));
      }
    }
    auto sub = cute::local_tile(tile, Shape<Int<R>, _16>{}, cute::make_coord(0, k0 / 16));
    const uint64_t cutes = GMMA::make_gmma_desc<GMMA::Major::K>(sub);
    const uint64_t ours = k::k_major_desc(base, R, 0, k0);
    ASSERT_EQ(ours, cutes) << "B, k0 " << k0;
    for (int mn = 0; mn < R; ++mn)
      for (int kk = 0; kk < 16; ++kk)
        ASSERT_EQ(hs::gmma_element_offset(ours, true, mn, kk), base + k::row_tile_offset(R, mn, k0 + kk));
  }

  // MN-major V (N = the D columns, K = keys): CuTe's 128B MN atom (64 columns x 8 keys) tiled over
  // (D, R) keys first is the same bytes as the row tile, element (col, key) = tile (key, col).
  auto vlayout = cute::tile_to_shape(GMMA::Layout_MN_SW128_Atom<T>{}, Shape<Int<D>, Int<R>>{}, cute::Step<_2, _1>{});
  auto v = cute::make_tensor(cute::make_smem_ptr(smem_at<T>(base)), vlayout);
  for (int key = 0; key < R; ++key)
    for (int c = 0; c < D; ++c) ASSERT_EQ(offset_of(&v(c, key)), offset_of(&tile(key, c))) << key << "," << c;
  for (int key0 = 0; key0 + 16 <= R; key0 += 16) {
    auto sub = cute::local_tile(v, Shape<Int<D>, _16>{}, cute::make_coord(0, key0 / 16));
    const uint64_t cutes = GMMA::make_gmma_desc<GMMA::Major::MN>(sub);
    const uint64_t ours = k::mn_major_desc(base, R, key0);
    if constexpr (D == 64) {
      // One 64-column block: LBO (the step to the next block along N) is never used, and CuTe
      // writes the stride of a size-1 mode there. Everything else bit-equal.
      const uint64_t lbo_field = uint64_t(0x3fff) << 16;
      ASSERT_EQ(ours & ~lbo_field, cutes & ~lbo_field) << "V, key0 " << key0;
    } else {
      ASSERT_EQ(ours, cutes) << "V, key0 " << key0;
    }
    for (int col = 0; col < D; ++col)
      for (int kk = 0; kk < 16; ++kk)
        ASSERT_EQ(hs::gmma_element_offset(ours, false, col, kk), base + k::row_tile_offset(R, key0 + kk, col));
    if constexpr (D == 256) {  // N = 128 halves of the head dimension
      for (int h = 0; h < 2; ++h) {
        auto half = cute::local_tile(v, Shape<Int<128>, _16>{}, cute::make_coord(h, key0 / 16));
        const uint64_t ours_half = k::mn_major_desc(base, R, key0, 128 * h);
        ASSERT_EQ(ours_half, uint64_t(GMMA::make_gmma_desc<GMMA::Major::MN>(half))) << "V half " << h;
        for (int col = 0; col < 128; ++col)
          for (int kk = 0; kk < 16; ++kk)
            ASSERT_EQ(hs::gmma_element_offset(ours_half, false, col, kk),
                      base + k::row_tile_offset(R, key0 + kk, 128 * h + col));
      }
    }
  }
}

template <class T, int R>
void check_row_tiles_of_height() {
  for (uint32_t base : {0u, 3u * 1024u}) {
    check_row_tile<T, R, 64>(base);
    check_row_tile<T, R, 128>(base);
    check_row_tile<T, R, 256>(base);
  }
}
TEST(HopperLayouts, KernelRowTilesAndDescriptorsAreCuTes) {
  check_row_tiles_of_height<cute::half_t, 64>();
  check_row_tiles_of_height<cute::half_t, 128>();
  check_row_tiles_of_height<cute::half_t, 176>();
  check_row_tiles_of_height<cute::bfloat16_t, 128>();
  check_row_tiles_of_height<cute::bfloat16_t, 256>();
}

TEST(HopperLayouts, GmmaDescEncoder) {
  const uint64_t d = k::gmma_desc(0x12340, 0x560, 0x400, k::GmmaSwizzle::b64);
  const hs::GmmaDescFields f = hs::gmma_desc_fields(d);
  EXPECT_EQ(f.start_bytes, 0x12340u);
  EXPECT_EQ(f.leading_bytes, 0x560u);
  EXPECT_EQ(f.stride_bytes, 0x400u);
  EXPECT_EQ(f.base_offset, 0u);
  EXPECT_EQ(f.swizzle_bytes, 64);
  EXPECT_EQ(hs::gmma_desc_fields(k::gmma_desc(0, 0, 0, k::GmmaSwizzle::none)).swizzle_bytes, 0);
  EXPECT_EQ(hs::gmma_desc_fields(k::gmma_desc(0, 0, 0, k::GmmaSwizzle::b32)).swizzle_bytes, 32);
  EXPECT_EQ(hs::gmma_desc_fields(k::gmma_desc(0, 0, 0, k::GmmaSwizzle::b128)).swizzle_bytes, 128);
}

// TMA boxes of a global matrix landing as the kernel's row tile, read back through the kernel's
// descriptors: the whole path the Hopper kernel's operands take, CuTe aside.
TEST(HopperLayouts, TmaRowTileReadThroughKernelDescriptors) {
  constexpr int kRows = 150, kCols = 128, R = 128;
  std::vector<uint16_t> global(size_t(kRows) * kCols);
  for (size_t i = 0; i < global.size(); ++i) global[i] = uint16_t(1 + i);
  k::TmaTiledSpec spec;
  spec.base = global.data();
  spec.rank = 2;
  spec.dims[0] = kCols, spec.dims[1] = kRows;
  spec.strides_bytes[1] = kCols * 2;
  spec.box[0] = 64, spec.box[1] = R;
  spec.swizzle = k::TmaSwizzle::b128;
  k::TmaDescriptor desc;
  ASSERT_EQ(k::sim_encode_tma_tiled(&desc, spec), "");
  k::SimTmaMap m;
  std::memcpy(&m, desc.bytes, sizeof m);
  const uint32_t base = 2 * 1024;
  const int32_t row0 = 64;  // rows 64..191: the last 42 past the end
  std::memset(smem().bytes, 0xff, Smem::kBytes);
  for (int c = 0; c < kCols / 64; ++c) {
    const int32_t coords[2] = {64 * c, row0};
    std::vector<unsigned char> image;
    const uint32_t dst = base + uint32_t(c) * R * 128;
    ASSERT_EQ(hs::tma_box_image(m, coords, dst, image), "");
    std::memcpy(smem().bytes + dst, image.data(), image.size());
  }
  auto expected = [&](int r, int c) { return row0 + r < kRows ? global[size_t(row0 + r) * kCols + c] : uint16_t(0); };
  for (int g = 0; g < R / 64; ++g)
    for (int k0 = 0; k0 < kCols; k0 += 16) {
      const uint64_t d = k::k_major_desc(base, R, 64 * g, k0);
      for (int mn = 0; mn < 64; ++mn)
        for (int kk = 0; kk < 16; ++kk)
          ASSERT_EQ(load16(hs::gmma_element_offset(d, true, mn, kk)), expected(64 * g + mn, k0 + kk));
    }
  for (int key0 = 0; key0 < R; key0 += 16) {
    const uint64_t d = k::mn_major_desc(base, R, key0);
    for (int col = 0; col < kCols; ++col)
      for (int kk = 0; kk < 16; ++kk)
        ASSERT_EQ(load16(hs::gmma_element_offset(d, false, col, kk)), expected(key0 + kk, col));
  }
}

// ---- wgmma arithmetic ------------------------------------------------------------------------------
template <warp::Operand T>
float round_to(float x) {
  if (T == warp::Operand::f16) return __half2float(__float2half_rn(x));
  return __bfloat162float(__float2bfloat16_rn(x));
}

template <warp::Operand T>
void check_wgmma_tile(int n, bool accumulate, bool integers, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> real(-2.f, 2.f);
  std::uniform_int_distribution<int> whole(-8, 8);
  auto draw = [&] { return integers ? float(whole(rng)) : round_to<T>(real(rng)); };
  std::vector<float> a(64 * 16), b(size_t(16) * n), c(size_t(64) * n), d;
  for (float& x : a) x = draw();
  for (float& x : b) x = draw();
  for (float& x : c) x = integers ? float(whole(rng)) : real(rng);
  d = c;
  hs::wgmma_tile<T>(n, a.data(), b.data(), d.data(), accumulate);
  for (int row = 0; row < 64; ++row)
    for (int col = 0; col < n; ++col) {
      double exact = accumulate ? c[size_t(row) * n + col] : 0.0;
      double magnitude = std::fabs(exact);
      for (int kk = 0; kk < 16; ++kk) {
        const double p = double(a[row * 16 + kk]) * double(b[size_t(kk) * n + col]);
        exact += p;
        magnitude += std::fabs(p);
      }
      const double got = d[size_t(row) * n + col];
      if (integers) {
        ASSERT_EQ(got, exact) << row << "," << col;
      } else {
        ASSERT_NEAR(got, exact, 17 * std::ldexp(magnitude, -24) + 1e-30) << row << "," << col;
      }
    }
}

TEST(HopperLayouts, WgmmaTileIsTheMatrixProduct) {
  for (int n : {64, 128, 256})
    for (bool accumulate : {false, true})
      for (bool integers : {true, false}) {
        SCOPED_TRACE("n " + std::to_string(n) + (accumulate ? " +=" : " =") + (integers ? " integers" : " reals"));
        check_wgmma_tile<warp::Operand::f16>(n, accumulate, integers, uint32_t(n + 2 * accumulate + integers));
        check_wgmma_tile<warp::Operand::bf16>(n, accumulate, integers, uint32_t(7 * n + accumulate));
      }
  // Without accumulate, whatever d held (NaN included) is not read.
  std::vector<float> a(64 * 16, 1.0f), b(16 * 64, 0.5f), d(64 * 64, NAN);
  hs::wgmma_tile<warp::Operand::f16>(64, a.data(), b.data(), d.data(), false);
  for (float x : d) ASSERT_EQ(x, 8.0f);
}

}  // namespace
