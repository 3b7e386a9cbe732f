// Instances of the kernels every backward path shares (backward/backward_dot.cuh,
// backward/store_gradient.cuh, one per element type each; backward/sink_gradient.cuh, fp32 only).
#include "../backward/backward_dot.cuh"
#include "../backward/sink_gradient.cuh"
#include "../backward/store_gradient.cuh"
#include "../registry.h"

SELFATTN_KERNELS_BEGIN

BackwardKernel backward_dot_instance(Element element) {
  using Traits = BackwardDotTraits;
  const auto make = [](KernelRef ref) { return BackwardKernel{ref, Traits::kThreads, Traits::kRowsPerBlock, 0}; };
  switch (element) {
    case Element::f32: return make(make_kernel_ref<BackwardDotParams, backward_dot_kernel<float>>("backward_dot<f32>"));
    case Element::f16: return make(make_kernel_ref<BackwardDotParams, backward_dot_kernel<__half>>("backward_dot<f16>"));
    case Element::bf16:
      return make(make_kernel_ref<BackwardDotParams, backward_dot_kernel<__nv_bfloat16>>("backward_dot<bf16>"));
  }
  return {};
}

BackwardKernel store_gradient_instance(Element element) {
  using Traits = StoreGradientTraits;
  const auto make = [](KernelRef ref) { return BackwardKernel{ref, Traits::kThreads, 1, 0}; };
  switch (element) {
    case Element::f32:
      return make(make_kernel_ref<StoreGradientParams, store_gradient_kernel<float>>("store_gradient<f32>"));
    case Element::f16:
      return make(make_kernel_ref<StoreGradientParams, store_gradient_kernel<__half>>("store_gradient<f16>"));
    case Element::bf16:
      return make(make_kernel_ref<StoreGradientParams, store_gradient_kernel<__nv_bfloat16>>("store_gradient<bf16>"));
  }
  return {};
}

BackwardKernel sink_gradient_instance() {
  using Traits = SinkGradientTraits;
  return BackwardKernel{make_kernel_ref<SinkGradientParams, sink_gradient_kernel>("sink_gradient"), Traits::kThreads, 1,
                        Traits::kSmemBytes};
}

SELFATTN_KERNELS_END
