// The Hopper primitives (kernels/common/primitives_hopper.cuh) inside real kernels on the sim, each
// next to mma.sync on the same data (checks in hopper_checks.h; kernels in hopper_test_kernels.cuh,
// built here for the sim). The GPU twin is test_hopper_primitives_gpu.cu.
#include <string>

#include <gtest/gtest.h>

#include "hopper_checks.h"
#include "selfattn/error.h"
#include "tests/sim/sim_test_launch.h"

namespace selfattn::primitive_tests {
namespace {

class HopperPrimitivesSim : public ::testing::Test {
 protected:
  std::shared_ptr<Device> device = detail::make_sim_device();
};

TEST_F(HopperPrimitivesSim, TmaSwizzledTilesOutOfBoundsAndNegativeCoordinates) { check_tma_tiles(*device, 1); }

TEST_F(HopperPrimitivesSim, WgmmaSsAgainstMmaSyncF16) {
  for (int shape = 0; shape < 3; ++shape) check_wgmma_ss(*device, false, shape, 20 + shape);
}
TEST_F(HopperPrimitivesSim, WgmmaSsAgainstMmaSyncBf16) {
  for (int shape = 0; shape < 3; ++shape) check_wgmma_ss(*device, true, shape, 30 + shape);
}
TEST_F(HopperPrimitivesSim, WgmmaRsMnMajorAgainstMmaSyncF16) {
  for (int shape = 0; shape < 3; ++shape) check_wgmma_rs(*device, false, shape, 40 + shape);
}
TEST_F(HopperPrimitivesSim, WgmmaRsMnMajorAgainstMmaSyncBf16) {
  for (int shape = 0; shape < 3; ++shape) check_wgmma_rs(*device, true, shape, 50 + shape);
}

TEST_F(HopperPrimitivesSim, MbarrierRingParityFlips) {
  check_mbarrier_ring(*device, 7, 60);  // stages go through 4 and 3 phases
  check_mbarrier_ring(*device, 2, 61);  // one phase each: the producer's first waits pass at once
}

// What only the sim promises: accumulators are NaN until the wait that covers their wgmma and the
// operand fence after it.
TEST_F(HopperPrimitivesSim, WgmmaAccumulatorsAreNaNBeforeTheWaitAndFence) { check_wgmma_accumulators_before_wait(*device, 70); }

// The registers an RS wgmma owns until its wait: changing its A fragment or writing its accumulator
// before the wait is reported (the hardware may read A, and writes D, at any time until then); so
// is a wgmma without the wgmma.fence that orders earlier register accesses before it.
TEST_F(HopperPrimitivesSim, WgmmaRegisterRulesAreReported) {
  EXPECT_EQ(wgmma_register_touch_report(*device, 0), "");
  const std::string a = wgmma_register_touch_report(*device, 1);
  EXPECT_NE(a.find("its A registers were changed before the wgmma.wait_group"), std::string::npos) << a;
  const std::string d = wgmma_register_touch_report(*device, 2);
  EXPECT_NE(d.find("its accumulator registers were written before the wgmma.wait_group"), std::string::npos) << d;
  const std::string fence = wgmma_register_touch_report(*device, 3);
  EXPECT_NE(fence.find("issued without a wgmma.fence since the last wgmma.wait_group"), std::string::npos) << fence;
}

TEST_F(HopperPrimitivesSim, TmaDestinationReadBeforeTheWaitIsAHazard) {
#if !defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "built without the racecheck's instrumentation";
#endif
  if (!sim::options().racecheck) GTEST_SKIP() << "racecheck off (SELFATTN_SIM_RACECHECK=0)";
  const std::string report = tma_read_before_wait_report(*device);
  ASSERT_NE(report, "") << "a read of a TMA destination before its barrier wait was not reported";
  EXPECT_NE(report.find("shared-memory hazard (TMA write in flight) in kernel 'tma_early_read_kernel'"), std::string::npos)
      << report;
}

}  // namespace
}  // namespace selfattn::primitive_tests
