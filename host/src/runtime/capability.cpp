#include "runtime/capability.h"

#include "selfattn/types.h"

namespace selfattn::detail {

bool hopper_kernels_usable(const ContextState& ctx) {
  const bool built = ctx.device->backend() == Backend::sim || SELFATTN_HAVE_HOPPER_KERNELS;
  return ctx.hopper_kernels && built && ctx.device->compute_capability() == kHopperComputeCapability;
}

}  // namespace selfattn::detail
