#pragma once
// What the sim tests of the Hopper primitives share (test_mbarrier.cpp, test_tma_ordering.cpp,
// test_async_proxy.cpp, test_hopper_rules.cpp...): the block's dynamic shared memory, a TMA write
// issued from the kernel's line, a barrier initialised the way kernels do it, the launch parameters
// and inputs of the mbarrier tests. Their kernels call the sim:: API directly, as
// primitives_hopper.cuh's twins do.
//
// Several kernels place an access in a known round of the schedule with __syncwarp: a warp's
// __syncwarp holds its lanes until all of them arrive, so what follows it runs in the next round,
// under any seed (and __syncwarp(1u) by lane 0 alone is a one-round delay that orders nothing).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/compat.h"
#include "sim_test_launch.h"

namespace selfattn::sim::testing::hopper {

inline unsigned char* smem() { return current_thread().dynamic_smem; }
inline uint64_t* barrier_at(size_t offset) { return reinterpret_cast<uint64_t*>(smem() + offset); }

// A TMA write of `bytes` bytes of `src`, issued from the caller's line (noinline, as
// primitives_hopper.cuh's tma_issue: its return address is the site a report names). A kernel that
// ends with it must keep it from being a tail call (issue_tma below).
__attribute__((noinline)) inline void issue_tma_at_caller(uint64_t* bar, void* dst, const float* src, size_t bytes) {
  const auto* bytes_of = reinterpret_cast<const unsigned char*>(src);
  tma_write(bar, dst, std::vector<unsigned char>(bytes_of, bytes_of + bytes), __builtin_return_address(0));
}

// issue_tma_at_caller from the kernel's line, never as a tail call: the empty asm after it keeps a
// kernel that ends with it from jumping there (the return address would then be the sim's, not the
// kernel's). A macro, not a function: an inlined helper would be named in the report's site before
// the kernel's line.
#define issue_tma(bar, dst, src, bytes)                                          \
  do {                                                                           \
    ::selfattn::sim::testing::hopper::issue_tma_at_caller(bar, dst, src, bytes); \
    asm volatile("" ::: "memory");                                               \
  } while (0)

// mbarrier.init then fence.mbarrier_init, as a kernel does before the TMA unit may use the barrier
// (without the fence a TMA write on it is reported: test_hopper_rules.cpp).
inline void init_barrier(void* bar, unsigned arrival_count) {
  mbarrier_init(bar, arrival_count);
  fence_mbarrier_init();
}

// The launch parameters of the mbarrier, TMA and async-proxy tests' kernels.
struct Params {
  const float* src;  // host memory
  float* out;        // host memory
  int tiles = 0;
};

inline std::vector<float> iota_floats(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = float(i) + 0.5f;
  return v;
}

}  // namespace selfattn::sim::testing::hopper
