// Instances of decode/decode_latent_mma.cuh: DeepSeek's absorbed MLA shape (576, 512), q f16/bf16
// over a cache of q's element, and bf16 q over an e4m3 cache (FlashMLA's FP8 decode). Their splits
// are combined by decode_split_kv.cu's decode_combine.
#include "../decode/decode_combine.cuh"
#include "../decode/decode_latent_mma.cuh"
#include "../registry.h"

SELFATTN_KERNELS_BEGIN

namespace {
template <class T, int DQK, int DV, class Cache = T>
DecodeKernel latent(const char* name) {
  using Traits = DecodeLatentMmaTraits<DQK, DV>;
  return {make_kernel_ref<DecodeSplitKvParams, decode_latent_mma_kernel<T, DQK, DV, Cache>>(name), Traits::kThreads,
          Traits::kRows, Traits::kSmemBytes, DQK};
}
static_assert(DecodeCombineTraits::kThreads * DecodeCombineTraits::kMaxColumnsPerThread >= 512,
              "decode_combine covers the latent kernel's head_dim_v");
}  // namespace

DecodeKernel decode_latent_mma_instance(Element element, int head_dim, int head_dim_v) {
  if (head_dim != 576 || head_dim_v != 512) return {};
  if (element == Element::f16) return latent<__half, 576, 512>("decode_latent_mma<f16,576,512>");
  if (element == Element::bf16) return latent<__nv_bfloat16, 576, 512>("decode_latent_mma<bf16,576,512>");
  return {};
}

DecodeKernel decode_latent_mma_fp8_instance(Element q_element, CacheElement cache, int head_dim, int head_dim_v) {
  if (head_dim != 576 || head_dim_v != 512 || q_element != Element::bf16 || cache != CacheElement::e4m3) return {};
  return latent<__nv_bfloat16, 576, 512, __nv_fp8_e4m3>("decode_latent_mma<bf16,576,512,e4m3>");
}

SELFATTN_KERNELS_END
