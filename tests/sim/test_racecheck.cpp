// The racecheck: one small kernel per hazard class that must be reported, beside its fixed twin
// that must not; what a report names; what is not a hazard.
//
// Most kernels make two accesses: thread 0 (warp 0) first, then thread 32 (warp 1) after a
// __syncwarp of its own warp. That __syncwarp holds warp 1 until all its lanes arrive, so its
// access runs in a later round of the schedule than thread 0's, under any seed: the report names
// the class exactly. It orders nothing between the two warps; the fixed twins add a __syncthreads.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/primitives.cuh"
#include "sim_test_launch.h"

namespace sim = selfattn::sim;
namespace kernels = selfattn::kernels;
using sim::testing::error_of;
using sim::testing::launch;
using sim::testing::ScopedOptions;

namespace {

struct Params {
  float* out;  // host memory: a sink for values read, never checked
};

// The frame a report gives below the kernel's line: the test launcher's call of the kernel.
const std::string kLaunchFrame = " in sim_test_launch.h:" + std::to_string(sim::testing::kLaunchLine);

// ---- read after write, write after read, write after write across warps --------------------------

enum class Access { read, write };

constexpr int kFirstAccessLine = __LINE__ + 7;  // the line of thread 0's access below
constexpr int kSecondAccessLine = __LINE__ + 11;
template <Access First, Access Second, bool Barrier>
__global__ void two_warps_one_float(const Params p) {
  float* x = kernels::dynamic_smem<float>() + 1;  // shared byte offset 4
  const unsigned t = threadIdx.x;
  if (t == 0) {
    if (First == Access::write) *x = 1.0f; else p.out[0] = *x;
  }
  if (t >= 32) __syncwarp();
  if (Barrier) __syncthreads();
  if (t == 32) {
    if (Second == Access::write) *x = 2.0f; else p.out[1] = *x;
  }
}

template <Access First, Access Second, bool Barrier>
std::string run_two_warps(const char* name) {
  std::vector<float> sink(2);
  return error_of([&] {
    launch<Params, two_warps_one_float<First, Second, Barrier>>(name, dim3(1), dim3(64), {sink.data()}, 64);
  });
}

const char* access_name(Access a) { return a == Access::read ? "read" : "write"; }

// The racy kernel is reported with its class, both accesses and their lines; its twin with the
// barrier is not.
template <Access First, Access Second>
void expect_two_warp_hazard(const std::string& hazard_class) {
  const std::string e = run_two_warps<First, Second, false>("racy");
  EXPECT_CONTAINS(e, "shared-memory hazard (" + hazard_class + ") in kernel 'racy', block (0,0,0), at shared byte "
                     "offset 4: ");
  EXPECT_CONTAINS(e, std::string(access_name(Second)) + " by thread (32,0,0) at test_racecheck.cpp:" +
                         std::to_string(kSecondAccessLine) + kLaunchFrame + " (epoch 0) is unordered");
  EXPECT_CONTAINS(e, std::string("earlier ") + access_name(First) + " by thread (0,0,0) at test_racecheck.cpp:" +
                         std::to_string(kFirstAccessLine) + kLaunchFrame + " (epoch 0)");
  EXPECT_EQ((run_two_warps<First, Second, true>("fixed")), "");
}

TEST(SimRacecheck, ReadAfterWrite) {
  SKIP_UNLESS_RACECHECKED();
  expect_two_warp_hazard<Access::write, Access::read>("read after write");
}

TEST(SimRacecheck, WriteAfterRead) {
  SKIP_UNLESS_RACECHECKED();
  expect_two_warp_hazard<Access::read, Access::write>("write after read");
}

TEST(SimRacecheck, WriteAfterWrite) {
  SKIP_UNLESS_RACECHECKED();
  expect_two_warp_hazard<Access::write, Access::write>("write after write");
}

TEST(SimRacecheck, ReadsByManyThreadsAreNoHazard) {
  SKIP_UNLESS_RACECHECKED();
  EXPECT_EQ((run_two_warps<Access::read, Access::read, false>("read_read")), "");
}

// The epochs count the block's barriers: a write after one __syncthreads, a read after two.
constexpr int kThread0WriteLine = __LINE__ + 5;  // thread 1 reads 3 lines below it, thread 33 writes 5
__global__ void epochs_in_the_report(const Params p) {
  float* x = kernels::dynamic_smem<float>();
  __syncthreads();
  if (threadIdx.x == 0) {
    x[0] = 1.0f;
  }
  __syncthreads();
  if (threadIdx.x == 1) p.out[0] = x[0];  // ordered: a barrier lies between
  if (threadIdx.x >= 32) __syncwarp();
  if (threadIdx.x == 33) x[0] = 2.0f;  // not ordered with thread 1's read
}

TEST(SimRacecheck, ReportNamesBothAccessesAndTheirEpochs) {
  SKIP_UNLESS_RACECHECKED();
  std::vector<float> sink(1);
  const std::string e = error_of([&] {
    launch<Params, epochs_in_the_report>("epochs", dim3(1), dim3(64), {sink.data()}, 16);
  });
  EXPECT_CONTAINS(e, "hazard (write after read) in kernel 'epochs', block (0,0,0), at shared byte offset 0");
  EXPECT_CONTAINS(e, "write by thread (33,0,0) at test_racecheck.cpp:" + std::to_string(kThread0WriteLine + 5) +
                         kLaunchFrame + " (epoch 2)");
  EXPECT_CONTAINS(e, "read by thread (1,0,0) at test_racecheck.cpp:" + std::to_string(kThread0WriteLine + 3) +
                         kLaunchFrame + " (epoch 2)");
  EXPECT_EQ(e.find("thread (0,0,0)"), std::string::npos) << "thread 0's write is ordered before both: " << e;
}

// ---- lanes of one warp ------------------------------------------------------------------------------

// Lane 0 writes, lane 1 reads. A shuffle makes the lanes wait for each other (the read runs after
// the write) but exchanges registers only: it does not order memory. __syncwarp does.
template <bool Syncwarp>
__global__ void lanes_exchange_through_smem(const Params p) {
  float* x = kernels::dynamic_smem<float>();
  const unsigned lane = threadIdx.x;
  if (lane == 0) *x = 1.0f;
  const int from_lane_0 = __shfl_sync(0xffffffffu, int(lane), 0);
  if (Syncwarp) __syncwarp();
  if (lane == 1) p.out[0] = *x + float(from_lane_0);
}

TEST(SimRacecheck, MissingSyncwarp) {
  SKIP_UNLESS_RACECHECKED();
  std::vector<float> sink(1);
  const std::string e = error_of([&] {
    launch<Params, lanes_exchange_through_smem<false>>("lanes", dim3(1), dim3(32), {sink.data()}, 4);
  });
  EXPECT_CONTAINS(e, "hazard (read after write) in kernel 'lanes'");
  EXPECT_CONTAINS(e, "read by thread (1,0,0)");
  EXPECT_CONTAINS(e, "write by thread (0,0,0)");
  EXPECT_EQ(error_of([&] {
              launch<Params, lanes_exchange_through_smem<true>>("lanes_fixed", dim3(1), dim3(32), {sink.data()}, 4);
            }),
            "");
}

// __syncwarp orders lanes through other lanes: lane 0 syncs with lane 1 only, lane 1 then with
// lane 2 only; lane 2's read is ordered after lane 0's write, lane 3's is not (a shuffle with
// lane 2 holds it until then, and orders nothing).
template <unsigned Reader>
__global__ void syncwarp_chain(const Params p) {
  float* x = kernels::dynamic_smem<float>();
  const unsigned lane = threadIdx.x;
  if (lane == 0) *x = 1.0f;
  if (lane <= 1) __syncwarp(0x3u);
  if (lane == 1 || lane == 2) __syncwarp(0x6u);
  const int held = lane == 2 || lane == 3 ? __shfl_sync(0xCu, int(lane), 2) : 0;
  if (lane == Reader) p.out[0] = *x + float(held);
}

TEST(SimRacecheck, SyncwarpOrdersThroughOtherLanes) {
  SKIP_UNLESS_RACECHECKED();
  std::vector<float> sink(1);
  EXPECT_EQ(error_of([&] { launch<Params, syncwarp_chain<2>>("chain", dim3(1), dim3(32), {sink.data()}, 4); }), "");
  const std::string e =
      error_of([&] { launch<Params, syncwarp_chain<3>>("chain_broken", dim3(1), dim3(32), {sink.data()}, 4); });
  EXPECT_CONTAINS(e, "hazard (read after write) in kernel 'chain_broken'");
  EXPECT_CONTAINS(e, "read by thread (3,0,0)");
}

// ---- cp.async ---------------------------------------------------------------------------------------

struct CopyParams {
  const float* src;  // 16 bytes, 16-byte aligned
  float* out;
};

enum class CopyCase {
  other_thread_reads_in_flight,   // issued, a barrier, read by another thread, then waited for
  issuer_reads_before_its_wait,   // the issuing thread's own early read
  other_thread_reads_unordered,   // retired by the wait, read by another thread with no barrier
  waited_then_barrier,            // the fix: wait, __syncthreads, read
};

template <CopyCase C>
__global__ void cp_async_then_read(const CopyParams p) {
  float* tile = kernels::dynamic_smem<float>();
  const unsigned t = threadIdx.x;
  if (t == 0) {
    kernels::cp_async_cg(tile, p.src);
    kernels::cp_async_commit();
    if (C == CopyCase::issuer_reads_before_its_wait) p.out[0] = tile[1];
    if (C != CopyCase::other_thread_reads_in_flight) kernels::cp_async_wait<0>();
  }
  if (C == CopyCase::other_thread_reads_in_flight) __syncthreads();  // a barrier does not land a copy
  if (t >= 32) __syncwarp();
  if (C == CopyCase::waited_then_barrier) __syncthreads();
  if (t == 32 && C != CopyCase::issuer_reads_before_its_wait) p.out[1] = tile[2];
  if (C == CopyCase::other_thread_reads_in_flight) {
    __syncthreads();
    if (t == 0) kernels::cp_async_wait<0>();
  }
}

template <CopyCase C>
std::string run_cp_async(const char* name) {
  alignas(16) const float src[4] = {1, 2, 3, 4};
  std::vector<float> sink(2);
  return error_of([&] {
    launch<CopyParams, cp_async_then_read<C>>(name, dim3(1), dim3(64), {src, sink.data()}, 16);
  });
}

TEST(SimRacecheck, CpAsyncInFlight) {
  SKIP_UNLESS_RACECHECKED();
  std::string e = run_cp_async<CopyCase::other_thread_reads_in_flight>("in_flight");
  EXPECT_CONTAINS(e, "hazard (cp.async in flight) in kernel 'in_flight', block (0,0,0), at shared byte offset 8");
  EXPECT_CONTAINS(e, "read by thread (32,0,0)");
  EXPECT_CONTAINS(e, "(epoch 1) touches bytes of a cp.async write by thread (0,0,0) at test_racecheck.cpp:");
  EXPECT_CONTAINS(e, "(epoch 0) still in flight");

  e = run_cp_async<CopyCase::issuer_reads_before_its_wait>("own_read");
  EXPECT_CONTAINS(e, "hazard (cp.async in flight) in kernel 'own_read'");
  EXPECT_CONTAINS(e, "read by thread (0,0,0)");
  EXPECT_CONTAINS(e, "cp.async write by thread (0,0,0)");

  e = run_cp_async<CopyCase::other_thread_reads_unordered>("landed_unordered");
  EXPECT_CONTAINS(e, "hazard (read after write) in kernel 'landed_unordered'");
  EXPECT_CONTAINS(e, "earlier cp.async write by thread (0,0,0)");

  EXPECT_EQ(run_cp_async<CopyCase::waited_then_barrier>("landed_fixed"), "");
}

// ---- ldmatrix ---------------------------------------------------------------------------------------

struct LdmatrixParams {
  uint32_t* out;  // [32]
};

// Warp 0 loads an 8x8 matrix with ldmatrix (lane r passes row r); thread 37 (warp 1) then stores
// into row 3, which only lane 3's row address covers.
template <bool Barrier>
__global__ void ldmatrix_then_store(const LdmatrixParams p) {
  uint16_t* tile = kernels::dynamic_smem<uint16_t>();  // 8 rows of 8 elements, 16 bytes each
  const unsigned t = threadIdx.x, lane = t % 32;
  if (t < 32) {
    for (unsigned i = lane; i < 64; i += 32) tile[i] = uint16_t(i);
  }
  __syncthreads();
  if (t < 32) {
    uint32_t r[1];
    kernels::ldmatrix<1>(r, tile + (lane % 8) * 8);  // lanes 8..31: ignored by .x1
    p.out[lane] = r[0];
  }
  if (t >= 32) __syncwarp();
  if (Barrier) __syncthreads();
  if (t == 37) tile[3 * 8 + 2] = 7;
}

TEST(SimRacecheck, LdmatrixAgainstAStore) {
  SKIP_UNLESS_RACECHECKED();
  std::vector<uint32_t> sink(32);
  const std::string e = error_of([&] {
    launch<LdmatrixParams, ldmatrix_then_store<false>>("ldmatrix_store", dim3(1), dim3(64), {sink.data()}, 128);
  });
  EXPECT_CONTAINS(e, "hazard (write after read) in kernel 'ldmatrix_store', block (0,0,0), at shared byte offset 52");
  EXPECT_CONTAINS(e, "write by thread (37,0,0)");
  EXPECT_CONTAINS(e, "earlier ldmatrix read by thread (3,0,0) at test_racecheck.cpp:");
  EXPECT_EQ(error_of([&] {
              launch<LdmatrixParams, ldmatrix_then_store<true>>("ldmatrix_store_fixed", dim3(1), dim3(64),
                                                                {sink.data()}, 128);
            }),
            "");
}

// ---- bytes, not words ---------------------------------------------------------------------------------

struct HalvesParams {
  uint16_t* out;  // device memory, one element per thread
};

// Neighbouring threads store neighbouring 16-bit elements (two threads per 32-bit word), in shared
// and device memory, then each reads its own back: no hazard at byte granularity.
__global__ void neighbours_store_halves(const HalvesParams p) {
  uint16_t* h = kernels::dynamic_smem<uint16_t>();
  const unsigned t = threadIdx.x + blockIdx.x * blockDim.x;
  h[threadIdx.x] = uint16_t(t);
  p.out[t] = h[threadIdx.x];
}

TEST(SimRacecheck, NeighbouringHalvesAreNoHazard) {
  SKIP_UNLESS_RACECHECKED();
  auto* out = static_cast<uint16_t*>(sim::device_alloc(3 * 64 * sizeof(uint16_t), "halves"));
  EXPECT_EQ(error_of([&] {
              launch<HalvesParams, neighbours_store_halves>("halves", dim3(3), dim3(64), {out}, 64 * sizeof(uint16_t));
            }),
            "");
  for (unsigned i = 0; i < 3 * 64; ++i) ASSERT_EQ(out[i], i);
  sim::device_free(out);
}

// A block's records do not outlive it: every block writes the same shared float from a different
// thread, on one worker (so the blocks reuse one shadow).
__global__ void each_block_writes_from_another_thread(const Params p) {
  float* x = kernels::dynamic_smem<float>();
  if (threadIdx.x == blockIdx.x % blockDim.x) *x = float(blockIdx.x);
  __syncthreads();
  if (threadIdx.x == 0) p.out[blockIdx.x] = *x;
}

TEST(SimRacecheck, RecordsOfEarlierBlocksAreForgotten) {
  SKIP_UNLESS_RACECHECKED();
  ScopedOptions one_worker(sim::testing::with_workers(1));
  std::vector<float> out(9);
  EXPECT_EQ(error_of([&] {
              launch<Params, each_block_writes_from_another_thread>("blocks", dim3(9), dim3(64), {out.data()}, 4);
            }),
            "");
  for (unsigned b = 0; b < 9; ++b) EXPECT_EQ(out[b], float(b));
}

// ---- device memory --------------------------------------------------------------------------------

struct GlobalParams {
  float* out;  // device memory
};

// Thread 0 of every block writes element 0 (the bug class of split-KV and backward kernels: two
// blocks own one output row), or its block's own element.
template <bool OwnElement>
__global__ void blocks_write_one_element(const GlobalParams p) {
  if (threadIdx.x == 0) p.out[OwnElement ? blockIdx.x : 0] = float(blockIdx.x);
}

// Threads 0 and 32 of one block write element 0, with or without a barrier between.
template <bool Barrier>
__global__ void two_threads_write_one_element(const GlobalParams p) {
  if (threadIdx.x == 0) p.out[0] = 1.0f;
  if (Barrier) __syncthreads();
  if (threadIdx.x == 32) p.out[0] = 2.0f;
}

TEST(SimRacecheck, GlobalWriteAfterWriteAcrossBlocks) {
  SKIP_UNLESS_RACECHECKED();
  float* out = static_cast<float*>(sim::device_alloc(4 * sizeof(float), "out rows"));
  std::string e = error_of([&] {
    launch<GlobalParams, blocks_write_one_element<false>>("split_rows", dim3(4), dim3(32), {out});
  });
  EXPECT_CONTAINS(e, "global-memory write conflict in kernel 'split_rows': byte 0 of buffer 'out rows' is written "
                     "by block (");
  EXPECT_CONTAINS(e, "thread (0,0,0) at test_racecheck.cpp:");
  EXPECT_CONTAINS(e, "in one launch");
  EXPECT_EQ(error_of([&] {
              launch<GlobalParams, blocks_write_one_element<true>>("own_rows", dim3(4), dim3(32), {out});
            }),
            "");
  // Writing the same bytes again in a later launch is no conflict.
  EXPECT_EQ(error_of([&] {
              launch<GlobalParams, blocks_write_one_element<true>>("own_rows_again", dim3(4), dim3(32), {out});
            }),
            "");

  e = error_of([&] {
    launch<GlobalParams, two_threads_write_one_element<false>>("one_block", dim3(1), dim3(64), {out});
  });
  EXPECT_CONTAINS(e, "global-memory write conflict in kernel 'one_block'");
  EXPECT_CONTAINS(e, "block (0,0,0) thread (32,0,0)");
  EXPECT_CONTAINS(e, "block (0,0,0) thread (0,0,0)");
  EXPECT_CONTAINS(e, "with no __syncthreads between them");
  EXPECT_EQ(error_of([&] {
              launch<GlobalParams, two_threads_write_one_element<true>>("one_block_fixed", dim3(1), dim3(64), {out});
            }),
            "");
  sim::device_free(out);
}

// ---- the switch -------------------------------------------------------------------------------------

TEST(SimRacecheck, OffSwitch) {
  SKIP_UNLESS_RACECHECKED();
  ScopedOptions off(sim::testing::without_racecheck());
  EXPECT_EQ((run_two_warps<Access::write, Access::read, false>("raw_unchecked")), "");
}

}  // namespace
