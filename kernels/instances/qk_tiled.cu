// Instances of qk_tiled.cuh: the SIMT kernel for each dtype.
#include "../qk_tiled.cuh"
#include "../registry.h"

SELFATTN_KERNELS_BEGIN

namespace {
template <class T>
TiledKernel simt_qk(const char* name) {
  using Tile = SimtTileTraits;
  return {make_kernel_ref<QkParams, qk_tiled_simt_kernel<T>>(name), Tile::kTileM, Tile::kTileN, Tile::kThreads,
          Tile::kSmemBytes};
}
}  // namespace

TiledKernel qk_tiled_instance(Element elem, int /*head_dim*/) {
  switch (elem) {
    case Element::f32: return simt_qk<float>("qk_tiled_simt_kernel<f32>");
    case Element::f16: return simt_qk<__half>("qk_tiled_simt_kernel<f16>");
    case Element::bf16: return simt_qk<__nv_bfloat16>("qk_tiled_simt_kernel<bf16>");
  }
  return {};
}

SELFATTN_KERNELS_END
