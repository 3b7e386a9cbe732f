#pragma once
// The host's enums as the kernels spell them (kernels/ knows nothing of the public API).
#include "../../kernels/params.h"
#include "selfattn/types.h"

namespace selfattn::detail {

inline kernels::Element element_of(DType dtype) {
  switch (dtype) {
    case DType::f32: return kernels::Element::f32;
    case DType::f16: return kernels::Element::f16;
    case DType::bf16: return kernels::Element::bf16;
  }
  return kernels::Element::f32;
}

inline kernels::CausalMask causal_mask_of(Causal causal) {
  switch (causal) {
    case Causal::none: return kernels::CausalMask::none;
    case Causal::top_left: return kernels::CausalMask::top_left;
    case Causal::bottom_right: return kernels::CausalMask::bottom_right;
  }
  return kernels::CausalMask::none;
}

}  // namespace selfattn::detail
