// Instances of decode/kv_append.cuh, one per element type.
#include "../decode/kv_append.cuh"
#include "../registry.h"

SELFATTN_KERNELS_BEGIN

DecodeKernel kv_append_instance(Element element) {
  using Traits = KvAppendTraits;
  switch (element) {
    case Element::f32:
      return {make_kernel_ref<KvAppendParams, kv_append_kernel<float>>("kv_append<f32>"), Traits::kThreads, Traits::kRowsPerBlock, 0, 0};
    case Element::f16:
      return {make_kernel_ref<KvAppendParams, kv_append_kernel<__half>>("kv_append<f16>"), Traits::kThreads, Traits::kRowsPerBlock, 0, 0};
    case Element::bf16:
      return {make_kernel_ref<KvAppendParams, kv_append_kernel<__nv_bfloat16>>("kv_append<bf16>"), Traits::kThreads, Traits::kRowsPerBlock, 0, 0};
  }
  return {};
}

SELFATTN_KERNELS_END
