// The sim's reading of Hopper's shared-memory layouts (kernels/common/primitives_hopper_sim.cuh)
// and the kernel's tile layouts and descriptors (kernels/hopper/smem_layout.h), checked against
// NVIDIA's CUTLASS/CuTe: the GMMA canonical layout atoms placed with tile_to_shape, descriptors
// from make_gmma_desc, the wgmma MMA_Traits' thread/value layouts, CuTe's swizzle functors and its
// mapping of them onto the TMA's swizzle modes. CuTe is the ground truth here only; nothing of it
// reaches the library.
// This program: the TMA boxes and the kernel's tiles and descriptors (kernels/hopper/smem_layout.h)
// (the operands, fragments, swizzles and wgmma arithmetic: test_hopper_layouts.cpp; the shared
// shim: hopper_layouts_cute.h).
#include "hopper_layouts_cute.h"

#include <cstring>
#include <string>
#include <vector>

namespace {

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

// 1-byte elements (the FP8 forward's q, k and V^T maps): boxes of 128 (or 64) columns, the 128-
// (64-) byte swizzle's row, by R rows land as CuTe's Layout_K_SW128_Atom (SW64) for 1-byte elements
// (8 rows x 128 or 64) tiled to the box, which is smem_layout.h's row_tile_offset_8bit; out of
// bounds reads zeros.
template <int Rows, int Cols = 128>
void check_tma_box_8bit(const int32_t (&coords)[3], uint32_t dst) {
  SCOPED_TRACE("8-bit box {" + std::to_string(Cols) + "," + std::to_string(Rows) + "} at (" +
               std::to_string(coords[0]) + "," + std::to_string(coords[1]) + "," + std::to_string(coords[2]) +
               ") to " + std::to_string(dst));
  // 300 columns in rows of 304 bytes (TMA strides are multiples of 16), 150 rows, 2 planes; never 0.
  constexpr int kCols = 300, kPitch = 304, kRows = 150, kPlanes = 2;
  std::vector<uint8_t> data(size_t(kPitch) * kRows * kPlanes);
  for (size_t i = 0; i < data.size(); ++i) data[i] = uint8_t(1 + i % 251);
  auto at = [&](int plane, int row, int col) -> uint8_t {
    if (plane < 0 || plane >= kPlanes || row < 0 || row >= kRows || col < 0 || col >= kCols) return 0;
    return data[(size_t(plane) * kRows + row) * kPitch + col];
  };
  k::TmaTiledSpec spec;
  spec.base = data.data();
  spec.rank = 3;
  spec.element_bytes = 1;
  spec.dims[0] = kCols, spec.dims[1] = kRows, spec.dims[2] = kPlanes;
  spec.strides_bytes[1] = kPitch, spec.strides_bytes[2] = uint64_t(kPitch) * kRows;
  spec.box[0] = Cols, spec.box[1] = Rows, spec.box[2] = 1;
  spec.swizzle = Cols == 128 ? k::TmaSwizzle::b128 : k::TmaSwizzle::b64;
  k::TmaDescriptor desc;
  ASSERT_EQ(k::sim_encode_tma_tiled(&desc, spec), "");
  k::SimTmaMap m;
  std::memcpy(&m, desc.bytes, sizeof m);
  std::vector<unsigned char> image;
  ASSERT_EQ(hs::tma_box_image(m, coords, dst, image), "");
  ASSERT_EQ(image.size(), size_t(Cols) * Rows);
  std::memset(smem().bytes, 0xff, Smem::kBytes);
  std::memcpy(smem().bytes + dst, image.data(), image.size());
  using Atom = std::conditional_t<Cols == 128, GMMA::Layout_K_SW128_Atom<cute::float_e4m3_t>,
                                  GMMA::Layout_K_SW64_Atom<cute::float_e4m3_t>>;
  auto layout = cute::tile_to_shape(Atom{}, Shape<Int<Rows>, Int<Cols>>{});
  auto tensor = cute::make_tensor(cute::make_smem_ptr(smem_at<cute::float_e4m3_t>(dst)), layout);
  int wrong = 0;
  for (int r = 0; r < Rows; ++r)
    for (int c = 0; c < Cols; ++c) {
      const uint32_t where = offset_of(&tensor(r, c));
      const uint8_t expected = at(coords[2], coords[1] + r, coords[0] + c);
      if (dst % 1024 == 0) EXPECT_EQ(where, dst + k::row_tile_offset_8bit(Rows, r, c, Cols));
      if (smem().bytes[where] != expected && wrong++ < 4)
        ADD_FAILURE() << "(row " << r << ", col " << c << ") at " << where << ": " << int(smem().bytes[where])
                      << ", expected " << int(expected);
    }
  EXPECT_EQ(wrong, 0);
}

TEST(HopperLayouts, TmaBoxOf1ByteElementsLandsAsCuTeSw128AndSw64Atoms) {
  const int32_t in_bounds[3] = {128, 16, 1}, cols_past_end[3] = {256, 8, 0}, negative[3] = {-16, -5, 0},
                rows_past_end[3] = {0, 120, 1};
  for (uint32_t dst : {0u, 3u * 1024u, 5u * 128u})
    for (const auto* c : {&in_bounds, &cols_past_end, &negative, &rows_past_end}) {
      check_tma_box_8bit<128>(*c, dst);
      check_tma_box_8bit<64>(*c, dst);
      check_tma_box_8bit<256, 64>(*c, dst);  // a V^T tile of head_dim 256 x 64 keys, 64-byte swizzle
    }
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

}  // namespace
