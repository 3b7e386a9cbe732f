// Instances of backward/backward_scores.cuh: one per element type of P and dS.
#include "../backward/backward_scores.cuh"
#include "../registry.h"

SELFATTN_KERNELS_BEGIN

BackwardKernel backward_scores_instance(Element p_elem) {
  using Traits = BackwardScoresTraits;
  const auto make = [](KernelRef ref) { return BackwardKernel{ref, Traits::kThreads, Traits::kRowsPerBlock, 0}; };
  switch (p_elem) {
    case Element::f32:
      return make(make_kernel_ref<BackwardScoresParams, backward_scores_kernel<float>>("backward_scores<f32>"));
    case Element::f16:
      return make(make_kernel_ref<BackwardScoresParams, backward_scores_kernel<__half>>("backward_scores<f16>"));
    case Element::bf16:
      return make(
          make_kernel_ref<BackwardScoresParams, backward_scores_kernel<__nv_bfloat16>>("backward_scores<bf16>"));
  }
  return {};
}

SELFATTN_KERNELS_END
