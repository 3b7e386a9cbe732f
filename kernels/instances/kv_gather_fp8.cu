// Instances of decode/kv_gather.cuh from FP8 caches: gathered (q's element) f32, f16 or bf16 x
// cache e4m3 or e5m2, dequantized on the way.
#include "../decode/kv_gather.cuh"
#include "../registry.h"

SELFATTN_KERNELS_BEGIN

namespace {
template <class T, class C>
DecodeKernel gather(const char* name) {
  using Traits = KvGatherTraits;
  return {make_kernel_ref<KvGatherParams, kv_gather_kernel<T, C>>(name), Traits::kThreads, Traits::kRowsPerBlock, 0, 0};
}
template <class C>
DecodeKernel gather_from(Element gathered, const char* f32, const char* f16, const char* bf16) {
  switch (gathered) {
    case Element::f32: return gather<float, C>(f32);
    case Element::f16: return gather<__half, C>(f16);
    case Element::bf16: return gather<__nv_bfloat16, C>(bf16);
  }
  return {};
}
}  // namespace

DecodeKernel kv_gather_fp8_instance(Element gathered, CacheElement cache) {
  switch (cache) {
    case CacheElement::e4m3:
      return gather_from<__nv_fp8_e4m3>(gathered, "kv_gather<f32,e4m3>", "kv_gather<f16,e4m3>", "kv_gather<bf16,e4m3>");
    case CacheElement::e5m2:
      return gather_from<__nv_fp8_e5m2>(gathered, "kv_gather<f32,e5m2>", "kv_gather<f16,e5m2>", "kv_gather<bf16,e5m2>");
  }
  return {};
}

SELFATTN_KERNELS_END
