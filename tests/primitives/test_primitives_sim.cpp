// Each device primitive inside a real kernel on the sim, against plain host maths
// (checks in primitive_checks.h; kernels in primitive_test_kernels.cuh, built here for the sim).
#include <string>

#include <gtest/gtest.h>

#include "primitive_checks.h"
#include "selfattn/error.h"
#include "tests/sim/sim_test_launch.h"

namespace selfattn::primitive_tests {
namespace {

class PrimitivesSim : public ::testing::Test {
 protected:
  std::shared_ptr<Device> device = detail::make_sim_device();
};

TEST_F(PrimitivesSim, MmaF16) { check_mma(*device, 16, false, 2, 1); }
TEST_F(PrimitivesSim, MmaBf16) { check_mma(*device, 16, true, 2, 2); }
TEST_F(PrimitivesSim, MmaK8BothTypes) {
  check_mma(*device, 8, false, 1, 3);
  check_mma(*device, 8, true, 3, 4);
}

TEST_F(PrimitivesSim, LdmatrixX1X2X4) {
  for (int count : {1, 2, 4}) check_ldmatrix(*device, count, false);
}
TEST_F(PrimitivesSim, LdmatrixTransX1X2X4) {
  for (int count : {1, 2, 4}) check_ldmatrix(*device, count, true);
}

TEST_F(PrimitivesSim, CpAsyncLdmatrixMmaTile) {
  for (bool bf16 : {false, true})
    for (bool n_major : {false, true}) check_tile_gemm(*device, bf16, n_major, 10 + 2 * bf16 + n_major);
}

// Includes the missing wait: before each wait the thread's own destination is still NaN. Those
// reads are hazards, which the racecheck reports (next test): off here, to see what they read.
TEST_F(PrimitivesSim, CpAsyncGroupsZeroFillAndStaleReads) {
  sim::testing::ScopedOptions unchecked(sim::testing::without_racecheck());
  check_cp_async_groups(*device, 32, true);
  check_cp_async_groups(*device, 7, true);  // copies are per thread: no warp needed
}

TEST_F(PrimitivesSim, CpAsyncReadBeforeItsWaitIsAHazard) {
#if !defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "built without the racecheck's instrumentation";
#endif
  if (!sim::options().racecheck) GTEST_SKIP() << "racecheck off (SELFATTN_SIM_RACECHECK=0)";
  try {
    check_cp_async_groups(*device, 32, true);
    FAIL() << "a read of a cp.async destination before its wait was not reported";
  } catch (const BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("shared-memory hazard (cp.async in flight) in kernel 'cp_async_kernel'"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(PrimitivesSim, MisalignedCpAsyncIsReported) {
  DeviceArray<float> source(*device, 16, "source");
  const kt::MisalignedParams params{source.get(), 0};
  try {
    device->launch(kt::kernels().misaligned, one_block(32, 256), &params);
    FAIL() << "a misaligned cp.async destination was not reported";
  } catch (const BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("cp.async.cg: destination is not aligned"), std::string::npos) << e.what();
  }
}

TEST_F(PrimitivesSim, MisalignedLdmatrixIsReported) {
  const kt::MisalignedParams params{nullptr, 1};
  try {
    device->launch(kt::kernels().misaligned, one_block(32, 256), &params);
    FAIL() << "a misaligned ldmatrix row was not reported";
  } catch (const BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("ldmatrix: row address is not 16-byte aligned"), std::string::npos) << e.what();
  }
}

// mma.sync.aligned needs all 32 lanes; a 16-thread block has half a warp, which the sim reports.
TEST_F(PrimitivesSim, MmaOnAPartialWarpIsReported) {
  DeviceArray<uint16_t> a(*device, 256, "a"), b(*device, 128, "b");
  DeviceArray<float> c(*device, 128, "c"), d(*device, 128, "d");
  a.poison(), b.poison(), c.poison();
  const kt::MmaParams params{a.get(), b.get(), c.get(), d.get(), 16, false};
  try {
    device->launch(kt::kernels().mma, one_block(16), &params);
    FAIL() << "an mma on half a warp was not reported";
  } catch (const BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("mma.m16n8k16: needs all 32 lanes"), std::string::npos) << e.what();
  }
}

TEST_F(PrimitivesSim, WarpReductionsAndShuffle) {
  check_reductions(*device, 32, 5, 1);
  check_reductions(*device, 96, 16, 2);
}

TEST_F(PrimitivesSim, PackUnpack) { check_packing(*device, 113, 3); }

}  // namespace
}  // namespace selfattn::primitive_tests
