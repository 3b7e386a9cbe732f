// The exact-fp32 fused kernel, for every element type: fp32 inputs, and f16/bf16 head dims or
// alignments the tensor-core kernel does not take.
#include "../forward/flash_fwd_simt.cuh"
#include "../registry.h"

SELFATTN_KERNELS_BEGIN

FlashFwdInstance flash_fwd_simt_instance(Element element, int head_dim) {
  if (head_dim < 1 || head_dim > FlashFwdSimtTraits::kMaxHeadDim) return FlashFwdInstance{};
  switch (element) {
    case Element::f32: return flash_fwd_simt_instance_for<float>(head_dim);
    case Element::f16: return flash_fwd_simt_instance_for<__half>(head_dim);
    case Element::bf16: return flash_fwd_simt_instance_for<__nv_bfloat16>(head_dim);
  }
  return FlashFwdInstance{};
}

SELFATTN_KERNELS_END
