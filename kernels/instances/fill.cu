#include "../common/fill.cuh"
#include "../registry.h"

SELFATTN_KERNELS_BEGIN

KernelRef fill_kernel_ref() { return make_kernel_ref<FillParams, fill_kernel>("fill_kernel"); }

SELFATTN_KERNELS_END
