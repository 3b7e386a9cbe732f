// dQ = dS K for the naive backward: pv_tiled.cuh's kernels with dq's element type. Same-type
// outputs are the forward's instances (instances/pv_tiled.cu); this file adds fp32 dq for f16/bf16.
#include "../unfused/pv_tiled.cuh"
#include "../registry.h"

SELFATTN_KERNELS_BEGIN

namespace {
template <class T>
TiledKernel simt_dq(const char* name) {
  using Tile = SimtTileTraits;
  return {make_kernel_ref<PvParams, pv_tiled_simt_kernel<T, float>>(name), Tile::kTileM, Tile::kTileN, Tile::kThreads,
          Tile::kSmemBytes};
}
template <class T>
TiledKernel mma_dq(const char* name) {
  using Tile = MmaTileTraits;
  return {make_kernel_ref<PvParams, pv_tiled_mma_kernel<T, float>>(name), Tile::kTileM, Tile::kTileN, Tile::kThreads,
          Tile::kSmemBytesKn};
}
// The forward's choice (instances/pv_tiled.cu): tensor cores from head_dim 16 on.
constexpr int kMmaMinHeadDim = 16;
}  // namespace

TiledKernel dq_tiled_instance(Element elem, Element out, int head_dim) {
  if (out == elem) return pv_tiled_instance(elem, head_dim);
  if (out != Element::f32) return {};
  const bool mma = head_dim >= kMmaMinHeadDim;
  switch (elem) {
    case Element::f32: return {};  // out == elem above
    case Element::f16:
      return mma ? mma_dq<__half>("pv_tiled_mma_kernel<f16, f32 out>") : simt_dq<__half>("pv_tiled_simt_kernel<f16, f32 out>");
    case Element::bf16:
      return mma ? mma_dq<__nv_bfloat16>("pv_tiled_mma_kernel<bf16, f32 out>")
                 : simt_dq<__nv_bfloat16>("pv_tiled_simt_kernel<bf16, f32 out>");
  }
  return {};
}

SELFATTN_KERNELS_END
