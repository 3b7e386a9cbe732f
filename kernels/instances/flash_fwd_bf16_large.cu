// Tensor-core fused attention, bf16, the large head dims.
#include "../forward/flash_fwd.cuh"
#include "../registry.h"

SELFATTN_KERNELS_BEGIN

template FlashFwdInstance flash_fwd_instance<Element::bf16, 128>();
template FlashFwdInstance flash_fwd_instance<Element::bf16, 256>();

SELFATTN_KERNELS_END
