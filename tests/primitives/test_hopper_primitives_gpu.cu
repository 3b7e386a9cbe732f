// The GPU twin of test_hopper_primitives_sim.cpp: the same Hopper test kernels, built by nvcc for
// sm_90a only, through the cuda backend, checked by the same code. Skips (with the reason) without
// a usable GPU or on one whose compute capability is not 9.0 (sm_90a code runs there alone). What
// only the sim can promise (NaN accumulators before the wait, TMA read hazards) is not checked here.
// bench/device-check.sh runs this first, before any other GPU test or timing.
#include <gtest/gtest.h>

#include "hopper_checks.h"
#include "selfattn/error.h"

namespace selfattn::primitive_tests {
namespace {

class HopperPrimitivesGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    try {
      device = detail::make_cuda_device(0, nullptr);
    } catch (const NotAvailable& e) {
      GTEST_SKIP() << e.what();
    }
    const int cc = device->compute_capability();
    if (cc != 90)
      GTEST_SKIP() << "compute capability " << cc / 10 << "." << cc % 10 << " (" << device->name()
                   << "): the sm_90a kernels run on 9.0 only";
  }
  std::shared_ptr<Device> device;
};

TEST_F(HopperPrimitivesGpu, TmaSwizzledTilesOutOfBoundsAndNegativeCoordinates) { check_tma_tiles(*device, 1); }

TEST_F(HopperPrimitivesGpu, WgmmaSsAgainstMmaSyncF16) {
  for (int shape = 0; shape < 3; ++shape) check_wgmma_ss(*device, false, shape, 20 + shape);
}
TEST_F(HopperPrimitivesGpu, WgmmaSsAgainstMmaSyncBf16) {
  for (int shape = 0; shape < 3; ++shape) check_wgmma_ss(*device, true, shape, 30 + shape);
}
TEST_F(HopperPrimitivesGpu, WgmmaRsMnMajorAgainstMmaSyncF16) {
  for (int shape = 0; shape < 3; ++shape) check_wgmma_rs(*device, false, shape, 40 + shape);
}
TEST_F(HopperPrimitivesGpu, WgmmaRsMnMajorAgainstMmaSyncBf16) {
  for (int shape = 0; shape < 3; ++shape) check_wgmma_rs(*device, true, shape, 50 + shape);
}

TEST_F(HopperPrimitivesGpu, MbarrierRingParityFlips) {
  check_mbarrier_ring(*device, 7, 60);
  check_mbarrier_ring(*device, 2, 61);
}

}  // namespace
}  // namespace selfattn::primitive_tests
