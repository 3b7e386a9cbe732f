#pragma once
// Which kernel families a context may run on its device: the context allows them, the build has
// their code, the device's compute capability runs it. The paths ask here; Context answers
// uses_hopper_kernels() from here.
#include "runtime/context_state.h"

namespace selfattn::detail {

// sm_90a code (wgmma, TMA, setmaxnreg) runs on compute capability 9.0 alone.
constexpr int kHopperComputeCapability = 90;

// Whether the fused forward may run the Hopper kernels on this context: ContextOptions::hopper_kernels
// allows it, the build has them (the sim always does), the device has compute capability 9.0.
bool hopper_kernels_usable(const ContextState& ctx);

}  // namespace selfattn::detail
