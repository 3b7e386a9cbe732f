// Tensor-core fused attention, f16, the large head dims.
#include "../forward/flash_fwd.cuh"
#include "../registry.h"

SELFATTN_KERNELS_BEGIN

template FlashFwdInstance flash_fwd_instance<Element::f16, 128>();
template FlashFwdInstance flash_fwd_instance<Element::f16, 256>();

SELFATTN_KERNELS_END
