// Hopper fused attention on FP8 (e4m3 q, k, v; f16 or bf16 out); its V^T pre-pass is
// transpose_v_fp8.cu. nvcc builds it for sm_90a only (kernels/CMakeLists.txt).
#include "hopper/flash_fwd_hopper_fp8.cuh"
#include "registry.h"

SELFATTN_KERNELS_BEGIN

template FlashFwdHopperInstance flash_fwd_hopper_fp8_instance<Element::f16, 128>();
template FlashFwdHopperInstance flash_fwd_hopper_fp8_instance<Element::bf16, 128>();
template FlashFwdHopperInstance flash_fwd_hopper_fp8_instance<Element::f16, 256>();
template FlashFwdHopperInstance flash_fwd_hopper_fp8_instance<Element::bf16, 256>();

SELFATTN_KERNELS_END
