// The FP8 forward's V^T pre-pass (hopper/transpose_v_fp8.cuh): plain CUDA, built for every
// architecture like the other kernels (the Hopper FP8 kernel that reads its output is sm_90a's).
#include "../hopper/transpose_v_fp8.cuh"
#include "../registry.h"

SELFATTN_KERNELS_BEGIN

TransposeVFp8Instance transpose_v_fp8_instance() {
  TransposeVFp8Instance instance;
  instance.kernel = make_kernel_ref<TransposeVFp8Params, transpose_v_fp8_kernel>("transpose_v_fp8_kernel");
  instance.keys = TransposeVFp8Traits::kKeys;
  instance.threads = TransposeVFp8Traits::kThreads;
  instance.smem_bytes = TransposeVFp8Traits::kSmemBytes;
  return instance;
}

SELFATTN_KERNELS_END
