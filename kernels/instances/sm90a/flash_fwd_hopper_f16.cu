// Hopper fused attention (wgmma + TMA), f16. nvcc builds it for sm_90a only (kernels/CMakeLists.txt).
#include "hopper/flash_fwd_hopper.cuh"
#include "registry.h"

SELFATTN_KERNELS_BEGIN

template FlashFwdHopperInstance flash_fwd_hopper_instance<Element::f16, 64, 64>();
template FlashFwdHopperInstance flash_fwd_hopper_instance<Element::f16, 128, 128>();
template FlashFwdHopperInstance flash_fwd_hopper_instance<Element::f16, 256, 256>();

SELFATTN_KERNELS_END
