#include "runtime/capability.h"

#include "selfattn/types.h"

namespace selfattn::detail {
namespace {

// Per tag: whether nvcc built its code (the sim has every tag's), and which compute capabilities
// run it. The portable code has no lower bound here: the runtime already refuses a GPU this build
// has no kernel image for (device_cuda.cu).
struct ArchRow {
  KernelArch arch;
  bool built;
  int min_capability, max_capability;
};
constexpr int kAnyCapability = 1 << 30;
const ArchRow kArchitectures[] = {
    {KernelArch::sm80, bool(SELFATTN_BUILT_sm80), 0, kAnyCapability},
    {KernelArch::sm90a, bool(SELFATTN_BUILT_sm90a), kHopperComputeCapability, kHopperComputeCapability},
};

}  // namespace

bool kernels_usable(const ContextState& ctx, KernelArch arch) {
  if (arch == KernelArch::sm90a && !ctx.hopper_kernels) return false;
  const int capability = ctx.device->compute_capability();
  for (const ArchRow& row : kArchitectures) {
    if (row.arch == arch) {
      const bool built = ctx.device->backend() == Backend::sim || row.built;
      return built && capability >= row.min_capability && capability <= row.max_capability;
    }
  }
  return false;
}

bool hopper_kernels_usable(const ContextState& ctx) { return kernels_usable(ctx, KernelArch::sm90a); }

}  // namespace selfattn::detail
