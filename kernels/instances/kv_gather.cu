// Instances of decode/kv_gather.cuh, one per element type.
#include "../decode/kv_gather.cuh"
#include "../registry.h"

SELFATTN_KERNELS_BEGIN

DecodeKernel kv_gather_instance(Element element) {
  using Traits = KvGatherTraits;
  switch (element) {
    case Element::f32:
      return {make_kernel_ref<KvGatherParams, kv_gather_kernel<float>>("kv_gather<f32>"), Traits::kThreads, Traits::kRowsPerBlock, 0, 0};
    case Element::f16:
      return {make_kernel_ref<KvGatherParams, kv_gather_kernel<__half>>("kv_gather<f16>"), Traits::kThreads, Traits::kRowsPerBlock, 0, 0};
    case Element::bf16:
      return {make_kernel_ref<KvGatherParams, kv_gather_kernel<__nv_bfloat16>>("kv_gather<bf16>"), Traits::kThreads, Traits::kRowsPerBlock, 0, 0};
  }
  return {};
}

SELFATTN_KERNELS_END
