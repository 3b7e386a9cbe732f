// Tensor-core fused attention at MLA's prefill head dims: q and k of 192, v and out of 128.
#include "../forward/flash_fwd.cuh"
#include "../registry.h"

SELFATTN_KERNELS_BEGIN

template FlashFwdInstance flash_fwd_instance<Element::f16, 192, 128>();
template FlashFwdInstance flash_fwd_instance<Element::bf16, 192, 128>();

SELFATTN_KERNELS_END
