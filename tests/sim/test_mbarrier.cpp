// Hopper synchronisation on the sim (sim.h, "Hopper"): mbarrier phases and parities, TMA writes
// that land on them, warpgroup collectives, and what the racecheck makes of them (ordering through
// mbarriers, TMA writes in flight, wgmma reads in flight, fence.proxy.async). The kernels call the
// sim:: API directly, as primitives_hopper.cuh's twins do.
//
// Several kernels place an access in a known round of the schedule with __syncwarp: a warp's
// __syncwarp holds its lanes until all of them arrive, so what follows it runs in the next round,
// under any seed (and __syncwarp(1u) by lane 0 alone is a one-round delay that orders nothing).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "common/compat.h"
#include "sim_test_hopper.h"
#include "sim_test_launch.h"

namespace sim = selfattn::sim;
using namespace sim::testing::hopper;
using sim::testing::error_of;
using sim::testing::launch;
using sim::testing::ScopedOptions;

namespace {

// issue_tma_at_caller (sim_test_hopper.h) from the kernel's line, never as a tail call: the empty asm
// after it keeps a kernel that ends with it from jumping there (the return address would then be
// the sim's, not the kernel's). A macro, not a function: an inlined helper would be named in the
// report's site before the kernel's line.
#define issue_tma(bar, dst, src, bytes)          \
  do {                                           \
    issue_tma_at_caller(bar, dst, src, bytes);   \
    asm volatile("" ::: "memory");               \
  } while (0)

// A wgmma's shared-memory operand read, charged to `thread`, begun and performed at once or later.
__attribute__((noinline)) void async_read_begin(unsigned thread, const void* p, size_t bytes) {
  sim::racecheck_async_read_begin(thread, p, bytes, __builtin_return_address(0));
}

struct Params {
  const float* src;  // host memory
  float* out;        // host memory
  int tiles = 0;
};

std::vector<float> iota_floats(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = float(i) + 0.5f;
  return v;
}

// ---- the producer/consumer ring ----------------------------------------------------------------------

constexpr int kStages = 2;
constexpr size_t kStageOffset = 256;  // the barriers lie below it
constexpr unsigned kTileFloats = 32;

// Thread 0 fills a ring of two 128-byte stages by TMA; warp 1 (threads 32..63) consumes each tile
// (lane l reads float l) and releases the stage through empty[s]. The racy producer does not wait
// on empty[s] before a refill: it waits for its previous fill of the stage to land and gives the
// consumers three rounds, enough for them to have read it, but nothing orders their reads before
// its TMA write. Threads 1..31 go straight to the final __syncthreads, where they wait while the
// others wait on mbarriers.
template <bool ProducerWaitsEmpty>
__global__ void ring(const Params p) {
  uint64_t* full = barrier_at(0);
  uint64_t* empty = barrier_at(8 * kStages);
  float* stage = reinterpret_cast<float*>(smem() + kStageOffset);
  const unsigned t = threadIdx.x;
  if (t == 0) {
    for (int s = 0; s < kStages; ++s) {
      init_barrier(&full[s], 1);
      init_barrier(&empty[s], 32);
    }
  }
  __syncthreads();
  if (t == 0) {
    for (int tile = 0; tile < p.tiles; ++tile) {
      const int s = tile % kStages, round = tile / kStages;
      if (ProducerWaitsEmpty) {
        sim::mbarrier_wait_parity(&empty[s], (round & 1) ^ 1);  // round 0 passes at once
      } else if (round > 0) {
        sim::mbarrier_wait_parity(&full[s], (round - 1) & 1);
        for (int i = 0; i < 3; ++i) __syncwarp(1u);
      }
      sim::mbarrier_arrive_expect_tx(&full[s], kTileFloats * sizeof(float));
      issue_tma(&full[s], stage + kTileFloats * s, p.src + kTileFloats * tile, kTileFloats * sizeof(float));
    }
  } else if (t >= 32) {
    const unsigned lane = t - 32;
    for (int tile = 0; tile < p.tiles; ++tile) {
      const int s = tile % kStages, round = tile / kStages;
      sim::mbarrier_wait_parity(&full[s], round & 1);
      p.out[tile * kTileFloats + lane] = stage[kTileFloats * s + lane];
      sim::mbarrier_arrive(&empty[s]);
    }
  }
  __syncthreads();
}

TEST(SimMbarrier, ProducerConsumerRingDeliversEveryTile) {
  constexpr int tiles = 7;  // 4 rounds of the 2 stages, the last one half
  const std::vector<float> src = iota_floats(tiles * kTileFloats);
  for (uint64_t seed : {1, 2, 3}) {
    ScopedOptions with(sim::testing::with_seed(seed));
    std::vector<float> out(src.size(), -1.0f);
    EXPECT_EQ(error_of([&] {
                launch<Params, ring<true>>("ring", dim3(2), dim3(64), {src.data(), out.data(), tiles},
                                           kStageOffset + kStages * kTileFloats * sizeof(float));
              }),
              "")
        << "seed " << seed;
    EXPECT_EQ(out, src) << "seed " << seed;
  }
}

TEST(SimMbarrier, RefillWithoutWaitingOnEmptyIsAHazard) {
  SKIP_UNLESS_RACECHECKED();
  const std::vector<float> src = iota_floats(4 * kTileFloats);
  std::vector<float> out(src.size());
  const std::string e = error_of([&] {
    launch<Params, ring<false>>("ring_racy", dim3(1), dim3(64), {src.data(), out.data(), 4},
                                kStageOffset + kStages * kTileFloats * sizeof(float));
  });
  EXPECT_CONTAINS(e, "shared-memory hazard (write after read) in kernel 'ring_racy', block (0,0,0), at shared byte "
                     "offset " + std::to_string(kStageOffset));
  EXPECT_CONTAINS(e, "TMA write by thread (0,0,0) at test_mbarrier.cpp:");
  EXPECT_CONTAINS(e, "is unordered with the earlier read by thread (32,0,0)");
  EXPECT_CONTAINS(e, "mbarrier arrive -> wait");
}

// ---- reading TMA bytes without waiting -----------------------------------------------------------------

enum class Reader { waits, reads_after_another_threads_wait, reads_in_flight };

// Thread 0 issues a 64-byte TMA write in round 1. Thread 64 waits on the barrier in round 2 (only
// the transaction is outstanding: the write lands then). Thread 32 reads in round 3, having waited
// or not; or, in round 2, with no wait anywhere (the write still in flight).
template <Reader R>
__global__ void read_tma_bytes(const Params p) {
  uint64_t* bar = barrier_at(0);
  float* data = reinterpret_cast<float*>(smem() + 128);
  const unsigned t = threadIdx.x;
  if (t == 0) init_barrier(bar, 1);
  __syncthreads();
  if (t == 0) {
    sim::mbarrier_arrive_expect_tx(bar, 64);
    issue_tma(bar, data, p.src, 64);
  }
  if (t >= 64 && R != Reader::reads_in_flight) {
    __syncwarp();
    if (t == 64) sim::mbarrier_wait_parity(bar, 0);
  }
  if (t >= 32 && t < 64) {
    __syncwarp();
    if (R != Reader::reads_in_flight) __syncwarp();
    if (R == Reader::waits) sim::mbarrier_wait_parity(bar, 0);
    if (t == 32) p.out[0] = data[1];
  }
}

template <Reader R>
std::string run_read_tma_bytes(const char* name, std::vector<float>& out) {
  const std::vector<float> src = iota_floats(16);
  return error_of([&] { launch<Params, read_tma_bytes<R>>(name, dim3(1), dim3(96), {src.data(), out.data()}, 256); });
}

TEST(SimMbarrier, ConsumerReadsTmaBytesOnlyAfterItsOwnWait) {
  std::vector<float> out(1, -1.0f);
  EXPECT_EQ(run_read_tma_bytes<Reader::waits>("waits", out), "");
  EXPECT_EQ(out[0], 1.5f);
}

TEST(SimMbarrier, ReadingTmaBytesWithoutWaitingIsAHazard) {
  SKIP_UNLESS_RACECHECKED();
  std::vector<float> out(1);
  std::string e = run_read_tma_bytes<Reader::reads_after_another_threads_wait>("no_wait", out);
  EXPECT_CONTAINS(e, "shared-memory hazard (read after write) in kernel 'no_wait', block (0,0,0), at shared byte "
                     "offset 132: read by thread (32,0,0) at test_mbarrier.cpp:");
  EXPECT_CONTAINS(e, "is unordered with the earlier TMA write (landed, counted by the mbarrier at shared offset 0) "
                     "issued at test_mbarrier.cpp:");

  e = run_read_tma_bytes<Reader::reads_in_flight>("in_flight", out);
  EXPECT_CONTAINS(e, "shared-memory hazard (TMA write in flight) in kernel 'in_flight'");
  EXPECT_CONTAINS(e, "read by thread (32,0,0)");
  EXPECT_CONTAINS(e, "touches bytes of a TMA write by thread (0,0,0) at test_mbarrier.cpp:");
  EXPECT_CONTAINS(e, "still in flight");
}

// ---- a TMA write landed with no thread acquiring its phase ------------------------------------------

// Thread 64 waits on `second` in round 1, before its one arrival. Thread 0 issues TMA write A on
// `first`, whose phase nobody waits for, and in round 3 arrives on `second` with TMA write B. Then
// every thread is blocked (64 parked on `second`, the rest at the __syncthreads), so the sim lands
// both writes; B completes `second`'s phase, which 64 acquires. After the __syncthreads thread 32
// reads a float of B (ordered: 64 acquired it before the barrier) or of A (ordered by nothing: on
// a GPU the barrier does not wait for A, which may not have landed).
template <bool ReadsA>
__global__ void read_after_a_stall_landed(const Params p) {
  uint64_t* first = barrier_at(0);
  uint64_t* second = barrier_at(8);
  float* a = reinterpret_cast<float*>(smem() + 128);
  float* b = reinterpret_cast<float*>(smem() + 256);
  const unsigned t = threadIdx.x;
  if (t == 0) {
    init_barrier(first, 1);
    init_barrier(second, 1);
  }
  __syncthreads();
  if (t == 64) sim::mbarrier_wait_parity(second, 0);
  if (t == 0) {
    sim::mbarrier_arrive_expect_tx(first, 64);
    issue_tma(first, a, p.src, 64);
    __syncwarp(1u);
    __syncwarp(1u);
    sim::mbarrier_arrive_expect_tx(second, 64);
    issue_tma(second, b, p.src + 16, 64);
  }
  __syncthreads();
  if (t == 32) p.out[0] = ReadsA ? a[1] : b[1];
}

TEST(SimMbarrier, ABarrierDoesNotOrderATmaWriteNobodyWaitedFor) {
  SKIP_UNLESS_RACECHECKED();
  const std::vector<float> src = iota_floats(32);
  std::vector<float> out(1, -1.0f);
  const Params params{src.data(), out.data()};
  EXPECT_EQ(error_of([&] { launch<Params, read_after_a_stall_landed<false>>("acquired", dim3(1), dim3(96), params, 512); }),
            "");
  EXPECT_EQ(out[0], 17.5f);
  const std::string e =
      error_of([&] { launch<Params, read_after_a_stall_landed<true>>("not_acquired", dim3(1), dim3(96), params, 512); });
  EXPECT_CONTAINS(e, "shared-memory hazard (read after write) in kernel 'not_acquired', block (0,0,0), at shared byte "
                     "offset 132: read by thread (32,0,0)");
  EXPECT_CONTAINS(e, "is unordered with the earlier TMA write (landed, counted by the mbarrier at shared offset 0)");
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
                     "byte offset 64: generic-proxy write by thread (32,0,0) at test_mbarrier.cpp:");
  EXPECT_CONTAINS(e, "is read by wgmma (async proxy): wgmma read by thread (0,0,0) at test_mbarrier.cpp:");
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
                     "byte offset 8: write by thread (32,0,0) at test_mbarrier.cpp:");
  EXPECT_CONTAINS(e, "touches bytes that a wgmma read by thread (0,0,0) at test_mbarrier.cpp:");
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
  EXPECT_CONTAINS(e, "TMA write by thread (0,0,0) at test_mbarrier.cpp:");
  EXPECT_CONTAINS(e, "wgmma read by thread (32,0,0)");
}

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
