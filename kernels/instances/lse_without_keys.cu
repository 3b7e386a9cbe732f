#include "../common/lse_without_keys.cuh"
#include "../registry.h"

SELFATTN_KERNELS_BEGIN

KernelRef lse_without_keys_kernel_ref() {
  return make_kernel_ref<LseWithoutKeysParams, lse_without_keys_kernel>("lse_without_keys_kernel");
}

SELFATTN_KERNELS_END
