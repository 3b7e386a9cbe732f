// A kernel that relies on exp2f being exact, which passed with glibc's exp2f (what the sim computed
// before kernels/common/sim_math.h) and fails on the sim, as it may on a GPU: the sim's math moves
// each result within CUDA's documented bound, here exp2f's 2 ulp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "common/compat.h"
#include "sim_test_launch.h"

namespace sim = selfattn::sim;
using sim::testing::launch;

// The kernel lives in the library kernels' namespace, so that its unqualified call (exp2f(x))
// resolves exactly as the library's do.
SELFATTN_KERNELS_BEGIN
namespace sim_math_test {

// The planted violation: a kernel that takes a tile count from exp2f and truncates it to an int,
// relying on exp2f(k) being exactly 2^k. glibc's exp2f is; CUDA documents exp2f within 2 ulp, and
// 2^k one ulp low truncates to 2^k - 1.
struct TileCountParams {
  const int* log2_tiles;
  int* tiles;
  int n;
};

__global__ void tile_count_from_exp2(const TileCountParams p) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < p.n) p.tiles[i] = int(exp2f(float(p.log2_tiles[i])));
}

}  // namespace sim_math_test
SELFATTN_KERNELS_END

namespace {

namespace kt = selfattn::kernels::sim_target::sim_math_test;

// ---- the planted violation ----------------------------------------------------------------------

TEST(SimMath, AKernelThatNeedsExactExp2IsExposed) {
  // Up to 2^21: the floats within 2 ulp of 2^k are then 2^k + a fraction below 1 (a high result
  // truncates to 2^k) or 2^k - a fraction (a low one truncates to 2^k - 1).
  constexpr int kLargest = 21;
  std::vector<int> log2_tiles, tiles(kLargest + 1, -1);
  for (int k = 0; k <= kLargest; ++k) log2_tiles.push_back(k);
  const kt::TileCountParams params{log2_tiles.data(), tiles.data(), int(log2_tiles.size())};
  launch<kt::TileCountParams, kt::tile_count_from_exp2>("tile_count_from_exp2", dim3(1), dim3(32), params);

  int wrong = 0;
  for (int k = 0; k <= kLargest; ++k) {
    const int expected = 1 << k;
    ASSERT_EQ(int(::exp2f(float(k))), expected) << "glibc's exp2f, which the sim used before, is exact here";
    if (tiles[k] != expected) {
      if (++wrong <= 3) {
        std::printf("int(exp2f(%d.0f)) = %d on the sim (math seed %llu), %d with glibc\n", k, tiles[k],
                    (unsigned long long)sim::math::math_seed(), expected);
      }
      EXPECT_EQ(tiles[k], expected - 1) << "at most 2 ulp below 2^" << k;
    }
  }
  // exp2f(0) = 1 is exact by definition; for each other k two of the five draws (1 or 2 ulp low)
  // truncate: a seed that misses all 21 has probability 0.6^21, about 2e-5.
  EXPECT_GT(wrong, 0) << "the sim's exp2f returned 2^k exactly for every k: nothing exposes the kernel";
}

}  // namespace
