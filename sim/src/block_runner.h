#pragma once
// Between the grid (grid.cpp: workers, launch) and the block engine (engine.cpp).
#include <cstdint>

#include "selfattn_sim/sim.h"

namespace selfattn::sim::detail {

namespace race {
struct LaunchState;
}
namespace profile {
class LaunchProfiler;
}

// Runs block number `linear` (x fastest) of the grid to its end on the calling OS thread, with the
// schedule drawn from `seed` and the block number; `race`: the launch's state for the racecheck's
// instrumentation hooks (the racecheck, or the profiler alone: LaunchState::racecheck says which),
// or nullptr (both off); `profiler`: the launch's profiler, or nullptr (off; needs `race`). Throws
// sim::Error (divergence, a kernel thread's exception, a shared-memory overrun, a hazard).
void run_block(const LaunchConfig& config, void (*body)(const void*), const void* params, uint64_t linear,
               uint64_t seed, const race::LaunchState* race, profile::LaunchProfiler* profiler);

// True on an OS thread that is running a kernel thread right now.
bool inside_kernel();

}  // namespace selfattn::sim::detail
