// Instances of decode/decode_split_kv.cuh (the SIMT kernel) over FP8 caches: q/out f32, f16 or
// bf16 x cache e4m3 or e5m2. Their splits are combined by decode_split_kv.cu's decode_combine
// (out's element). The tensor-core FP8 instances: decode_split_kv_mma_fp8.cu.
#include "../decode/decode_split_kv.cuh"
#include "../registry.h"

SELFATTN_KERNELS_BEGIN

namespace {
template <class T, class C>
DecodeKernel split_kv(const char* name, int head_dim, int head_dim_v) {
  using Traits = DecodeSplitKvTraits;
  return {make_kernel_ref<DecodeSplitKvParams, decode_split_kv_kernel<T, C>>(name), Traits::kThreads, Traits::kRows,
          Traits::smem_bytes(head_dim, head_dim_v), Traits::kMaxHeadDim};
}
template <class C>
DecodeKernel split_kv_over(Element q_element, int head_dim, int head_dim_v, const char* f32, const char* f16,
                           const char* bf16) {
  switch (q_element) {
    case Element::f32: return split_kv<float, C>(f32, head_dim, head_dim_v);
    case Element::f16: return split_kv<__half, C>(f16, head_dim, head_dim_v);
    case Element::bf16: return split_kv<__nv_bfloat16, C>(bf16, head_dim, head_dim_v);
  }
  return {};
}
}  // namespace

DecodeKernel decode_split_kv_fp8_instance(Element q_element, CacheElement cache, int head_dim, int head_dim_v) {
  switch (cache) {
    case CacheElement::e4m3:
      return split_kv_over<__nv_fp8_e4m3>(q_element, head_dim, head_dim_v, "decode_split_kv<f32,e4m3>",
                                          "decode_split_kv<f16,e4m3>", "decode_split_kv<bf16,e4m3>");
    case CacheElement::e5m2:
      return split_kv_over<__nv_fp8_e5m2>(q_element, head_dim, head_dim_v, "decode_split_kv<f32,e5m2>",
                                          "decode_split_kv<f16,e5m2>", "decode_split_kv<bf16,e5m2>");
  }
  return {};
}

SELFATTN_KERNELS_END
