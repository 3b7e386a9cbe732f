// The engine: every thread of every block runs once with its indices, barriers order shared-memory
// traffic, a missing barrier shows, divergence and kernel exceptions are reported, results do not
// depend on the number of workers.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/compat.h"
#include "sim_test_launch.h"

namespace sim = selfattn::sim;
using sim::testing::launch;
using sim::testing::ScopedOptions;

namespace {

// ---- indices ------------------------------------------------------------------------------------

struct IndexParams {
  unsigned* visits;  // one counter per (block, thread)
  uint32_t* coords;  // 6 per (block, thread): threadIdx, blockIdx as seen by the thread
};

__global__ void record_indices(const IndexParams p) {
  const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned slot = block * blockDim.x * blockDim.y * blockDim.z + thread;
  atomicAdd(&p.visits[slot], 1u);
  uint32_t* c = p.coords + 6 * size_t(slot);
  c[0] = threadIdx.x, c[1] = threadIdx.y, c[2] = threadIdx.z;
  c[3] = blockIdx.x, c[4] = blockIdx.y, c[5] = blockIdx.z;
}

void expect_every_thread_once(dim3 grid, dim3 block) {
  const size_t blocks = size_t(grid.x) * grid.y * grid.z, threads = size_t(block.x) * block.y * block.z;
  std::vector<unsigned> visits(blocks * threads, 0);
  std::vector<uint32_t> coords(6 * blocks * threads, 0xDEADBEEF);
  launch<IndexParams, record_indices>("record_indices", grid, block, {visits.data(), coords.data()});
  for (size_t b = 0; b < blocks; ++b) {
    for (size_t t = 0; t < threads; ++t) {
      const size_t slot = b * threads + t;
      ASSERT_EQ(visits[slot], 1u) << "block " << b << " thread " << t;
      const uint32_t* c = &coords[6 * slot];
      EXPECT_EQ(c[0], t % block.x);
      EXPECT_EQ(c[1], t / block.x % block.y);
      EXPECT_EQ(c[2], t / (block.x * block.y));
      EXPECT_EQ(c[3], b % grid.x);
      EXPECT_EQ(c[4], b / grid.x % grid.y);
      EXPECT_EQ(c[5], b / (size_t(grid.x) * grid.y));
    }
  }
}

TEST(SimEngine, EveryThreadOfEveryBlockRunsOnceWithItsIndices) {
  expect_every_thread_once(dim3(1), dim3(1));
  expect_every_thread_once(dim3(3, 2, 2), dim3(7, 3, 2));
  expect_every_thread_once(dim3(5), dim3(113));
  expect_every_thread_once(dim3(2), dim3(1024));
  expect_every_thread_once(dim3(1, 1, 3), dim3(32, 4));
}

// ---- shared memory and barriers -----------------------------------------------------------------

struct SmemParams {
  const float* in;
  float* out;
  int* non_nan_at_start;  // per block: shared floats that were not NaN when the block began
};

// Reverses each block's slice through shared memory; counts what it finds there before writing.
template <bool WithBarrier>
__global__ void reverse_through_smem(const SmemParams p) {
  float* tile = reinterpret_cast<float*>(sim::current_thread().dynamic_smem);
  const unsigned n = blockDim.x;
  const unsigned t = threadIdx.x;
  if (t == 0) {
    int count = 0;
    for (unsigned i = 0; i < 2 * n; ++i) count += !std::isnan(tile[i]);
    p.non_nan_at_start[blockIdx.x] = count;
  }
  __syncthreads();
  tile[t] = p.in[blockIdx.x * n + t];
  tile[n + t] = 1.0f;  // dirties more of the buffer, so a later block finds it non-NaN unless refilled
  if (WithBarrier) __syncthreads();
  p.out[blockIdx.x * n + t] = tile[n - 1 - t];
}

std::vector<float> run_reverse(bool with_barrier, unsigned blocks, unsigned threads, std::vector<int>* non_nan) {
  std::vector<float> in(size_t(blocks) * threads), out(in.size(), NAN);
  std::mt19937 rng(7);
  for (float& v : in) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  non_nan->assign(blocks, -1);
  const SmemParams params{in.data(), out.data(), non_nan->data()};
  const size_t smem = 2 * threads * sizeof(float);
  if (with_barrier) {
    launch<SmemParams, reverse_through_smem<true>>("reverse", dim3(blocks), dim3(threads), params, smem);
  } else {
    launch<SmemParams, reverse_through_smem<false>>("reverse_racy", dim3(blocks), dim3(threads), params, smem);
  }
  for (unsigned b = 0; b < blocks; ++b) {
    for (unsigned t = 0; t < threads; ++t) {
      const float expected = in[size_t(b) * threads + threads - 1 - t];
      float& got = out[size_t(b) * threads + t];
      got = got == expected ? 0.0f : got;  // 0 marks a correct element
    }
  }
  return out;
}

TEST(SimEngine, BarrierOrdersSharedMemoryAndSharedMemoryStartsNaN) {
  for (unsigned threads : {1u, 7u, 64u, 113u}) {
    std::vector<int> non_nan;
    const std::vector<float> wrong = run_reverse(true, 9, threads, &non_nan);
    for (size_t i = 0; i < wrong.size(); ++i) ASSERT_EQ(wrong[i], 0.0f) << "threads " << threads << " element " << i;
    for (unsigned b = 0; b < 9; ++b) EXPECT_EQ(non_nan[b], 0) << "block " << b << " saw stale shared memory";
  }
}

TEST(SimEngine, MissingBarrierChangesTheResult) {
  // Without the barrier, under a random order most threads read their partner's slot before the
  // partner wrote it, and find NaN. (The racecheck reports the race first: off here, to show what
  // the schedule alone does; test_racecheck.cpp tests the racecheck.)
  ScopedOptions options(sim::testing::without_racecheck());
  std::vector<int> non_nan;
  const std::vector<float> wrong = run_reverse(false, 4, 128, &non_nan);
  size_t nan_reads = 0;
  for (float v : wrong) nan_reads += std::isnan(v);
  EXPECT_GT(nan_reads, wrong.size() / 4) << "the race went unnoticed";
}

// The write-after-read hazard of a tiled loop: each step stages a tile in shared memory, and every
// thread reads its neighbour's element. Without the barrier at the end of the step, a thread that
// runs ahead overwrites its slot with the next tile while a neighbour has yet to read it.
struct TiledParams {
  const float* in;  // steps x blockDim.x
  float* out;       // blockDim.x
  int steps;
};

template <bool TrailingBarrier>
__global__ void neighbour_sum_over_tiles(const TiledParams p) {
  float* tile = reinterpret_cast<float*>(sim::current_thread().dynamic_smem);
  const unsigned n = blockDim.x, t = threadIdx.x;
  float sum = 0;
  for (int step = 0; step < p.steps; ++step) {
    tile[t] = p.in[size_t(step) * n + t];
    __syncthreads();
    sum += tile[(t + 1) % n];
    if (TrailingBarrier) __syncthreads();
  }
  p.out[t] = sum;
}

TEST(SimEngine, MissingTrailingBarrierInATiledLoopChangesTheResult) {
  const unsigned n = 96;
  const int steps = 6;
  std::vector<float> in(size_t(steps) * n);
  for (size_t i = 0; i < in.size(); ++i) in[i] = float(i % 17 + 1);  // small integers: sums are exact
  std::vector<float> expected(n, 0);
  for (int s = 0; s < steps; ++s) {
    for (unsigned t = 0; t < n; ++t) expected[t] += in[size_t(s) * n + (t + 1) % n];
  }
  std::vector<float> with(n, NAN), without(n, NAN);
  launch<TiledParams, neighbour_sum_over_tiles<true>>("tiled", dim3(1), dim3(n), {in.data(), with.data(), steps},
                                                      n * sizeof(float));
  {
    ScopedOptions options(sim::testing::without_racecheck());  // as above: the schedule alone
    launch<TiledParams, neighbour_sum_over_tiles<false>>("tiled_racy", dim3(1), dim3(n),
                                                         {in.data(), without.data(), steps}, n * sizeof(float));
  }
  EXPECT_EQ(with, expected);
  size_t wrong = 0;
  for (unsigned t = 0; t < n; ++t) wrong += without[t] != expected[t];
  EXPECT_GT(wrong, n / 4) << "the write-after-read race went unnoticed";
}

// A barrier inside a loop, many times: a block-wide running sum through shared memory.
struct PrefixParams {
  const int* in;
  int* out;
  int n;
};

__global__ void block_prefix_sum(const PrefixParams p) {
  int* buf = reinterpret_cast<int*>(sim::current_thread().dynamic_smem);
  const int t = int(threadIdx.x);
  buf[t] = t < p.n ? p.in[t] : 0;
  __syncthreads();
  for (int offset = 1; offset < int(blockDim.x); offset *= 2) {  // Hillis-Steele: two barriers a step
    const int add = t >= offset ? buf[t - offset] : 0;
    __syncthreads();
    buf[t] += add;
    __syncthreads();
  }
  if (t < p.n) p.out[t] = buf[t];
}

TEST(SimEngine, BarriersInLoops) {
  for (int n : {1, 7, 100, 256}) {
    std::vector<int> in(n), out(n, -12345);
    for (int i = 0; i < n; ++i) in[i] = (i * 37) % 11 - 5;
    const unsigned threads = n <= 128 ? 128 : 256;
    launch<PrefixParams, block_prefix_sum>("block_prefix_sum", dim3(1), dim3(threads), {in.data(), out.data(), n},
                                           threads * sizeof(int));
    int sum = 0;
    for (int i = 0; i < n; ++i) {
      sum += in[i];
      ASSERT_EQ(out[i], sum) << "n " << n << " i " << i;
    }
  }
}

// ---- schedule -----------------------------------------------------------------------------------

struct OrderParams {
  unsigned* order;  // the order in which the threads of one block first ran
  unsigned* next;
};

__global__ void record_order(const OrderParams p) { p.order[atomicAdd(p.next, 1u)] = threadIdx.x; }

std::vector<unsigned> schedule(uint64_t seed) {
  ScopedOptions options(sim::testing::with_seed(seed));
  std::vector<unsigned> order(64, ~0u);
  unsigned next = 0;
  launch<OrderParams, record_order>("record_order", dim3(1), dim3(64), {order.data(), &next});
  return order;
}

TEST(SimEngine, ScheduleIsAPermutationFixedBySeed) {
  const std::vector<unsigned> a = schedule(11), b = schedule(11), c = schedule(12);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  std::vector<unsigned> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (unsigned i = 0; i < 64; ++i) ASSERT_EQ(sorted[i], i);
  std::vector<unsigned> identity(64);
  for (unsigned i = 0; i < 64; ++i) identity[i] = i;
  EXPECT_NE(a, identity);
}

// A block's schedule depends on the seed and the block index only: the same output with one worker
// or several, though blocks then run in another order on other OS threads.
struct ScheduleSignatureParams {
  uint64_t* signature;  // per block: a hash of the order its threads ran in
};

__global__ void schedule_signature(const ScheduleSignatureParams p) {
  uint64_t* s = p.signature + blockIdx.x;
  for (int round = 0; round < 3; ++round) {
    *s = *s * 1000003u + threadIdx.x + 1;  // fibers of a block never run at once: no race
    __syncthreads();
  }
}

TEST(SimEngine, SameResultWithOneOrSeveralWorkers) {
  std::vector<uint64_t> one(37, 0), several(37, 0);
  {
    ScopedOptions options(sim::testing::with_workers(1));
    launch<ScheduleSignatureParams, schedule_signature>("schedule_signature", dim3(37), dim3(96), {one.data()});
  }
  {
    ScopedOptions options(sim::testing::with_workers(4));
    launch<ScheduleSignatureParams, schedule_signature>("schedule_signature", dim3(37), dim3(96), {several.data()});
  }
  EXPECT_EQ(one, several);
  EXPECT_NE(one[0], one[1]) << "blocks should draw different permutations";
}

// ---- errors -------------------------------------------------------------------------------------

std::string launch_error(void (*run)()) {
  try {
    run();
  } catch (const sim::Error& e) {
    return e.what();
  }
  return "";
}

struct NoParams {
  int unused;
};

__global__ void early_exit_before_barrier(const NoParams) {
  if (blockIdx.x == 1 && threadIdx.x >= 40) return;
  __syncthreads();
}

TEST(SimEngine, ThreadExitingBeforeABarrierIsReportedNotHung) {
  const std::string message = launch_error([] {
    launch<NoParams, early_exit_before_barrier>("early_exit_before_barrier", dim3(3), dim3(64), {0});
  });
  EXPECT_NE(message.find("divergent barrier"), std::string::npos) << message;
  EXPECT_NE(message.find("early_exit_before_barrier"), std::string::npos) << message;
  EXPECT_NE(message.find("block (1,0,0)"), std::string::npos) << message;
  EXPECT_NE(message.find("threads (0,0,0)..(39,0,0) wait at __syncthreads"), std::string::npos) << message;
  EXPECT_NE(message.find("threads (40,0,0)..(63,0,0) exited"), std::string::npos) << message;
}

__global__ void barrier_against_shuffle(const NoParams) {
  if (threadIdx.x < 32) {
    __syncthreads();
  } else {
    (void)__shfl_xor_sync(0xffffffffu, 1.0f, 1);
    __syncthreads();
  }
}

TEST(SimEngine, AShuffleInOneWarpBeforeABarrierIsNoDivergence) {
  const std::string message = launch_error(
      [] { launch<NoParams, barrier_against_shuffle>("barrier_against_shuffle", dim3(1), dim3(64), {0}); });
  // The shuffle completes (all of warp 1 is there) and warp 1 joins the barrier: no divergence.
  EXPECT_EQ(message, "");
}

__global__ void shuffle_with_a_lane_missing(const NoParams) {
  if (threadIdx.x == 5) return;
  (void)__shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

TEST(SimEngine, ShuffleWithAnExitedLaneIsReported) {
  const std::string message = launch_error(
      [] { launch<NoParams, shuffle_with_a_lane_missing>("shuffle_with_a_lane_missing", dim3(1), dim3(32), {0}); });
  EXPECT_NE(message.find("divergent"), std::string::npos) << message;
  EXPECT_NE(message.find("thread (5,0,0) exited"), std::string::npos) << message;
  EXPECT_NE(message.find("lanes still missing 0x00000020"), std::string::npos) << message;
}

__global__ void ballot_against_shuffle(const NoParams) {
  if (threadIdx.x % 2) {
    (void)__ballot_sync(0xffffffffu, 1);
  } else {
    (void)__shfl_sync(0xffffffffu, 1, 0);
  }
}

TEST(SimEngine, LanesAtDifferentCollectivesAreReported) {
  const std::string message = launch_error(
      [] { launch<NoParams, ballot_against_shuffle>("ballot_against_shuffle", dim3(1), dim3(32), {0}); });
  EXPECT_NE(message.find("different warp collectives"), std::string::npos) << message;
}

__global__ void shuffle_without_own_lane(const NoParams) { (void)__shfl_sync(0x0000ffffu, 1, 0); }

TEST(SimEngine, MaskWithoutTheCallingLaneIsReported) {
  const std::string message = launch_error(
      [] { launch<NoParams, shuffle_without_own_lane>("shuffle_without_own_lane", dim3(1), dim3(32), {0}); });
  EXPECT_NE(message.find("leaves out the calling lane"), std::string::npos) << message;
}

__global__ void throw_in_one_thread(const NoParams) {
  __syncthreads();
  if (blockIdx.x == 2 && threadIdx.x == 17) throw sim::Error("primitive failed in thread 17");
  __syncthreads();
}

TEST(SimEngine, ExceptionInAKernelThreadPropagatesOutOfLaunch) {
  for (int workers : {1, 3}) {
    ScopedOptions options(sim::testing::with_workers(workers));
    const std::string message = launch_error(
        [] { launch<NoParams, throw_in_one_thread>("throw_in_one_thread", dim3(5), dim3(64), {0}); });
    EXPECT_EQ(message, "primitive failed in thread 17");
  }
  // The engine is usable after an aborted block.
  expect_every_thread_once(dim3(4), dim3(64));
}

struct OverrunParams {
  size_t bytes;
};

__global__ void write_past_shared_memory(const OverrunParams p) {
  if (threadIdx.x == 0) sim::current_thread().dynamic_smem[p.bytes + 3] = 1;
}

// The guard after shared memory catches what the access checks do not see (racecheck off, or code
// without the instrumentation); with them on, the write is reported at the access
// (test_access_checks.cpp). This test is about the guard: the racecheck is off for it.
TEST(SimEngine, SharedMemoryOverrunIsReported) {
  ScopedOptions unchecked(sim::testing::without_racecheck());
  const std::string message = launch_error([] {
    launch<OverrunParams, write_past_shared_memory>("write_past_shared_memory", dim3(2), dim3(32), {1000}, 1000);
  });
  EXPECT_NE(message.find("past the end of its dynamic shared memory (1000 bytes) at offset 1003"), std::string::npos)
      << message;
}

TEST(SimEngine, InvalidLaunchesAreRejected) {
  EXPECT_NE(launch_error([] { launch<NoParams, early_exit_before_barrier>("k", dim3(0), dim3(32), {0}); }), "");
  EXPECT_NE(launch_error([] { launch<NoParams, early_exit_before_barrier>("k", dim3(1), dim3(1025), {0}); }), "");
  EXPECT_NE(launch_error([] { launch<NoParams, early_exit_before_barrier>("k", dim3(1), dim3(32), {0}, 300000); }),
            "");
  EXPECT_THROW(sim::current_thread(), sim::Error);
  EXPECT_THROW(sim::syncthreads(), sim::Error);
}

}  // namespace

// ---- block order ----------------------------------------------------------------------------------

namespace {

struct TicketParams {
  unsigned* counter;
  unsigned* ticket;  // per block: the order in which it started
};

__global__ void take_ticket(const TicketParams p) {
  if (threadIdx.x == 0) p.ticket[blockIdx.x] = atomicAdd(p.counter, 1u);
}

std::vector<unsigned> block_order(uint64_t seed, unsigned blocks) {
  sim::Options options = sim::testing::with_workers(1);
  options.seed = seed;
  ScopedOptions scoped(options);
  unsigned counter = 0;
  std::vector<unsigned> ticket(blocks, ~0u);
  launch<TicketParams, take_ticket>("take_ticket", dim3(blocks), dim3(32), TicketParams{&counter, ticket.data()});
  return ticket;
}

// Nothing orders blocks on a GPU: the sim starts them in a seed-dependent order (a permutation), so
// a result that depends on block order differs between seeds.
TEST(SimEngine, BlockOrderIsAPermutationThatDependsOnTheSeed) {
  const unsigned blocks = 24;
  const std::vector<unsigned> a = block_order(11, blocks), b = block_order(12, blocks);
  for (const std::vector<unsigned>* order : {&a, &b}) {
    std::vector<unsigned> sorted = *order;
    std::sort(sorted.begin(), sorted.end());
    for (unsigned i = 0; i < blocks; ++i) EXPECT_EQ(sorted[i], i);
  }
  EXPECT_NE(a, b);
  EXPECT_EQ(block_order(11, blocks), a);  // one worker: reproducible per seed
}

}  // namespace
