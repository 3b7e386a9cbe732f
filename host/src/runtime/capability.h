#pragma once
// Which kernels a context may run on its device. Every shipped kernel is listed with an
// architecture tag (the kernel lists: kernels/forward/flash_fwd_kernels.inc,
// kernels/hopper/flash_fwd_hopper_kernels.inc, kernels/backward/flash_bwd_kernels.inc): the build
// has nvcc's code for the tag or not, and the device's compute capability runs it or not. The paths
// ask here; Context answers uses_hopper_kernels() from here.
//
// A new architecture: a tag here (KernelArch, its SELFATTN_IF_BUILT_<tag> below, its row in
// capability.cpp), a folder kernels/instances/<tag>/ (which kernels/CMakeLists.txt builds for that
// architecture alone and tells the host of as SELFATTN_BUILT_<tag>), and its lines in the lists.
#include "runtime/context_state.h"

namespace selfattn::detail {

enum class KernelArch {
  sm80,   // the portable code (kernels/instances/*.cu): every architecture the build targets runs it
  sm90a,  // Hopper alone (kernels/instances/sm90a/: wgmma, TMA, setmaxnreg)
};

// sm_90a code runs on compute capability 9.0 alone.
constexpr int kHopperComputeCapability = 90;

// Whether a context may run kernels of this tag: the build has their code (the sim always does),
// the device's compute capability runs it, and the context allows it (ContextOptions::hopper_kernels
// for sm90a: the Hopper case of the choice, the only tag a context may turn off).
bool kernels_usable(const ContextState& ctx, KernelArch arch);

// kernels_usable(ctx, KernelArch::sm90a), for Context::uses_hopper_kernels().
bool hopper_kernels_usable(const ContextState& ctx);

}  // namespace selfattn::detail

// A kernel list's nvcc instance where the build has the tag's code, else null (the code does not
// exist, so not even its address may be taken): SELFATTN_IF_BUILT_<tag>(&cuda_target::instance).
#if SELFATTN_BUILT_sm80
#define SELFATTN_IF_BUILT_sm80(...) __VA_ARGS__
#else
#define SELFATTN_IF_BUILT_sm80(...) nullptr
#endif
#if SELFATTN_BUILT_sm90a
#define SELFATTN_IF_BUILT_sm90a(...) __VA_ARGS__
#else
#define SELFATTN_IF_BUILT_sm90a(...) nullptr
#endif
