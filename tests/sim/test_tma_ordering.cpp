// TMA writes ordered through mbarriers, and what the racecheck makes of them (sim.h, "Hopper"): a
// producer/consumer ring delivers every tile, and refilling a stage without waiting on its empty
// barrier is a hazard; a consumer reads TMA bytes safely only after its own wait, and a read before
// the write lands meets it in flight; a TMA write whose phase nobody acquired is ordered by no
// barrier. The kernels call the sim:: API directly, as primitives_hopper.cuh's twins do, and place
// accesses in rounds of the schedule with __syncwarp (sim_test_hopper.h).
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
using sim::testing::ScopedOptions;

namespace {

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
  EXPECT_CONTAINS(e, "TMA write by thread (0,0,0) at test_tma_ordering.cpp:");
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
                     "offset 132: read by thread (32,0,0) at test_tma_ordering.cpp:");
  EXPECT_CONTAINS(e, "is unordered with the earlier TMA write (landed, counted by the mbarrier at shared offset 0) "
                     "issued at test_tma_ordering.cpp:");

  e = run_read_tma_bytes<Reader::reads_in_flight>("in_flight", out);
  EXPECT_CONTAINS(e, "shared-memory hazard (TMA write in flight) in kernel 'in_flight'");
  EXPECT_CONTAINS(e, "read by thread (32,0,0)");
  EXPECT_CONTAINS(e, "touches bytes of a TMA write by thread (0,0,0) at test_tma_ordering.cpp:");
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

}  // namespace
