// Instances of pv_tiled.cuh: the SIMT kernel for each dtype, the tensor-core kernel for f16/bf16.
#include "../unfused/pv_tiled.cuh"
#include "../registry.h"

SELFATTN_KERNELS_BEGIN

namespace {
template <class T>
TiledKernel simt_pv(const char* name) {
  using Tile = SimtTileTraits;
  return {make_kernel_ref<PvParams, pv_tiled_simt_kernel<T>>(name), Tile::kTileM, Tile::kTileN, Tile::kThreads,
          Tile::kSmemBytes};
}
template <class T>
TiledKernel mma_pv(const char* name) {
  using Tile = MmaTileTraits;
  return {make_kernel_ref<PvParams, pv_tiled_mma_kernel<T>>(name), Tile::kTileM, Tile::kTileN, Tile::kThreads,
          Tile::kSmemBytesKn};
}

// Tensor cores from head_dim 16 on: below it the 64-column tile would be mostly padding.
constexpr int kMmaMinHeadDim = 16;
}  // namespace

TiledKernel pv_tiled_instance(Element elem, int head_dim) {
  const bool mma = head_dim >= kMmaMinHeadDim;
  switch (elem) {
    case Element::f32: return simt_pv<float>("pv_tiled_simt_kernel<f32>");
    case Element::f16:
      return mma ? mma_pv<__half>("pv_tiled_mma_kernel<f16>") : simt_pv<__half>("pv_tiled_simt_kernel<f16>");
    case Element::bf16:
      return mma ? mma_pv<__nv_bfloat16>("pv_tiled_mma_kernel<bf16>")
                 : simt_pv<__nv_bfloat16>("pv_tiled_simt_kernel<bf16>");
  }
  return {};
}

SELFATTN_KERNELS_END
