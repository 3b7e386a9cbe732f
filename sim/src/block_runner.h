#pragma once
// Between the grid (grid.cpp: workers, launch) and the block engine (engine.cpp).
#include <cstdint>

#include "selfattn_sim/sim.h"

namespace selfattn::sim::detail {

// Runs block number `linear` (x fastest) of the grid to its end on the calling OS thread, with the
// schedule drawn from `seed` and the block number. Throws sim::Error (divergence, a kernel
// thread's exception, a shared-memory overrun).
void run_block(const LaunchConfig& config, void (*body)(const void*), const void* params, uint64_t linear,
               uint64_t seed);

// True on an OS thread that is running a kernel thread right now.
bool inside_kernel();

}  // namespace selfattn::sim::detail
