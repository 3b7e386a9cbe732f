// Instances of forward/dequantize_fp8.cuh: the path's element (f32, f16, bf16) x the FP8 format.
#include "../forward/dequantize_fp8.cuh"
#include "../registry.h"

SELFATTN_KERNELS_BEGIN

namespace {
template <class F>
KernelRef dequantize_to(Element element, const char* f32, const char* f16, const char* bf16) {
  switch (element) {
    case Element::f32: return make_kernel_ref<DequantizeFp8Params, dequantize_fp8_kernel<float, F>>(f32);
    case Element::f16: return make_kernel_ref<DequantizeFp8Params, dequantize_fp8_kernel<__half, F>>(f16);
    case Element::bf16: return make_kernel_ref<DequantizeFp8Params, dequantize_fp8_kernel<__nv_bfloat16, F>>(bf16);
  }
  return {};
}
}  // namespace

KernelRef dequantize_fp8_kernel_ref(Element element, CacheElement format) {
  switch (format) {
    case CacheElement::e4m3:
      return dequantize_to<__nv_fp8_e4m3>(element, "dequantize_fp8<f32,e4m3>", "dequantize_fp8<f16,e4m3>",
                                          "dequantize_fp8<bf16,e4m3>");
    case CacheElement::e5m2:
      return dequantize_to<__nv_fp8_e5m2>(element, "dequantize_fp8<f32,e5m2>", "dequantize_fp8<f16,e5m2>",
                                          "dequantize_fp8<bf16,e5m2>");
  }
  return {};
}

SELFATTN_KERNELS_END
