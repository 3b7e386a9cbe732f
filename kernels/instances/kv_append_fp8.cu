// Instances of decode/kv_append.cuh into FP8 caches: k_new/v_new f32, f16 or bf16 x cache e4m3 or e5m2.
#include "../decode/kv_append.cuh"
#include "../registry.h"

SELFATTN_KERNELS_BEGIN

namespace {
template <class T, class C>
DecodeKernel append(const char* name) {
  using Traits = KvAppendTraits;
  return {make_kernel_ref<KvAppendParams, kv_append_kernel<T, C>>(name), Traits::kThreads, Traits::kRowsPerBlock, 0, 0};
}
template <class C>
DecodeKernel append_into(Element new_element, const char* f32, const char* f16, const char* bf16) {
  switch (new_element) {
    case Element::f32: return append<float, C>(f32);
    case Element::f16: return append<__half, C>(f16);
    case Element::bf16: return append<__nv_bfloat16, C>(bf16);
  }
  return {};
}
}  // namespace

DecodeKernel kv_append_fp8_instance(Element new_element, CacheElement cache) {
  switch (cache) {
    case CacheElement::e4m3:
      return append_into<__nv_fp8_e4m3>(new_element, "kv_append<f32,e4m3>", "kv_append<f16,e4m3>",
                                        "kv_append<bf16,e4m3>");
    case CacheElement::e5m2:
      return append_into<__nv_fp8_e5m2>(new_element, "kv_append<f32,e5m2>", "kv_append<f16,e5m2>",
                                        "kv_append<bf16,e5m2>");
  }
  return {};
}

SELFATTN_KERNELS_END
