// Instances of backward/grad_kv_tiled.cuh: the SIMT kernel for each dtype, the tensor-core kernel
// for f16/bf16.
#include "../backward/grad_kv_tiled.cuh"
#include "../registry.h"

SELFATTN_KERNELS_BEGIN

namespace {
template <class T>
TiledKernel simt_grad_kv(const char* name) {
  using Tile = SimtTileTraits;
  return {make_kernel_ref<GradKvParams, grad_kv_tiled_simt_kernel<T>>(name), Tile::kTileM, Tile::kTileN,
          Tile::kThreads, Tile::kSmemBytes};
}
template <class T>
TiledKernel mma_grad_kv(const char* name) {
  using Tile = MmaTileTraits;
  return {make_kernel_ref<GradKvParams, grad_kv_tiled_mma_kernel<T>>(name), Tile::kTileM, Tile::kTileN,
          Tile::kThreads, Tile::kSmemBytesKn};
}
// Tensor cores from head_dim 16 on, as the forward's tiles (instances/pv_tiled.cu): below it the
// 64-column tile would be mostly padding.
constexpr int kMmaMinHeadDim = 16;
}  // namespace

TiledKernel grad_kv_tiled_instance(Element elem, int head_dim) {
  const bool mma = head_dim >= kMmaMinHeadDim;
  switch (elem) {
    case Element::f32: return simt_grad_kv<float>("grad_kv_tiled_simt_kernel<f32>");
    case Element::f16:
      return mma ? mma_grad_kv<__half>("grad_kv_tiled_mma_kernel<f16>")
                 : simt_grad_kv<__half>("grad_kv_tiled_simt_kernel<f16>");
    case Element::bf16:
      return mma ? mma_grad_kv<__nv_bfloat16>("grad_kv_tiled_mma_kernel<bf16>")
                 : simt_grad_kv<__nv_bfloat16>("grad_kv_tiled_simt_kernel<bf16>");
  }
  return {};
}

SELFATTN_KERNELS_END
