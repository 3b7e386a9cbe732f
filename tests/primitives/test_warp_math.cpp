// The sim twins' warp arithmetic (kernels/common/primitives_sim.cuh), called directly on 32 lanes'
// worth of inputs, without fibers. Fragment layouts are re-derived here from the PTX ISA text
// (section "Matrix Fragments for mma.m16n8k16 with floating point type", and "ldmatrix"), not taken
// from primitives_fragments.cuh, so a wrong layout there fails here.
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "common/primitives_sim.cuh"

namespace {
namespace k = selfattn::kernels::sim_target;
namespace warp = k::sim_warp;
constexpr int kLanes = 32;

uint16_t to_bits(warp::Operand t, float x) {
  if (t == warp::Operand::f16) return __half_raw(__float2half_rn(x)).x;
  return __nv_bfloat16_raw(__float2bfloat16_rn(x)).x;
}
float from_bits(warp::Operand t, uint16_t bits) {
  return t == warp::Operand::f16 ? warp::f16_bits_to_float(bits) : warp::bf16_bits_to_float(bits);
}
uint32_t pair(uint16_t lo, uint16_t hi) { return uint32_t(lo) | uint32_t(hi) << 16; }

template <class In, class Out>
struct Lanes {  // 32 lanes' inputs and outputs, and the pointer arrays a warp collective hands over
  std::array<In, kLanes> in{};
  std::array<Out, kLanes> out{};
  std::array<const In*, kLanes> in_ptr{};
  std::array<Out*, kLanes> out_ptr{};
  Lanes() {
    for (int l = 0; l < kLanes; ++l) in_ptr[l] = &in[l], out_ptr[l] = &out[l];
  }
};

// D = A B + C through the sim's mma, with random A (16xK), B (Kx8), C in the operand type; every
// element compared with a double-precision product. `integers`: small whole numbers, where every
// partial sum is exact in f32, so the result must match exactly.
template <warp::Operand T, int K>
void check_mma(uint32_t seed, bool integers) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> real(-2.f, 2.f);
  std::uniform_int_distribution<int> whole(-8, 8);
  auto draw = [&] { return integers ? float(whole(rng)) : real(rng); };
  uint16_t a[16][K], b[K][8];
  float c[16][8];
  for (auto& row : a) for (auto& x : row) x = to_bits(T, draw());
  for (auto& row : b) for (auto& x : row) x = to_bits(T, draw());
  for (auto& row : c) for (auto& x : row) x = draw();

  Lanes<warp::MmaLaneIn<K>, warp::MmaLaneOut> lanes;
  for (int lane = 0; lane < kLanes; ++lane) {
    const int g = lane >> 2, t = lane % 4;  // groupID, threadID_in_group
    auto& in = lanes.in[lane];
    // A: register r holds (row g or g+8, cols 2t,2t+1), then +8 columns for registers 2,3 (K=16).
    in.a[0] = pair(a[g][2 * t], a[g][2 * t + 1]);
    in.a[1] = pair(a[g + 8][2 * t], a[g + 8][2 * t + 1]);
    if constexpr (K == 16) {
      in.a[2] = pair(a[g][2 * t + 8], a[g][2 * t + 9]);
      in.a[3] = pair(a[g + 8][2 * t + 8], a[g + 8][2 * t + 9]);
    }
    // B: register r holds rows 2t,2t+1 (+8 for r=1) of column g.
    in.b[0] = pair(b[2 * t][g], b[2 * t + 1][g]);
    if constexpr (K == 16) in.b[1] = pair(b[2 * t + 8][g], b[2 * t + 9][g]);
    // C: c0,c1 at row g, c2,c3 at row g+8; columns 2t, 2t+1.
    in.c[0] = c[g][2 * t], in.c[1] = c[g][2 * t + 1], in.c[2] = c[g + 8][2 * t], in.c[3] = c[g + 8][2 * t + 1];
  }
  warp::mma_m16n8<T, K>(lanes.in_ptr.data(), lanes.out_ptr.data());

  for (int lane = 0; lane < kLanes; ++lane) {
    const int g = lane >> 2, t = lane % 4;
    for (int i = 0; i < 4; ++i) {
      const int row = g + 8 * (i / 2), col = 2 * t + i % 2;
      double exact = c[row][col], magnitude = std::fabs(c[row][col]);
      for (int kk = 0; kk < K; ++kk) {
        const double p = double(from_bits(T, a[row][kk])) * from_bits(T, b[kk][col]);
        exact += p, magnitude += std::fabs(p);
      }
      const float got = lanes.out[lane].d[i];
      if (integers) {
        ASSERT_EQ(double(got), exact) << "lane " << lane << " d" << i;
      } else {
        // K+1 roundings of at most half an f32 ulp of the running magnitude each.
        ASSERT_NEAR(double(got), exact, (K + 1) * 0x1p-24 * magnitude) << "lane " << lane << " d" << i;
      }
    }
  }
}

TEST(WarpMath, MmaM16n8k16F16Random) { for (uint32_t s = 1; s <= 4; ++s) check_mma<warp::Operand::f16, 16>(s, false); }
TEST(WarpMath, MmaM16n8k16Bf16Random) { for (uint32_t s = 1; s <= 4; ++s) check_mma<warp::Operand::bf16, 16>(s, false); }
TEST(WarpMath, MmaM16n8k16ExactOnIntegers) {
  check_mma<warp::Operand::f16, 16>(7, true);
  check_mma<warp::Operand::bf16, 16>(8, true);
}
TEST(WarpMath, MmaM16n8k8BothTypes) {
  check_mma<warp::Operand::f16, 8>(9, false);
  check_mma<warp::Operand::bf16, 8>(10, false);
  check_mma<warp::Operand::f16, 8>(11, true);
}

TEST(WarpMath, MmaPropagatesNaN) {
  Lanes<warp::MmaLaneIn<16>, warp::MmaLaneOut> lanes;
  lanes.in[5].a[0] = pair(0x7e00, 0);  // a NaN at A(row 1, col 2)
  warp::mma_m16n8<warp::Operand::f16, 16>(lanes.in_ptr.data(), lanes.out_ptr.data());
  // Row 1 of D is held by lanes 4..7 in d0,d1: all NaN; row 0 (lanes 0..3) stays 0.
  for (int lane = 4; lane < 8; ++lane) EXPECT_TRUE(std::isnan(lanes.out[lane].d[0]) && std::isnan(lanes.out[lane].d[1]));
  for (int lane = 0; lane < 4; ++lane) EXPECT_EQ(lanes.out[lane].d[0], 0.f);
}

// Four 8x8 matrices with distinct elements, rows scattered in memory (stride 24 elements, matrices
// interleaved), so a mix-up of lanes, rows or matrices changes the result.
template <int Count, bool Transposed>
void check_ldmatrix() {
  constexpr int kStride = 24;
  alignas(16) uint16_t memory[4 * 8 * kStride];
  auto element = [](int m, int r, int c) { return uint16_t(1000 * (m + 1) + 10 * r + c); };
  auto row_start = [](int m, int r) { return (r * 4 + (3 - m)) * kStride; };  // 48-byte rows: aligned
  std::fill(std::begin(memory), std::end(memory), uint16_t(0xffff));
  for (int m = 0; m < 4; ++m)
    for (int r = 0; r < 8; ++r)
      for (int c = 0; c < 8; ++c) memory[row_start(m, r) + c] = element(m, r, c);

  alignas(16) static const uint16_t unused_row[8] = {0xffff, 0xffff, 0xffff, 0xffff, 0xffff, 0xffff, 0xffff, 0xffff};
  Lanes<warp::RowAddress, warp::LdmatrixRegs<Count>> lanes;
  for (int lane = 0; lane < kLanes; ++lane)  // lanes past 8*Count point at a row no result may contain
    lanes.in[lane].row = lane < 8 * Count ? static_cast<const void*>(&memory[row_start(lane / 8, lane % 8)]) : unused_row;
  warp::ldmatrix<Count, Transposed>(lanes.in_ptr.data(), lanes.out_ptr.data());

  for (int lane = 0; lane < kLanes; ++lane)
    for (int m = 0; m < Count; ++m) {
      // Non-transposed: row lane/4, columns 2(lane%4)+{0,1}; transposed: the stored matrix's
      // rows 2(lane%4)+{0,1} of column lane/4.
      const int r0 = Transposed ? 2 * (lane % 4) : lane / 4, c0 = Transposed ? lane / 4 : 2 * (lane % 4);
      const uint16_t lo = element(m, r0, c0);
      const uint16_t hi = Transposed ? element(m, r0 + 1, c0) : element(m, r0, c0 + 1);
      ASSERT_EQ(lanes.out[lane].r[m], pair(lo, hi)) << "lane " << lane << " matrix " << m;
    }
}

TEST(WarpMath, LdmatrixX1) { check_ldmatrix<1, false>(); }
TEST(WarpMath, LdmatrixX2) { check_ldmatrix<2, false>(); }
TEST(WarpMath, LdmatrixX4) { check_ldmatrix<4, false>(); }
TEST(WarpMath, LdmatrixX1Trans) { check_ldmatrix<1, true>(); }
TEST(WarpMath, LdmatrixX2Trans) { check_ldmatrix<2, true>(); }
TEST(WarpMath, LdmatrixX4Trans) { check_ldmatrix<4, true>(); }

TEST(WarpMath, LdmatrixRowChecks) {
  alignas(16) unsigned char smem[256] = {};
  EXPECT_EQ(warp::ldmatrix_row_problem(smem + 32, smem, sizeof smem), "");
  EXPECT_NE(warp::ldmatrix_row_problem(smem + 8, smem, sizeof smem), "");    // misaligned
  EXPECT_NE(warp::ldmatrix_row_problem(smem + 256, smem, sizeof smem), "");  // past the end
  EXPECT_NE(warp::ldmatrix_row_problem(smem + 240, smem, 250), "");         // runs past the end
}

template <int Width>
void check_reductions(uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> real(-100.f, 100.f);
  Lanes<float, float> sums, maxes;
  for (int l = 0; l < kLanes; ++l) sums.in[l] = maxes.in[l] = real(rng);
  warp::butterfly_reduce<Width>(sums.in_ptr.data(), sums.out_ptr.data(), warp::sum_op);
  warp::butterfly_reduce<Width>(maxes.in_ptr.data(), maxes.out_ptr.data(), warp::max_op);
  for (int group = 0; group < kLanes / Width; ++group) {
    double sum = 0, magnitude = 0;
    float max = -std::numeric_limits<float>::infinity();
    for (int l = group * Width; l < (group + 1) * Width; ++l)
      sum += sums.in[l], magnitude += std::fabs(sums.in[l]), max = std::max(max, maxes.in[l]);
    for (int l = group * Width; l < (group + 1) * Width; ++l) {
      ASSERT_EQ(sums.out[l], sums.out[group * Width]) << "lanes of a group disagree, width " << Width;
      ASSERT_NEAR(sums.out[l], sum, Width * 0x1p-24 * magnitude) << "width " << Width << " lane " << l;
      ASSERT_EQ(maxes.out[l], max) << "width " << Width << " lane " << l;
    }
  }
}
TEST(WarpMath, ReduceWidths) {
  check_reductions<2>(1);
  check_reductions<4>(2);
  check_reductions<8>(3);
  check_reductions<16>(4);
  check_reductions<32>(5);
}

TEST(WarpMath, ReduceSumOrderIsTheButterfly) {
  // The width-4 butterfly adds lanes (0+2) and (1+3) first: (1e8 + 1) + (-1e8 + 1) = 1e8 - 1e8 = 0 in
  // f32 (each 1 is lost next to 1e8, whose ulp is 8), where left-to-right order would give 2.
  Lanes<float, float> lanes;
  const float pattern[4] = {1e8f, -1e8f, 1.f, 1.f};
  for (int l = 0; l < kLanes; ++l) lanes.in[l] = pattern[l % 4];
  warp::butterfly_reduce<4>(lanes.in_ptr.data(), lanes.out_ptr.data(), warp::sum_op);
  for (int l = 0; l < kLanes; ++l) EXPECT_EQ(lanes.out[l], 0.f);
}

TEST(WarpMath, ReduceMaxIgnoresNaNLikeFmaxf) {
  Lanes<float, float> lanes;
  for (int l = 0; l < kLanes; ++l) lanes.in[l] = float(l);
  lanes.in[3] = std::numeric_limits<float>::quiet_NaN();
  lanes.in[6] = -std::numeric_limits<float>::infinity();
  warp::butterfly_reduce<4>(lanes.in_ptr.data(), lanes.out_ptr.data(), warp::max_op);
  EXPECT_EQ(lanes.out[0], 2.f);  // lanes 0..3: 0, 1, 2, NaN
  EXPECT_EQ(lanes.out[4], 7.f);
}

TEST(WarpMath, ShuffleXor) {
  Lanes<int, int> lanes;
  for (int l = 0; l < kLanes; ++l) lanes.in[l] = 100 + l;
  for (int mask : {1, 2, 5, 16, 31}) {
    warp::shuffle_xor(lanes.in_ptr.data(), lanes.out_ptr.data(), mask);
    for (int l = 0; l < kLanes; ++l) ASSERT_EQ(lanes.out[l], 100 + (l ^ mask)) << "mask " << mask;
  }
}

TEST(WarpMath, CpAsyncChecks) {
  alignas(16) unsigned char smem[64] = {};
  alignas(16) unsigned char global[64] = {};
  EXPECT_EQ(warp::cp_async_problem(smem, global, 16, 16, smem, sizeof smem), "");
  EXPECT_EQ(warp::cp_async_problem(smem + 4, global + 4, 4, 0, smem, sizeof smem), "");
  EXPECT_NE(warp::cp_async_problem(smem + 8, global + 4, 8, 0, smem, sizeof smem), "");  // even unread
  EXPECT_NE(warp::cp_async_problem(smem + 8, global, 16, 16, smem, sizeof smem), "");     // dst misaligned
  EXPECT_NE(warp::cp_async_problem(smem, global + 8, 16, 16, smem, sizeof smem), "");     // src misaligned
  EXPECT_NE(warp::cp_async_problem(smem, global, 8, 9, smem, sizeof smem), "");           // src-size > cp-size
  EXPECT_NE(warp::cp_async_problem(smem, global, 12, 12, smem, sizeof smem), "");         // no such size
  EXPECT_NE(warp::cp_async_problem(smem + 64, global, 16, 16, smem, sizeof smem), "");    // outside smem
  EXPECT_NE(warp::cp_async_problem(global, smem, 16, 16, smem, sizeof smem), "");         // dst is global
}

TEST(WarpMath, CpAsyncGroupsCompleteOldestFirst) {
  float source[3] = {1, 2, 3}, dest[3] = {-1, -1, -1};
  std::vector<std::vector<selfattn::sim::AsyncCopy>> groups;
  for (int g = 0; g < 3; ++g) groups.push_back({{&dest[g], &source[g], 4, 0}});
  warp::complete_all_but_newest(groups, 2);
  EXPECT_EQ(dest[0], 1);
  EXPECT_EQ(dest[1], -1);
  EXPECT_EQ(dest[2], -1);
  EXPECT_EQ(groups.size(), 2u);
  warp::complete_all_but_newest(groups, 3);  // fewer pending than allowed: nothing to do
  EXPECT_EQ(dest[1], -1);
  warp::complete_all_but_newest(groups, 0);
  EXPECT_EQ(dest[1], 2);
  EXPECT_EQ(dest[2], 3);
  EXPECT_TRUE(groups.empty());
}

TEST(WarpMath, CpAsyncZeroFill) {
  alignas(16) unsigned char source[16], dest[16];
  for (int i = 0; i < 16; ++i) source[i] = uint8_t(i + 1), dest[i] = 0xAA;
  warp::perform({dest, source, 5, 11});
  for (int i = 0; i < 16; ++i) EXPECT_EQ(dest[i], i < 5 ? i + 1 : 0) << i;
}

}  // namespace
