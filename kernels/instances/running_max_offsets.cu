#include "../forward/running_max_offsets.cuh"
#include "../registry.h"

SELFATTN_KERNELS_BEGIN

KernelRef running_max_offsets_kernel_ref() {
  return make_kernel_ref<RunningMaxOffsetsParams, running_max_offsets_kernel>("running_max_offsets_kernel");
}

SELFATTN_KERNELS_END
