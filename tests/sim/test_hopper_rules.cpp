// Hopper rules the sim enforces because the GPU does, each with a kernel that breaks it (sim.h,
// "Hopper"; sim/README.md):
//   - the register pool: setmaxnreg moves registers inside what the launch gave the block. A
//     warpgroup holds the launch's count until its first setmaxnreg, a dec gives registers back at
//     once and an inc waits until the pool has room. An inc the pool can never satisfy hangs the GPU
//     (the first H200 run of the Hopper kernel did); the sim reports the deadlock, naming the wait.
//   - fence.mbarrier_init: the TMA unit (the async proxy) may use a barrier only after its
//     initialising thread has fenced the init.
#include <gtest/gtest.h>

#include <string>
#include <type_traits>

#include "common/compat.h"
#include "sim_test_hopper.h"
#include "sim_test_launch.h"

namespace sim = selfattn::sim;
using namespace sim::testing::hopper;
using sim::testing::error_of;
using sim::testing::launch;

namespace {

struct Params {
  const float* src;  // host memory
  int* order;        // host memory: [0] set when the producer's dec is done, [1] what a consumer saw after its inc
};

// ---- setmaxnreg against the block's register pool ---------------------------------------------------

enum class Producer { gives_back, never_asks };

// A producer warpgroup gives registers up (or never asks), two consumer warpgroups take `Consumer`
// each, in a block of 384 threads (168 registers each at launch: a pool of 64512), as
// flash_fwd_hopper.cuh does. The producer waits a few rounds first, so the consumers' incs come
// before its dec under every seed: they must wait for it, not fail and not pass early.
template <Producer P, unsigned Given, unsigned Consumer>
__global__ void move_registers(const Params p) {
  const unsigned t = threadIdx.x;
  if (t % 128 != 0) return;
  if (t == 0) {
    for (int round = 0; round < 4; ++round) __syncwarp(1u);  // a round of the schedule each
    if (P == Producer::gives_back) {
      p.order[0] = 1;
      sim::setmaxnreg(Given, /*increase=*/false);
    }
  } else {
    sim::setmaxnreg(Consumer, /*increase=*/true);
    p.order[1] = p.order[0];
  }
}

template <Producer P, unsigned Given, unsigned Consumer>
std::string run_registers(const char* name, int* order) {
  order[0] = order[1] = 0;
  return error_of(
      [&] { launch<Params, move_registers<P, Given, Consumer>>(name, dim3(1), dim3(384), {nullptr, order}, 0); });
}

TEST(SimHopperRules, SetmaxnregIncWaitsForTheDecThatMakesRoom) {
  int order[2];
  EXPECT_EQ((run_registers<Producer::gives_back, 24, 240>("fits", order)), "");  // 24 x 128 + 240 x 256 = 168 x 384
  EXPECT_EQ(order[1], 1) << "a consumer's setmaxnreg.inc 240 went on before the producer gave registers back";
}

TEST(SimHopperRules, SetmaxnregIncThePoolCanNeverHoldIsADeadlock) {
  int order[2];
  // 32 x 128 + 240 x 256 = 65536 > 64512: the second consumer's inc waits forever.
  const std::string e = run_registers<Producer::gives_back, 32, 240>("overflows", order);
  EXPECT_CONTAINS(e, "no thread can proceed");
  EXPECT_CONTAINS(e, "wait at setmaxnreg.inc 240 (warpgroup ");
  EXPECT_CONTAINS(e, "holds 168 registers per thread and needs 9216 more; the block's pool of 64512 (168 x 384 threads "
                     "at launch) has 8192 free");
  EXPECT_CONTAINS(e, "no setmaxnreg.dec will give it more");
}

TEST(SimHopperRules, AWarpgroupThatNeverAsksHoldsWhatTheLaunchGaveIt) {
  int order[2];
  // The producer keeps its 168: the consumers' incs find no room at all.
  const std::string e = run_registers<Producer::never_asks, 0, 240>("producer_keeps_its_registers", order);
  EXPECT_CONTAINS(e, "wait at setmaxnreg.inc 240");
  EXPECT_CONTAINS(e, "has 0 free, the warpgroups holding 168, 168, 168 per thread");
}

TEST(SimHopperRules, SetmaxnregMustMoveTheCountTheWayItSays) {
  int order[2];
  EXPECT_CONTAINS((run_registers<Producer::gives_back, 24, 160>("lowers", order)),
                  "setmaxnreg.inc 160 from the warpgroup's current 168 registers per thread");
}

// ---- fence.mbarrier_init before the TMA unit uses a barrier --------------------------------------------

enum class InitFence { by_initialiser, none, by_another_thread };

// Thread 0 initialises the barrier; after a __syncthreads, thread 0 has a TMA write land on it.
template <InitFence F>
__global__ void tma_on_a_fresh_barrier(const Params p) {
  uint64_t* bar = barrier_at(0);
  const unsigned t = threadIdx.x;
  if (t == 0) {
    sim::mbarrier_init(bar, 1);
    if (F == InitFence::by_initialiser) sim::fence_mbarrier_init();
  }
  if (t == 32 && F == InitFence::by_another_thread) sim::fence_mbarrier_init();
  __syncthreads();
  if (t == 0) {
    sim::mbarrier_arrive_expect_tx(bar, 64);
    issue_tma_at_caller(bar, smem() + 64, p.src, 64);
    sim::mbarrier_wait_parity(bar, 0);
  }
}

template <InitFence F>
std::string run_fresh_barrier(const char* name) {
  float src[16] = {};
  return error_of([&] { launch<Params, tma_on_a_fresh_barrier<F>>(name, dim3(1), dim3(64), {src, nullptr}, 256); });
}

TEST(SimHopperRules, TmaNeedsTheInitialisersFenceMbarrierInit) {
  EXPECT_EQ(run_fresh_barrier<InitFence::by_initialiser>("fenced"), "");
  const std::string e = run_fresh_barrier<InitFence::none>("unfenced");
  EXPECT_CONTAINS(e, "cp.async.bulk.tensor: its mbarrier at shared offset 0 was initialised by thread (0,0,0) with no "
                     "fence.mbarrier_init");
  EXPECT_CONTAINS(e, "the TMA unit (the async proxy) may not see the initialised barrier");
  EXPECT_CONTAINS((run_fresh_barrier<InitFence::by_another_thread>("fenced_elsewhere")), "with no fence.mbarrier_init");
}

}  // namespace
