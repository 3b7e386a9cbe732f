// Instances of qk_tiled.cuh: the SIMT kernel for each dtype, the tensor-core kernel for f16/bf16.
#include "../unfused/qk_tiled.cuh"
#include "../registry.h"

SELFATTN_KERNELS_BEGIN

namespace {
template <class T>
TiledKernel simt_qk(const char* name) {
  using Tile = SimtTileTraits;
  return {make_kernel_ref<QkParams, qk_tiled_simt_kernel<T>>(name), Tile::kTileM, Tile::kTileN, Tile::kThreads,
          Tile::kSmemBytes};
}
template <class T>
TiledKernel mma_qk(const char* name) {
  using Tile = MmaTileTraits;
  return {make_kernel_ref<QkParams, qk_tiled_mma_kernel<T>>(name), Tile::kTileM, Tile::kTileN, Tile::kThreads,
          Tile::kSmemBytesNk};
}

// Tensor cores from head_dim 16 on: below it the zero-padded slice of 32 would be mostly padding.
constexpr int kMmaMinHeadDim = 16;
}  // namespace

TiledKernel qk_tiled_instance(Element elem, int head_dim) {
  const bool mma = head_dim >= kMmaMinHeadDim;
  switch (elem) {
    case Element::f32: return simt_qk<float>("qk_tiled_simt_kernel<f32>");
    case Element::f16:
      return mma ? mma_qk<__half>("qk_tiled_mma_kernel<f16>") : simt_qk<__half>("qk_tiled_simt_kernel<f16>");
    case Element::bf16:
      return mma ? mma_qk<__nv_bfloat16>("qk_tiled_mma_kernel<bf16>")
                 : simt_qk<__nv_bfloat16>("qk_tiled_simt_kernel<bf16>");
  }
  return {};
}

SELFATTN_KERNELS_END
