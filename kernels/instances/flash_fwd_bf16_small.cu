// Tensor-core fused attention, bf16, the small head dims (one file per dtype and size class, so a
// clean build compiles them in parallel).
#include "../forward/flash_fwd.cuh"
#include "../registry.h"

SELFATTN_KERNELS_BEGIN

template FlashFwdInstance flash_fwd_instance<Element::bf16, 32>();
template FlashFwdInstance flash_fwd_instance<Element::bf16, 64>();
template FlashFwdInstance flash_fwd_instance<Element::bf16, 96>();

SELFATTN_KERNELS_END
