// Warpgroup collectives on the sim (sim.h, "Hopper": sim::warpgroup_collective, which wgmma's
// warpgroup-wide steps are built on): a collective combines its own warpgroup's 128 threads, in
// order; a block must have whole warpgroups; a thread that exits instead of joining is a divergence.
// (Suite SimMbarrier: these tests were part of test_mbarrier.cpp.)
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/compat.h"
#include "sim_test_launch.h"

namespace sim = selfattn::sim;
using sim::testing::error_of;
using sim::testing::launch;

namespace {

// ---- warpgroup collectives ------------------------------------------------------------------------------

struct GroupParams {
  unsigned* out;  // per thread: what its warpgroup's combine gave it
  unsigned early_exit = ~0u;  // this thread skips the collective
};

__global__ void warpgroup_sum(const GroupParams p) {
  const unsigned t = threadIdx.x;
  if (t == p.early_exit) return;
  unsigned sum = 0;
  sim::warpgroup_collective(t, sum, [](const unsigned* const* ins, unsigned* const* outs) SELFATTN_SIM_UNCHECKED {
    unsigned total = 0;
    bool in_order = true;
    for (unsigned i = 0; i < 128; ++i) {
      in_order = in_order && *ins[i] % 128 == i;
      total += *ins[i];
    }
    for (unsigned i = 0; i < 128; ++i) *outs[i] = in_order ? total : ~0u;
  });
  p.out[t] = sum;
}

TEST(SimMbarrier, WarpgroupCollectiveCombinesItsOwn128Threads) {
  std::vector<unsigned> out(256, 0);
  EXPECT_EQ(error_of([&] { launch<GroupParams, warpgroup_sum>("groups", dim3(2), dim3(256), {out.data()}); }), "");
  for (unsigned t = 0; t < 256; ++t) {
    const unsigned g = t / 128;
    EXPECT_EQ(out[t], 128 * (128 * g) + 127 * 128 / 2) << "thread " << t;
  }
}

TEST(SimMbarrier, WarpgroupCollectiveNeedsWholeWarpgroups) {
  std::vector<unsigned> out(96, 0);
  const std::string e = error_of([&] { launch<GroupParams, warpgroup_sum>("partial", dim3(1), dim3(96), {out.data()}); });
  EXPECT_CONTAINS(e, "kernel 'partial', block (0,0,0), thread (");
  EXPECT_CONTAINS(e, "warpgroup collective in a block of 96 threads");
}

TEST(SimMbarrier, WarpgroupCollectiveWithAnExitedThreadIsADivergence) {
  std::vector<unsigned> out(128, 0);
  const std::string e =
      error_of([&] { launch<GroupParams, warpgroup_sum>("diverged", dim3(1), dim3(128), {out.data(), 5}); });
  EXPECT_CONTAINS(e, "divergent barrier in kernel 'diverged'");
  EXPECT_CONTAINS(e, "thread (5,0,0) exited");
  EXPECT_CONTAINS(e, "wait at a warpgroup collective (warpgroup 0, 127 of 128 threads arrived)");
}

}  // namespace
