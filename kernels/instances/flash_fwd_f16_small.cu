// Tensor-core fused attention, f16, the small head dims (one file per dtype and size class, so a
// clean build compiles them in parallel).
#include "../forward/flash_fwd.cuh"
#include "../registry.h"

SELFATTN_KERNELS_BEGIN

template FlashFwdInstance flash_fwd_instance<Element::f16, 32>();
template FlashFwdInstance flash_fwd_instance<Element::f16, 64>();
template FlashFwdInstance flash_fwd_instance<Element::f16, 96>();

SELFATTN_KERNELS_END
