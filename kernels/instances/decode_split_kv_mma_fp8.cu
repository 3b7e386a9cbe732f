// Instances of decode/decode_split_kv_mma.cuh (tensor cores) over FP8 caches: q/out f16 or bf16 x
// head_dim 64 or 128 x cache e4m3 or e5m2. Splits are combined by decode_split_kv.cu's
// decode_combine (out's element).
#include "../decode/decode_split_kv_mma.cuh"
#include "../registry.h"

SELFATTN_KERNELS_BEGIN

namespace {
template <class T, int D, class C>
DecodeKernel split_kv_mma(const char* name) {
  using Traits = DecodeSplitKvMmaTraits<D>;
  return {make_kernel_ref<DecodeSplitKvParams, decode_split_kv_mma_kernel<T, D, C>>(name), Traits::kThreads,
          Traits::kRows, Traits::kSmemBytes, D};
}
template <class C>
DecodeKernel split_kv_mma_over(Element q_element, int head_dim, const char* const (&names)[4]) {
  if (q_element == Element::f16 && head_dim == 64) return split_kv_mma<__half, 64, C>(names[0]);
  if (q_element == Element::f16 && head_dim == 128) return split_kv_mma<__half, 128, C>(names[1]);
  if (q_element == Element::bf16 && head_dim == 64) return split_kv_mma<__nv_bfloat16, 64, C>(names[2]);
  if (q_element == Element::bf16 && head_dim == 128) return split_kv_mma<__nv_bfloat16, 128, C>(names[3]);
  return {};
}
constexpr const char* kE4m3Names[4] = {"decode_split_kv_mma<f16,64,e4m3>", "decode_split_kv_mma<f16,128,e4m3>",
                                       "decode_split_kv_mma<bf16,64,e4m3>", "decode_split_kv_mma<bf16,128,e4m3>"};
constexpr const char* kE5m2Names[4] = {"decode_split_kv_mma<f16,64,e5m2>", "decode_split_kv_mma<f16,128,e5m2>",
                                       "decode_split_kv_mma<bf16,64,e5m2>", "decode_split_kv_mma<bf16,128,e5m2>"};
}  // namespace

DecodeKernel decode_split_kv_mma_fp8_instance(Element q_element, CacheElement cache, int head_dim) {
  switch (cache) {
    case CacheElement::e4m3: return split_kv_mma_over<__nv_fp8_e4m3>(q_element, head_dim, kE4m3Names);
    case CacheElement::e5m2: return split_kv_mma_over<__nv_fp8_e5m2>(q_element, head_dim, kE5m2Names);
  }
  return {};
}

SELFATTN_KERNELS_END
