// The GPU twin of test_primitives_sim.cpp: the same test kernels, built by nvcc, through the cuda
// backend, checked by the same code. Skips (with the reason) where there is no usable GPU. What only
// the sim can promise (stale reads before a cp.async wait, misalignment reports) is not checked here.
#include <gtest/gtest.h>

#include "primitive_checks.h"
#include "selfattn/error.h"

namespace selfattn::primitive_tests {
namespace {

class PrimitivesGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    try {
      device = detail::make_cuda_device(0, nullptr);
    } catch (const NotAvailable& e) {
      GTEST_SKIP() << e.what();
    }
  }
  std::shared_ptr<Device> device;
};

TEST_F(PrimitivesGpu, MmaF16) { check_mma(*device, 16, false, 2, 1); }
TEST_F(PrimitivesGpu, MmaBf16) { check_mma(*device, 16, true, 2, 2); }
TEST_F(PrimitivesGpu, MmaK8BothTypes) {
  check_mma(*device, 8, false, 1, 3);
  check_mma(*device, 8, true, 3, 4);
}
TEST_F(PrimitivesGpu, LdmatrixX1X2X4) {
  for (int count : {1, 2, 4}) check_ldmatrix(*device, count, false);
}
TEST_F(PrimitivesGpu, LdmatrixTransX1X2X4) {
  for (int count : {1, 2, 4}) check_ldmatrix(*device, count, true);
}
TEST_F(PrimitivesGpu, CpAsyncLdmatrixMmaTile) {
  for (bool bf16 : {false, true})
    for (bool n_major : {false, true}) check_tile_gemm(*device, bf16, n_major, 10 + 2 * bf16 + n_major);
}
TEST_F(PrimitivesGpu, CpAsyncGroupsAndZeroFill) {
  check_cp_async_groups(*device, 32, false);
  check_cp_async_groups(*device, 7, false);
}
TEST_F(PrimitivesGpu, WarpReductionsAndShuffle) {
  check_reductions(*device, 32, 5, 1);
  check_reductions(*device, 96, 16, 2);
}
TEST_F(PrimitivesGpu, PackUnpack) { check_packing(*device, 113, 3); }

}  // namespace
}  // namespace selfattn::primitive_tests
