#pragma once
// The launch checks against what ptxas gave each kernel (compiled_kernels.cpp; sim.h, CompiledKernel).
#include "selfattn_sim/sim.h"

namespace selfattn::sim::detail {

// Throws sim::Error for a launch that a GPU of one of the kernel's recorded architectures would
// refuse (its registers or shared memory); nothing when none is recorded.
void check_compiled_resources(const LaunchConfig& config);
// The registers per thread ptxas gave the kernel (the most over its architectures), 0 if unrecorded.
unsigned compiled_registers(const char* kernel_key);

}  // namespace selfattn::sim::detail
