// Faults inside kernel threads are explained before the process dies (death tests), and a fork()ed
// child can still launch.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/compat.h"
#include "sim_test_launch.h"

namespace sim = selfattn::sim;
using sim::testing::launch;

namespace {

struct DepthParams {
  int depth;
  int* sink;
};

// Each frame keeps 4 KB alive, so the recursion cannot be turned into a loop.
int recurse(int depth, int* sink) {
  volatile char frame[4096];
  std::memset(const_cast<char*>(frame), depth & 0x7f, sizeof frame);
  if (depth == 0) return frame[7];
  return recurse(depth - 1, sink) + frame[depth % 4096];
}

__global__ void deep_recursion(const DepthParams p) {
  if (threadIdx.x == 3) *p.sink = recurse(p.depth, p.sink);
}

TEST(SimCrashReportDeathTest, StackOverflowIsNamed) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  int sink = 0;
  // 20 frames of ~4 KB fit the default 256 KB stack; 1000 do not.
  launch<DepthParams, deep_recursion>("deep_recursion", dim3(1), dim3(32), {20, &sink});
  const auto overflow = [&] { launch<DepthParams, deep_recursion>("deep_recursion", dim3(1), dim3(32), {1000, &sink}); };
  EXPECT_DEATH(overflow(),
               "kernel 'deep_recursion', block \\(0,0,0\\), thread \\(3,0,0\\) overflowed its 262144-byte fiber stack");
}

struct FarStoreParams {
  float* data;
  int64_t index;
};

__global__ void far_store(const FarStoreParams p) {
  if (threadIdx.x == 0) p.data[p.index] = 1.0f;
}

TEST(SimCrashReportDeathTest, FarOutOfBoundsStoreNamesTheBuffer) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  float* data = static_cast<float*>(sim::device_alloc(1000 * sizeof(float), "logits"));
  // Past the guard zone (4 KB and the rest of the page) into the no-access page after it.
  const auto store = [&] { launch<FarStoreParams, far_store>("far_store", dim3(1), dim3(32), {data, 2250}); };
  EXPECT_DEATH(store(),
               "kernel 'far_store', block \\(0,0,0\\), thread \\(0,0,0\\) faulted at .*: offset 9000 of buffer "
               "'logits' \\(4000 bytes\\): 5000 bytes past its end");
  sim::device_free(data);
}

// Thread 0 spins until thread 1 sets a flag: fine on a GPU, endless on the sim, where thread 1 cannot
// run before thread 0 gives way. The watchdog names the spinning thread instead of hanging.
struct SpinParams {
  int* flag;
};

__global__ void spin_on_a_flag(const SpinParams p) {
  if (threadIdx.x == 1) __atomic_store_n(p.flag, 1, __ATOMIC_RELAXED);
  if (threadIdx.x == 0) {
    while (__atomic_load_n(p.flag, __ATOMIC_RELAXED) == 0) {
    }
  }
}

TEST(SimCrashReportDeathTest, SpinWaitIsNamedByTheWatchdog) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  setenv("SELFATTN_SIM_WATCHDOG_S", "2", 1);  // read by the child's first launch
  int flag = 0;
  const auto spin = [&] { launch<SpinParams, spin_on_a_flag>("spin_on_a_flag", dim3(1), dim3(32), {&flag}); };
  // Under some seeds thread 1 runs first and the kernel ends: try seeds until one spins.
  const auto spin_until_stuck = [&] {
    for (uint64_t seed = 1; seed < 64; ++seed) {
      sim::testing::ScopedOptions options(sim::testing::with_seed(seed));
      flag = 0;
      spin();
    }
  };
  EXPECT_DEATH(spin_until_stuck(),
               "kernel 'spin_on_a_flag', block \\(0,0,0\\), thread \\(0,0,0\\) has run for 2 s without reaching a barrier");
  unsetenv("SELFATTN_SIM_WATCHDOG_S");
}

// A fork()ed child (gtest's default death-test style) has none of the parent's worker threads; its
// launches must not wait for them.
struct CountParams {
  unsigned* count;
};

__global__ void count_blocks(const CountParams p) {
  if (threadIdx.x == 0) atomicAdd(p.count, 1u);
}

TEST(SimCrashReportDeathTest, LaunchInAForkedChildAfterWorkersRan) {
  GTEST_FLAG_SET(death_test_style, "fast");
  sim::testing::ScopedOptions options(sim::testing::with_workers(4));
  unsigned count = 0;
  launch<CountParams, count_blocks>("count_blocks", dim3(16), dim3(32), {&count});
  ASSERT_EQ(count, 16u);
  const auto child = [&] {
    launch<CountParams, count_blocks>("count_blocks", dim3(16), dim3(32), {&count});
    std::fprintf(stderr, "child counted %u blocks\n", count);
    std::abort();
  };
  EXPECT_DEATH(child(), "child counted 32 blocks");
}

}  // namespace
