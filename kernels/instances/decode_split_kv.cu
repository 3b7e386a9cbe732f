// Instances of decode/decode_split_kv.cuh and decode/decode_combine.cuh, one per element type, and
// of decode/decode_split_kv_mma.cuh for f16/bf16 at head_dim 64 and 128.
#include "../decode/decode_combine.cuh"
#include "../decode/decode_split_kv.cuh"
#include "../decode/decode_split_kv_mma.cuh"
#include "../registry.h"

SELFATTN_KERNELS_BEGIN

namespace {
template <class T>
DecodeKernel split_kv(const char* name, int head_dim, int head_dim_v) {
  using Traits = DecodeSplitKvTraits;
  DecodeKernel kernel{make_kernel_ref<DecodeSplitKvParams, decode_split_kv_kernel<T>>(name), Traits::kThreads,
                      Traits::kRows, Traits::smem_bytes(head_dim, head_dim_v), Traits::kMaxHeadDim};
  return kernel;
}
template <class T, int D>
DecodeKernel split_kv_mma(const char* name) {
  using Traits = DecodeSplitKvMmaTraits<D>;
  return {make_kernel_ref<DecodeSplitKvParams, decode_split_kv_mma_kernel<T, D>>(name), Traits::kThreads,
          Traits::kRows, Traits::kSmemBytes, D};
}
// decode_combine holds kMaxColumnsPerThread of a row's columns per thread: every head_dim_v a
// split-KV kernel takes (the latent kernel's 512: decode_latent_mma.cu).
static_assert(DecodeCombineTraits::kThreads * DecodeCombineTraits::kMaxColumnsPerThread >= DecodeSplitKvTraits::kMaxHeadDim,
              "decode_combine covers the SIMT kernel's head dims");
template <class T>
DecodeKernel combine(const char* name) {
  return {make_kernel_ref<DecodeCombineParams, decode_combine_kernel<T>>(name), DecodeCombineTraits::kThreads, 1,
          DecodeCombineTraits::kSmemBytes, 0};
}
}  // namespace

DecodeKernel decode_split_kv_instance(Element element, int head_dim, int head_dim_v) {
  switch (element) {
    case Element::f32: return split_kv<float>("decode_split_kv<f32>", head_dim, head_dim_v);
    case Element::f16: return split_kv<__half>("decode_split_kv<f16>", head_dim, head_dim_v);
    case Element::bf16: return split_kv<__nv_bfloat16>("decode_split_kv<bf16>", head_dim, head_dim_v);
  }
  return {};
}

DecodeKernel decode_split_kv_mma_instance(Element element, int head_dim) {
  if (element == Element::f16 && head_dim == 64) return split_kv_mma<__half, 64>("decode_split_kv_mma<f16,64>");
  if (element == Element::f16 && head_dim == 128) return split_kv_mma<__half, 128>("decode_split_kv_mma<f16,128>");
  if (element == Element::bf16 && head_dim == 64) return split_kv_mma<__nv_bfloat16, 64>("decode_split_kv_mma<bf16,64>");
  if (element == Element::bf16 && head_dim == 128) return split_kv_mma<__nv_bfloat16, 128>("decode_split_kv_mma<bf16,128>");
  return {};
}

DecodeKernel decode_combine_instance(Element element) {
  switch (element) {
    case Element::f32: return combine<float>("decode_combine<f32>");
    case Element::f16: return combine<__half>("decode_combine<f16>");
    case Element::bf16: return combine<__nv_bfloat16>("decode_combine<bf16>");
  }
  return {};
}

SELFATTN_KERNELS_END
