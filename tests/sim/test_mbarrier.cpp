// The sim's mbarriers (sim.h, "Hopper"): phases and parities, the transaction bytes a phase waits
// for, when the TMA writes counted on them land, and the misuse the sim reports (of the barriers,
// of TMA writes, wgmma left pending at exit). What the racecheck orders through them is in
// test_tma_ordering.cpp and test_async_proxy.cpp, warpgroup collectives in
// test_warpgroup_collective.cpp. The kernels call the sim:: API directly, as primitives_hopper.cuh's
// twins do, and place accesses in rounds of the schedule with __syncwarp (sim_test_hopper.h).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/compat.h"
#include "sim_test_hopper.h"
#include "sim_test_launch.h"

namespace sim = selfattn::sim;
using namespace sim::testing::hopper;
using sim::testing::error_of;
using sim::testing::launch;

namespace {

// ---- phases and parities ------------------------------------------------------------------------------

// test_wait.parity on a barrier of two arrivals, recorded in out[]: before any arrival the phase
// "before" phase 0 (parity 1) counts as complete; each phase flips which parity is done.
__global__ void parities(const Params p) {
  if (threadIdx.x != 0) return;
  uint64_t* bar = barrier_at(0);
  init_barrier(bar, 2);
  int i = 0;
  p.out[i++] = sim::mbarrier_test_parity(bar, 1);
  p.out[i++] = sim::mbarrier_test_parity(bar, 0);
  sim::mbarrier_arrive(bar);
  p.out[i++] = sim::mbarrier_test_parity(bar, 0);
  sim::mbarrier_arrive(bar);  // phase 0 completes
  p.out[i++] = sim::mbarrier_test_parity(bar, 0);
  p.out[i++] = sim::mbarrier_test_parity(bar, 1);
  sim::mbarrier_expect_tx(bar, 16);  // phase 1 now waits for 16 bytes too
  sim::mbarrier_arrive(bar, 2);
  p.out[i++] = sim::mbarrier_test_parity(bar, 1);  // the bytes are missing
  issue_tma(bar, smem() + 16, p.src, 16);
  p.out[i++] = sim::mbarrier_test_parity(bar, 1);  // only they are outstanding: they land, phase 1 completes
  sim::mbarrier_wait_parity(bar, 1);  // returns at once
  p.out[i++] = *reinterpret_cast<float*>(smem() + 20);
}

TEST(SimMbarrier, TestParitySaysWhichPhaseCompleted) {
  const std::vector<float> src = iota_floats(4);
  std::vector<float> out(8, -1.0f);
  EXPECT_EQ(error_of([&] { launch<Params, parities>("parities", dim3(1), dim3(32), {src.data(), out.data()}, 64); }),
            "");
  EXPECT_EQ(out, (std::vector<float>{1, 0, 0, 1, 0, 0, 1, src[1]}));
}

// A TMA write issued before its expect-tx arrival, and two threads that wait while an arrival is
// still missing: nothing lands at their waits (arrivals are outstanding). The last arrival leaves
// only the transaction outstanding, and no one tests the barrier again: when every thread is
// blocked or gone, the write lands and completes the phase, releasing both.
__global__ void lands_when_stalled(const Params p) {
  uint64_t* bar = barrier_at(0);
  float* data = reinterpret_cast<float*>(smem() + 64);
  const unsigned t = threadIdx.x;
  if (t == 0) init_barrier(bar, 2);
  __syncthreads();
  if (t == 0) {
    issue_tma(bar, data, p.src, 64);
    sim::mbarrier_arrive(bar);
    __syncwarp(1u);
    sim::mbarrier_wait_parity(bar, 0);  // blocks: one arrival still missing
    p.out[1] = data[3];
  }
  if (t == 32) {
    __syncwarp(1u);
    __syncwarp(1u);
    sim::mbarrier_wait_parity(bar, 0);  // blocks; both waiters stall the block: the write lands
  }
  if (t == 33) {
    for (int i = 0; i < 4; ++i) __syncwarp(2u);
    sim::mbarrier_expect_tx(bar, 64);
    sim::mbarrier_arrive(bar);  // completes phase 0 if the write landed
  }
}

TEST(SimMbarrier, TmaWritesLandWhenNothingElseCanRun) {
  const std::vector<float> src = iota_floats(16);
  std::vector<float> out(2, -1.0f);
  EXPECT_EQ(error_of([&] {
              launch<Params, lands_when_stalled>("stalled", dim3(1), dim3(64), {src.data(), out.data()}, 128);
            }),
            "");
  EXPECT_EQ(out[1], src[3]);
}

// ---- misuse ------------------------------------------------------------------------------------------

enum class Misuse {
  reinit_with_arrivals,
  uninitialised,
  uninitialised_beside_a_live_one,
  too_many_arrivals,
  zero_count,
  misaligned,
  phase_skipped,
  deadlock,
  tma_in_flight_at_exit,
  tma_misaligned,
  tma_outside,
  wgmma_pending_at_exit,
};

template <Misuse M>
__global__ void misuse(const Params p) {
  uint64_t* bar = barrier_at(0);
  const unsigned t = threadIdx.x;
  if (t == 0) {
    switch (M) {
      case Misuse::reinit_with_arrivals:
        init_barrier(bar, 2);
        sim::mbarrier_arrive(bar);
        init_barrier(bar, 2);
        break;
      case Misuse::uninitialised: sim::mbarrier_arrive(bar); break;
      case Misuse::uninitialised_beside_a_live_one:
        init_barrier(bar, 1);
        sim::mbarrier_wait_parity(barrier_at(8), 0);
        break;
      case Misuse::too_many_arrivals:
        init_barrier(bar, 1);
        sim::mbarrier_arrive(bar, 2);
        break;
      case Misuse::zero_count: init_barrier(bar, 0); break;
      case Misuse::misaligned: init_barrier(smem() + 4, 1); break;
      case Misuse::phase_skipped:
      case Misuse::deadlock: init_barrier(bar, 1); break;
      case Misuse::tma_in_flight_at_exit:
        init_barrier(bar, 1);
        sim::mbarrier_arrive_expect_tx(bar, 64);
        issue_tma(bar, smem() + 64, p.src, 64);
        break;
      case Misuse::tma_misaligned:
        init_barrier(bar, 1);
        issue_tma(bar, smem() + 40, p.src, 64);
        break;
      case Misuse::tma_outside:
        init_barrier(bar, 1);
        issue_tma(bar, smem() + 128, p.src, 64);
        break;
      case Misuse::wgmma_pending_at_exit: sim::current_thread().wgmma_open.push_back(std::make_shared<int>(1)); break;
    }
  }
  __syncthreads();
  if (M == Misuse::phase_skipped) {
    if (t == 0) {
      sim::mbarrier_arrive(bar);
      sim::mbarrier_arrive(bar);  // phases 0 and 1 complete
    }
    __syncthreads();
    if (t == 32) sim::mbarrier_wait_parity(bar, 0);  // phase 2 is current: parity 0 means phase 0 or 2
  }
  if (M == Misuse::deadlock && t == 32) sim::mbarrier_wait_parity(bar, 0);  // no thread ever arrives
}

template <Misuse M>
std::string run_misuse(const char* name) {
  const std::vector<float> src = iota_floats(16);
  return error_of([&] { launch<Params, misuse<M>>(name, dim3(1), dim3(64), {src.data(), nullptr}, 128); });
}

TEST(SimMbarrier, MisuseIsReported) {
  std::string e = run_misuse<Misuse::reinit_with_arrivals>("reinit");
  EXPECT_CONTAINS(e, "sim: kernel 'reinit', block (0,0,0), thread (0,0,0): mbarrier.init on the mbarrier at shared "
                     "offset 0: re-initialised while its current phase is in progress");
  EXPECT_CONTAINS(e, "phase 0 has 1 of 2 arrivals");

  e = run_misuse<Misuse::uninitialised>("uninit");
  EXPECT_CONTAINS(e, "thread (0,0,0): mbarrier.arrive on the mbarrier at shared offset 0: no initialised mbarrier");
  e = run_misuse<Misuse::uninitialised_beside_a_live_one>("uninit_beside");
  EXPECT_CONTAINS(e, "mbarrier.try_wait.parity on the mbarrier at shared offset 8: no initialised mbarrier");

  e = run_misuse<Misuse::too_many_arrivals>("too_many");
  EXPECT_CONTAINS(e, "mbarrier.arrive on the mbarrier at shared offset 0: 2 arrival(s) when the current phase has 1 "
                     "pending");

  e = run_misuse<Misuse::zero_count>("zero");
  EXPECT_CONTAINS(e, "mbarrier.init on the mbarrier at shared offset 0: arrival count 0");
  e = run_misuse<Misuse::misaligned>("misaligned");
  EXPECT_CONTAINS(e, "thread (0,0,0): mbarrier.init at address");
  EXPECT_CONTAINS(e, "8-byte aligned offset of the block's dynamic shared memory (128 bytes)");

  e = run_misuse<Misuse::phase_skipped>("skipped");
  EXPECT_CONTAINS(e, "thread (32,0,0): mbarrier.try_wait.parity on the mbarrier at shared offset 0: the barrier has "
                     "completed 2 phases since this thread last observed it");
  EXPECT_CONTAINS(e, "no longer says which phase it means");

  e = run_misuse<Misuse::deadlock>("deadlock");
  EXPECT_CONTAINS(e, "sim: divergent barrier in kernel 'deadlock', block (0,0,0): no thread can proceed");
  EXPECT_CONTAINS(e, "threads (0,0,0)..(31,0,0) exited; thread (32,0,0) wait at mbarrier (offset 0, parity 0): its "
                     "phase 0 has 1 of 1 arrivals and 0 transaction bytes outstanding; threads (33,0,0)..(63,0,0) "
                     "exited");

  e = run_misuse<Misuse::tma_in_flight_at_exit>("tma_at_exit");
  EXPECT_CONTAINS(e, "sim: kernel 'tma_at_exit', block (0,0,0) ended with 1 TMA write(s) in flight: thread (0,0,0) "
                     "issued one at ");
  EXPECT_CONTAINS(e, "(64 bytes to shared offset 64, counted by the mbarrier at shared offset 0)");
  e = run_misuse<Misuse::tma_misaligned>("tma_misaligned");
  EXPECT_CONTAINS(e, "cp.async.bulk.tensor: destination offset 40 and size 64 must be non-zero multiples of 16 bytes");
  e = run_misuse<Misuse::tma_outside>("tma_outside");
  EXPECT_CONTAINS(e, "cp.async.bulk.tensor: destination [128, 192) is not inside the block's dynamic shared memory");

  e = run_misuse<Misuse::wgmma_pending_at_exit>("wgmma_at_exit");
  EXPECT_CONTAINS(e, "sim: kernel 'wgmma_at_exit', block (0,0,0), thread (0,0,0) exited with wgmma operations not "
                     "waited for (wgmma.wait_group)");
}

}  // namespace
