// Instances of decode/merge_states.cuh, one per element type.
#include "../decode/merge_states.cuh"
#include "../registry.h"

SELFATTN_KERNELS_BEGIN

DecodeKernel merge_states_instance(Element element) {
  using Traits = MergeStatesTraits;
  switch (element) {
    case Element::f32:
      return {make_kernel_ref<MergeStatesParams, merge_states_kernel<float>>("merge_states<f32>"), Traits::kThreads, 1, 0, 0};
    case Element::f16:
      return {make_kernel_ref<MergeStatesParams, merge_states_kernel<__half>>("merge_states<f16>"), Traits::kThreads, 1, 0, 0};
    case Element::bf16:
      return {make_kernel_ref<MergeStatesParams, merge_states_kernel<__nv_bfloat16>>("merge_states<bf16>"), Traits::kThreads, 1, 0, 0};
  }
  return {};
}

SELFATTN_KERNELS_END
