#pragma once
// What the sim tests of the Hopper primitives share (test_mbarrier.cpp, test_hopper_rules.cpp): the
// block's dynamic shared memory, a TMA write issued from the kernel's line, a barrier initialised
// the way kernels do it. Their kernels call the sim:: API directly, as
// primitives_hopper.cuh's twins do.
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
// ends with it must keep it from being a tail call (test_mbarrier.cpp's issue_tma).
__attribute__((noinline)) inline void issue_tma_at_caller(uint64_t* bar, void* dst, const float* src, size_t bytes) {
  const auto* bytes_of = reinterpret_cast<const unsigned char*>(src);
  tma_write(bar, dst, std::vector<unsigned char>(bytes_of, bytes_of + bytes), __builtin_return_address(0));
}

// mbarrier.init then fence.mbarrier_init, as a kernel does before the TMA unit may use the barrier
// (without the fence a TMA write on it is reported: test_hopper_rules.cpp).
inline void init_barrier(void* bar, unsigned arrival_count) {
  mbarrier_init(bar, arrival_count);
  fence_mbarrier_init();
}

}  // namespace selfattn::sim::testing::hopper
