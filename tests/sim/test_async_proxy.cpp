// The async proxy under the racecheck (sim.h, "Hopper"): a wgmma read (async proxy) of a generic
// write needs the writer's fence.proxy.async and an ordering wait; a write into bytes that a wgmma
// read still has in flight is a hazard; a stage is released through its empty barrier only after
// its wgmma read is performed, or the refill's TMA write meets the read in flight. The kernels call
// the sim:: API directly, as primitives_hopper.cuh's twins do, and place accesses in rounds of the
// schedule with __syncwarp (sim_test_hopper.h).
#include <gtest/gtest.h>

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

// A wgmma's shared-memory operand read, charged to `thread`, begun and performed at once or later.
__attribute__((noinline)) void async_read_begin(unsigned thread, const void* p, size_t bytes) {
  sim::racecheck_async_read_begin(thread, p, bytes, __builtin_return_address(0));
}

// ---- the async proxy: fence.proxy.async, wgmma reads in flight -------------------------------------------

enum class Fence { none, after_write, before_write, after_write_but_no_wait };

// Thread 32 stores 64 bytes and arrives on the barrier; thread 0 waits on it and reads the bytes
// through the async proxy (a wgmma operand), charged to itself.
template <Fence F>
__global__ void generic_write_async_read(const Params) {
  uint64_t* bar = barrier_at(0);
  float* data = reinterpret_cast<float*>(smem() + 64);
  const unsigned t = threadIdx.x;
  if (t == 0) init_barrier(bar, 1);
  __syncthreads();
  if (t == 32) {
    if (F == Fence::before_write) sim::fence_proxy_async();
    for (int i = 0; i < 16; ++i) data[i] = float(i);
    if (F == Fence::after_write || F == Fence::after_write_but_no_wait) sim::fence_proxy_async();
    sim::mbarrier_arrive(bar);
  }
  if (t == 0) {
    if (F == Fence::after_write_but_no_wait) {
      __syncwarp(1u);  // after thread 32's round
    } else {
      sim::mbarrier_wait_parity(bar, 0);
    }
    async_read_begin(0, data, 64);
    sim::racecheck_async_read_end(0, data, 64);
  }
}

template <Fence F>
std::string run_fence(const char* name) {
  return error_of([&] { launch<Params, generic_write_async_read<F>>(name, dim3(1), dim3(64), {}, 128); });
}

TEST(SimMbarrier, AsyncReadOfAGenericWriteNeedsTheWritersFence) {
  SKIP_UNLESS_RACECHECKED();
  EXPECT_EQ(run_fence<Fence::after_write>("fenced"), "");
  std::string e = run_fence<Fence::none>("unfenced");
  EXPECT_CONTAINS(e, "shared-memory hazard (missing fence.proxy.async) in kernel 'unfenced', block (0,0,0), at shared "
                     "byte offset 64: generic-proxy write by thread (32,0,0) at test_async_proxy.cpp:");
  EXPECT_CONTAINS(e, "is read by wgmma (async proxy): wgmma read by thread (0,0,0) at test_async_proxy.cpp:");
  EXPECT_CONTAINS(e, "without fence.proxy.async");
  e = run_fence<Fence::before_write>("fenced_too_early");
  EXPECT_CONTAINS(e, "hazard (missing fence.proxy.async) in kernel 'fenced_too_early'");
  // Fenced, but nothing orders the read after the write.
  e = run_fence<Fence::after_write_but_no_wait>("fenced_unordered");
  EXPECT_CONTAINS(e, "hazard (read after write) in kernel 'fenced_unordered'");
  EXPECT_CONTAINS(e, "wgmma read by thread (0,0,0)");
  EXPECT_CONTAINS(e, "earlier write by thread (32,0,0)");
}

// Thread 0's async read of 64 bytes is in flight across two barriers; thread 32 stores into it
// between them (ordered after the begin, still a hazard), or after the read is performed.
template <bool WhileInFlight>
__global__ void write_during_async_read(const Params) {
  float* data = reinterpret_cast<float*>(smem());
  const unsigned t = threadIdx.x;
  if (t == 0) async_read_begin(0, data, 64);
  __syncthreads();
  if (WhileInFlight && t == 32) data[2] = 1.0f;
  __syncthreads();
  if (t == 0) sim::racecheck_async_read_end(0, data, 64);
  __syncthreads();
  if (!WhileInFlight && t == 32) data[2] = 1.0f;
}

TEST(SimMbarrier, WriteDuringAnAsyncReadIsAHazard) {
  SKIP_UNLESS_RACECHECKED();
  const std::string e =
      error_of([&] { launch<Params, write_during_async_read<true>>("in_flight_read", dim3(1), dim3(64), {}, 64); });
  EXPECT_CONTAINS(e, "shared-memory hazard (wgmma read in flight) in kernel 'in_flight_read', block (0,0,0), at shared "
                     "byte offset 8: write by thread (32,0,0) at test_async_proxy.cpp:");
  EXPECT_CONTAINS(e, "touches bytes that a wgmma read by thread (0,0,0) at test_async_proxy.cpp:");
  EXPECT_EQ(error_of([&] { launch<Params, write_during_async_read<false>>("performed", dim3(1), dim3(64), {}, 64); }),
            "");
}

// The consumer (thread 32) reads a TMA-filled buffer through the async proxy and hands it back on
// `empty`; the producer (thread 0) refills it once `empty` completes. Arriving before the read is
// performed lets the refill's TMA write meet the read in flight (the consumer dawdles two rounds
// before performing it, so the producer runs first under any seed).
template <bool ArriveBeforeReadEnds>
__global__ void async_read_then_refill(const Params p) {
  uint64_t* full = barrier_at(0);
  uint64_t* empty = barrier_at(8);
  float* data = reinterpret_cast<float*>(smem() + 128);
  const unsigned t = threadIdx.x;
  if (t == 0) {
    init_barrier(full, 1);
    init_barrier(empty, 1);
  }
  __syncthreads();
  if (t == 0) {
    sim::mbarrier_arrive_expect_tx(full, 64);
    issue_tma(full, data, p.src, 64);
    sim::mbarrier_wait_parity(empty, 0);
    sim::mbarrier_arrive_expect_tx(full, 64);
    issue_tma(full, data, p.src + 16, 64);
  }
  if (t == 32) {
    sim::mbarrier_wait_parity(full, 0);
    async_read_begin(32, data, 64);
    if (ArriveBeforeReadEnds) {
      sim::mbarrier_arrive(empty);
      __syncwarp(1u);
      __syncwarp(1u);
    }
    sim::racecheck_async_read_end(32, data, 64);
    if (!ArriveBeforeReadEnds) sim::mbarrier_arrive(empty);
    sim::mbarrier_wait_parity(full, 1);
    p.out[0] = data[0];
  }
}

TEST(SimMbarrier, AsyncReadsAreReleasedThroughTheEmptyBarrier) {
  const std::vector<float> src = iota_floats(32);
  std::vector<float> out(1, -1.0f);
  EXPECT_EQ(error_of([&] {
              launch<Params, async_read_then_refill<false>>("refill", dim3(1), dim3(64), {src.data(), out.data()}, 256);
            }),
            "");
  EXPECT_EQ(out[0], src[16]);
}

TEST(SimMbarrier, ReleasingAStageBeforeItsAsyncReadIsPerformedIsAHazard) {
  SKIP_UNLESS_RACECHECKED();
  const std::vector<float> src = iota_floats(32);
  std::vector<float> out(1);
  const std::string e = error_of([&] {
    launch<Params, async_read_then_refill<true>>("early_release", dim3(1), dim3(64), {src.data(), out.data()}, 256);
  });
  EXPECT_CONTAINS(e, "shared-memory hazard (wgmma read in flight) in kernel 'early_release'");
  EXPECT_CONTAINS(e, "TMA write by thread (0,0,0) at test_async_proxy.cpp:");
  EXPECT_CONTAINS(e, "wgmma read by thread (32,0,0)");
}

}  // namespace
