#pragma once
// Host-side view of the kernel instances: one lookup per kernel family, declared for both builds
// of the kernel source. Host code includes this (never a .cuh) and picks sim_target:: or
// cuda_target:: by the context's backend; the cuda_target definitions exist only when nvcc built them.
#include "backward/backward_params.h"
#include "backward/flash_bwd_params.h"
#include "decode/kv_cache_params.h"
#include "forward/flash_fwd_params.h"
#include "hopper/flash_fwd_hopper_params.h"
#include "launch.h"
#include "params.h"
#include "unfused/naive_params.h"

namespace selfattn::kernels {
namespace sim_target {
#include "registry.inc"
}
namespace cuda_target {
#include "registry.inc"
}
}  // namespace selfattn::kernels
