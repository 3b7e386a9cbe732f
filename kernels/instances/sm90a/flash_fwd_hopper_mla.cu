// Hopper fused attention (wgmma + TMA) at MLA's prefill head dims: q and k of 192, v and out of 128.
// nvcc builds it for sm_90a only (kernels/CMakeLists.txt).
#include "hopper/flash_fwd_hopper.cuh"
#include "registry.h"

SELFATTN_KERNELS_BEGIN

template FlashFwdHopperInstance flash_fwd_hopper_instance<Element::f16, 192, 128>();
template FlashFwdHopperInstance flash_fwd_hopper_instance<Element::bf16, 192, 128>();

SELFATTN_KERNELS_END
