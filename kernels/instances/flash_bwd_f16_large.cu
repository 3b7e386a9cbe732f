// Fused backward kernels, f16, the large head dims (one file per dtype and size class, so a clean
// build compiles them in parallel).
#include "../backward/flash_bwd_dkdv.cuh"
#include "../backward/flash_bwd_dq.cuh"
#include "../registry.h"

SELFATTN_KERNELS_BEGIN

template FlashBwdInstance flash_bwd_dkdv_instance<Element::f16, 96, 96>();
template FlashBwdInstance flash_bwd_dq_instance<Element::f16, 96, 96>();
template FlashBwdInstance flash_bwd_dkdv_instance<Element::f16, 128, 128>();
template FlashBwdInstance flash_bwd_dq_instance<Element::f16, 128, 128>();

SELFATTN_KERNELS_END
