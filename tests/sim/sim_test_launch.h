#pragma once
// Launching a kernel written in a test file straight on the sim engine, without the library.
#include <cstddef>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <vector>

#include "common/compat.h"

// The racecheck, and the access checks that ride on it, need the test's kernels instrumented (CMake
// SELFATTN_SIM_RACECHECK) and the switch on (SELFATTN_SIM_RACECHECK=0 turns them off: such tests skip).
#if defined(__SANITIZE_THREAD__)
#define SKIP_UNLESS_RACECHECKED() \
  if (!::selfattn::sim::options().racecheck) GTEST_SKIP() << "racecheck off (SELFATTN_SIM_RACECHECK=0)"
#else
#define SKIP_UNLESS_RACECHECKED() GTEST_SKIP() << "built without the racecheck's instrumentation"
#endif

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE((text).find(part), std::string::npos) << "missing \"" << (part) << "\" in: " << (text)

namespace selfattn::sim::testing {

// Runs the launch and returns the sim::Error's text, or "" when it did not throw.
template <class Launch>
std::string error_of(Launch&& run) {
  try {
    run();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The line of the sim::launch below: a racecheck report names it as the frame that calls the kernel.
constexpr int kLaunchLine = __LINE__ + 12;

// Runs kernel(params) over grid x block on the sim, as the library's launch layer would.
template <class Params, void (*Kernel)(Params)>
void launch(const char* name, dim3 grid, dim3 block, const Params& params, size_t dynamic_smem_bytes = 0) {
  LaunchConfig config;
  config.kernel_name = name;
  config.grid = grid;
  config.block = block;
  config.dynamic_smem_bytes = dynamic_smem_bytes;
  config.kernel_key = typeid(std::integral_constant<void (*)(Params), Kernel>).name();  // as launch.h's
  static_assert(__LINE__ + 1 == kLaunchLine, "kLaunchLine names the next line");
  sim::launch(config, [](const void* p) { Kernel(*static_cast<const Params*>(p)); }, &params);
}

// Sets the sim's options for one scope and restores the previous ones after it.
class ScopedOptions {
 public:
  explicit ScopedOptions(const Options& options) : saved_(sim::options()) { set_options(options); }
  ~ScopedOptions() { set_options(saved_); }
  ScopedOptions(const ScopedOptions&) = delete;
  ScopedOptions& operator=(const ScopedOptions&) = delete;

 private:
  Options saved_;
};

inline Options with_workers(int workers) {
  Options o = options();
  o.worker_threads = workers;
  return o;
}

inline Options with_seed(uint64_t seed) {
  Options o = options();
  o.seed = seed;
  return o;
}

// For tests of what the schedule alone shows of a race: the racecheck would report it first.
inline Options without_racecheck() {
  Options o = options();
  o.racecheck = false;
  return o;
}

}  // namespace selfattn::sim::testing
