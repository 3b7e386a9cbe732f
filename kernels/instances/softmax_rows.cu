// Instances of softmax_rows.cuh: P in f32 / f16 / bf16, each with the three row groups.
#include "../registry.h"
#include "../unfused/softmax_rows.cuh"

SELFATTN_KERNELS_BEGIN

namespace {
template <class P>
SoftmaxKernel softmax_for(int seq_k, const char* warp_cached, const char* block_cached, const char* block_streaming) {
  using Traits = SoftmaxTraits;
  if (seq_k <= 32 * Traits::kCachedPerThread)
    return {make_kernel_ref<SoftmaxParams, softmax_rows_kernel<P, 32, true>>(warp_cached), Traits::kWarpRowsPerBlock,
            32 * Traits::kWarpRowsPerBlock, Traits::kSmemBytes};
  if (seq_k <= Traits::kBlockThreads * Traits::kCachedPerThread)
    return {make_kernel_ref<SoftmaxParams, softmax_rows_kernel<P, Traits::kBlockThreads, true>>(block_cached), 1,
            Traits::kBlockThreads, Traits::kSmemBytes};
  return {make_kernel_ref<SoftmaxParams, softmax_rows_kernel<P, Traits::kBlockThreads, false>>(block_streaming), 1,
          Traits::kBlockThreads, Traits::kSmemBytes};
}
}  // namespace

SoftmaxKernel softmax_rows_instance(Element p_elem, int seq_k) {
  switch (p_elem) {
    case Element::f32:
      return softmax_for<float>(seq_k, "softmax_rows<f32,warp,cached>", "softmax_rows<f32,block,cached>",
                                "softmax_rows<f32,block,streaming>");
    case Element::f16:
      return softmax_for<__half>(seq_k, "softmax_rows<f16,warp,cached>", "softmax_rows<f16,block,cached>",
                                 "softmax_rows<f16,block,streaming>");
    case Element::bf16:
      return softmax_for<__nv_bfloat16>(seq_k, "softmax_rows<bf16,warp,cached>", "softmax_rows<bf16,block,cached>",
                                        "softmax_rows<bf16,block,streaming>");
  }
  return {};
}

SELFATTN_KERNELS_END
