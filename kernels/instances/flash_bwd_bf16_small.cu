// Fused backward kernels, bf16, the small head dims (one file per dtype and size class, so a clean
// build compiles them in parallel).
#include "../backward/flash_bwd_dkdv.cuh"
#include "../backward/flash_bwd_dq.cuh"
#include "../registry.h"

SELFATTN_KERNELS_BEGIN

template FlashBwdInstance flash_bwd_dkdv_instance<Element::bf16, 32, 32>();
template FlashBwdInstance flash_bwd_dq_instance<Element::bf16, 32, 32>();
template FlashBwdInstance flash_bwd_dkdv_instance<Element::bf16, 64, 64>();
template FlashBwdInstance flash_bwd_dq_instance<Element::bf16, 64, 64>();

SELFATTN_KERNELS_END
