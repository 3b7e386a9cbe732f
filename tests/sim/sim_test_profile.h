#pragma once
// What the profiler's tests (test_profile_memory.cpp, test_profile_compute.cpp) share: profiling on
// for one launch, its profile, and lookups and expectations on it. One test source a program: the
// helpers sit in an anonymous namespace (inline: not every program uses each).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common/primitives.cuh"
#include "common/primitives_hopper.cuh"
#include "common/tma_descriptor.h"
#include "sim_test_launch.h"

namespace sim = selfattn::sim;
namespace kernels = selfattn::kernels;
using sim::testing::launch;
using sim::testing::ScopedOptions;

// Plain loads and stores reach the profiler through the racecheck's compiler instrumentation; the
// twins' reports (ldmatrix, cp.async, vectors, mma, MUFU) do without it.
#if defined(__SANITIZE_THREAD__)
#define SKIP_UNLESS_INSTRUMENTED()
#else
#define SKIP_UNLESS_INSTRUMENTED() GTEST_SKIP() << "built without the racecheck's instrumentation"
#endif

namespace {

// A device buffer of `count` elements, freed at scope end.
template <class T>
struct DeviceBuffer {
  DeviceBuffer(size_t count, const char* label) : data(static_cast<T*>(sim::device_alloc(count * sizeof(T), label))) {}
  ~DeviceBuffer() { sim::device_free(data); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* data;
};

inline sim::Options profiling_on(bool racecheck = true, int workers = 0) {
  sim::Options o = sim::options();
  o.profile = true;
  o.racecheck = racecheck;
  if (workers > 0) o.worker_threads = workers;
  return o;
}

// Runs `run` (one launch) with profiling on and returns its profile.
template <class Run>
sim::LaunchProfile profile_of(Run&& run, bool racecheck = true, int workers = 0) {
  (void)sim::take_profiles();  // whatever earlier tests left
  {
    ScopedOptions scoped(profiling_on(racecheck, workers));
    run();
  }
  std::vector<sim::LaunchProfile> profiles = sim::take_profiles();
  EXPECT_EQ(profiles.size(), 1u);
  return profiles.empty() ? sim::LaunchProfile{} : profiles[0];
}

inline const sim::BufferTraffic* buffer(const sim::LaunchProfile& p, const std::string& label) {
  for (const sim::BufferTraffic& b : p.global)
    if (b.label == label) return &b;
  return nullptr;
}

inline void expect_traffic(const sim::GlobalTraffic& g, uint64_t requests, uint64_t bytes, uint64_t sectors,
                    uint64_t distinct) {
  EXPECT_EQ(g.requests, requests);
  EXPECT_EQ(g.bytes_requested, bytes);
  EXPECT_EQ(g.sectors, sectors);
  EXPECT_EQ(g.distinct_sectors, distinct);
}

// The profile's only shared-memory site of kind `op` (failing the test if there is not exactly one).
inline sim::SharedSite only_site(const sim::LaunchProfile& p, sim::SharedOp op) {
  std::vector<sim::SharedSite> found;
  for (const sim::SharedSite& s : p.shared)
    if (s.op == op) found.push_back(s);
  EXPECT_EQ(found.size(), 1u) << sim::format_profile(p);
  return found.empty() ? sim::SharedSite{} : found[0];
}

inline void expect_site(const sim::SharedSite& s, uint64_t instructions, uint64_t bytes, uint64_t wavefronts, uint64_t ideal) {
  EXPECT_EQ(s.instructions, instructions) << s.location;
  EXPECT_EQ(s.bytes, bytes) << s.location;
  EXPECT_EQ(s.wavefronts, wavefronts) << s.location;
  EXPECT_EQ(s.ideal_wavefronts, ideal) << s.location;
}

struct CopyParams {
  const float* in;
  float* out;
};

// Lane t reads in[t * Stride] and writes out[t]: 32 lanes x 4 bytes.
template <int Stride>
__global__ void strided_copy(const CopyParams p) {
  const unsigned t = threadIdx.x;
  p.out[t] = p.in[t * Stride];
}

}  // namespace
