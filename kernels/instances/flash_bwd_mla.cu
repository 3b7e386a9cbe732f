// Fused backward kernels at MLA's prefill head dims: q, k, dq and dk of 192, v, dout and dv of 128.
#include "../backward/flash_bwd_dkdv.cuh"
#include "../backward/flash_bwd_dq.cuh"
#include "../registry.h"

SELFATTN_KERNELS_BEGIN

template FlashBwdInstance flash_bwd_dkdv_instance<Element::f16, 192, 128>();
template FlashBwdInstance flash_bwd_dq_instance<Element::f16, 192, 128>();
template FlashBwdInstance flash_bwd_dkdv_instance<Element::bf16, 192, 128>();
template FlashBwdInstance flash_bwd_dq_instance<Element::bf16, 192, 128>();

SELFATTN_KERNELS_END
