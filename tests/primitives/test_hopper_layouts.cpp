// The sim's reading of Hopper's shared-memory layouts (kernels/common/primitives_hopper_sim.cuh)
// and the kernel's tile layouts and descriptors (kernels/hopper/smem_layout.h), checked against
// NVIDIA's CUTLASS/CuTe: the GMMA canonical layout atoms placed with tile_to_shape, descriptors
// from make_gmma_desc, the wgmma MMA_Traits' thread/value layouts, CuTe's swizzle functors and its
// mapping of them onto the TMA's swizzle modes. CuTe is the ground truth here only; nothing of it
// reaches the library.
// This program: wgmma operands and descriptors, wgmma fragments, swizzles and wgmma arithmetic (the
// TMA boxes and the kernel's tiles: test_hopper_layouts_tiles.cpp; the shared shim:
// hopper_layouts_cute.h).
#include "hopper_layouts_cute.h"

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

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

// ---- 8-bit (FP8) wgmma: K-major SW128 operands, fragments, arithmetic, P's permutation -----------
// A (MN = 64) or B (MN = N) operand of 128 e4m3 columns (four k32 steps) laid out by CuTe's
// Layout_K_SW128_Atom (8 rows x 128 elements) or Layout_K_SW64_Atom (8 x 64: the FP8 kernel's V^T
// tiles of 64 keys) for 1-byte elements; CuTe's descriptor of each (MN, 32) k-step, read through
// gmma_element_offset with 1-byte elements, must find each element where CuTe put it, and
// smem_layout.h's row_tile_offset_8bit / k_major_desc_8bit must be CuTe's placement and descriptor
// bit for bit.
template <int MN, int RowBytes = 128>
void check_operand_8bit(uint32_t base) {
  using T = cute::float_e4m3_t;
  constexpr int KW = 128;
  using Atom = std::conditional_t<RowBytes == 128, GMMA::Layout_K_SW128_Atom<T>, GMMA::Layout_K_SW64_Atom<T>>;
  auto layout = cute::tile_to_shape(Atom{}, Shape<Int<MN>, Int<KW>>{});
  auto tensor = cute::make_tensor(cute::make_smem_ptr(smem_at<T>(base)), layout);
  ASSERT_LE(base + uint32_t(cute::cosize(layout)), Smem::kBytes);
  std::memset(smem().bytes, 0, Smem::kBytes);
  // Distinct per (mn, kk) within one row and one column (bytes repeat across the tile; the offsets
  // are compared exactly, the bytes only as a check that nothing else was read).
  auto id = [](int mn, int kk) { return uint8_t(1 + (mn * 7 + kk) % 255); };
  for (int mn = 0; mn < MN; ++mn)
    for (int kk = 0; kk < KW; ++kk) {
      const uint8_t v = id(mn, kk);
      std::memcpy(&tensor(mn, kk), &v, 1);
      ASSERT_EQ(offset_of(&tensor(mn, kk)), base + k::row_tile_offset_8bit(MN, mn, kk, RowBytes)) << mn << "," << kk;
    }
  for (int ks = 0; ks < KW / 32; ++ks) {
    auto sub = cute::local_tile(tensor, Shape<Int<MN>, Int<32>>{}, cute::make_coord(0, ks));
    const uint64_t desc = GMMA::make_gmma_desc<GMMA::Major::K>(sub);
    expect_fields_match(desc);
    EXPECT_EQ(k::k_major_desc_8bit(base, MN, 0, 32 * ks, RowBytes), desc) << "k-step " << ks;
    int wrong = 0;
    for (int mn = 0; mn < MN; ++mn)
      for (int kk = 0; kk < 32; ++kk) {
        const uint32_t ours = hs::gmma_element_offset(desc, true, mn, kk, 1);
        const uint32_t cutes = offset_of(&sub(mn, kk));
        if ((ours != cutes || smem().bytes[ours] != id(mn, 32 * ks + kk)) && wrong++ < 4)
          ADD_FAILURE() << "element (" << mn << "," << kk << ") of k-step " << ks << ": ours at " << ours
                        << ", CuTe's at " << cutes;
      }
    EXPECT_EQ(wrong, 0) << "k-step " << ks << " of an MN=" << MN << " 8-bit operand";
  }
  // A descriptor for rows from row0 (the consumer warpgroup's 64 rows of a 128-row tile).
  if (MN == 128) {
    auto rows = cute::local_tile(tensor, Shape<_64, Int<32>>{}, cute::make_coord(1, 2));
    EXPECT_EQ(k::k_major_desc_8bit(base, MN, 64, 64, RowBytes), GMMA::make_gmma_desc<GMMA::Major::K>(rows));
  }
}

TEST(HopperLayouts, GmmaDescriptorsReadCuTe8BitKMajorSw128AndSw64) {
  for (uint32_t base : {0u, 5u * 1024u}) {
    SCOPED_TRACE("base " + std::to_string(base));
    check_operand_8bit<64>(base);
    check_operand_8bit<128>(base);
    check_operand_8bit<256>(base);
    check_operand_8bit<256, 64>(base);  // V^T of head_dim 256 in 64-key tiles
    check_operand_8bit<128, 64>(base);
  }
}

TEST(HopperLayouts, Wgmma8BitFragmentsAreCuTeLayouts) {
  using RS = cute::MMA_Traits<cute::SM90_64x128x32_F32E4M3E4M3_RS_TN<>>;
  using A = typename RS::ALayout;
  static_assert(decltype(cute::size<0>(A{}))::value == 128 && decltype(cute::size<1>(A{}))::value == 16);
  for (int t = 0; t < 128; ++t)
    for (int i = 0; i < 16; ++i) {
      const int index = int(A{}(t, i));
      const auto at = hs::wgmma_a8_coord(t, i);
      ASSERT_EQ(at.row, index % 64) << "thread " << t << " element " << i;
      ASSERT_EQ(at.col, index / 64) << "thread " << t << " element " << i;
    }
  check_accumulator_layout<cute::MMA_Traits<cute::SM90_64x128x32_F32E4M3E4M3_SS_TN<>>, 128>();
  check_accumulator_layout<cute::MMA_Traits<cute::SM90_64x256x32_F32E4M3E4M3_SS_TN<>>, 256>();
  check_accumulator_layout<RS, 128>();
}

// The FP8 kernel's P: register r of k32 step m, byte b, packed from S register
// fp8_p_score_index(m, r, b), must sit at A-column c whose key (by S's accumulator layout) is
// fp8_pv_key(c % 16) of c's 16-key half: the permutation the V^T pre-pass stores keys in.
TEST(HopperLayouts, Fp8ProbabilitiesPermuteKeysWithinEach16) {
  bool seen[16] = {};
  for (int c = 0; c < 16; ++c) seen[k::fp8_pv_key(c)] = true;
  for (bool b : seen) EXPECT_TRUE(b) << "fp8_pv_key is not a permutation of 0..15";
  for (int t = 0; t < 128; ++t)
    for (int step = 0; step < 4; ++step)  // 128 keys
      for (int reg = 0; reg < 4; ++reg)
        for (int byte = 0; byte < 4; ++byte) {
          const auto s_at = hs::wgmma_accumulator_coord(t, k::fp8_p_score_index(step, reg, byte));
          const auto a_at = hs::wgmma_a8_coord(t, 4 * reg + byte);
          ASSERT_EQ(s_at.row, a_at.row) << t << " " << reg << " " << byte;
          const int column = 32 * step + a_at.col;
          ASSERT_EQ(s_at.col, column / 16 * 16 + k::fp8_pv_key(column % 16)) << t << " " << reg << " " << byte;
        }
}

TEST(HopperLayouts, Wgmma8BitTileIsTheMatrixProduct) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> whole(-16, 16);
  for (int n : {128, 256})
    for (bool accumulate : {false, true}) {
      std::vector<float> a(64 * 32), b(size_t(32) * n), c(size_t(64) * n), d;
      for (float& x : a) x = float(whole(rng)) / 4;  // exact in e4m3 and every product exact
      for (float& x : b) x = float(whole(rng));
      for (float& x : c) x = float(whole(rng));
      d = c;
      hs::wgmma_tile<warp::Operand::e4m3>(n, a.data(), b.data(), d.data(), accumulate);
      for (int row = 0; row < 64; ++row)
        for (int col = 0; col < n; ++col) {
          double exact = accumulate ? c[size_t(row) * n + col] : 0.0;
          for (int kk = 0; kk < 32; ++kk) exact += double(a[row * 32 + kk]) * double(b[size_t(kk) * n + col]);
          ASSERT_EQ(d[size_t(row) * n + col], exact) << row << "," << col << " n " << n;
        }
    }
}

}  // namespace
