// Instances of decode/rotary_rows.cuh, one per element type.
#include "../decode/rotary_rows.cuh"
#include "../registry.h"

SELFATTN_KERNELS_BEGIN

DecodeKernel rotary_rows_instance(Element element) {
  using Traits = RotaryRowsTraits;
  switch (element) {
    case Element::f32:
      return {make_kernel_ref<RotaryRowsParams, rotary_rows_kernel<float>>("rotary_rows<f32>"), Traits::kThreads, Traits::kRowsPerBlock, 0, 0};
    case Element::f16:
      return {make_kernel_ref<RotaryRowsParams, rotary_rows_kernel<__half>>("rotary_rows<f16>"), Traits::kThreads, Traits::kRowsPerBlock, 0, 0};
    case Element::bf16:
      return {make_kernel_ref<RotaryRowsParams, rotary_rows_kernel<__nv_bfloat16>>("rotary_rows<bf16>"), Traits::kThreads, Traits::kRowsPerBlock, 0, 0};
  }
  return {};
}

SELFATTN_KERNELS_END
