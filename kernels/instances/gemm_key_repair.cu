#include "../unfused/gemm_key_repair.cuh"
#include "../registry.h"

SELFATTN_KERNELS_BEGIN

KernelRef gemm_key_repair_kernel_ref() {
  return make_kernel_ref<GemmKeyRepairParams, gemm_key_repair_kernel>("gemm_key_repair_kernel");
}

SELFATTN_KERNELS_END
