#pragma once
// Kernel source is compiled twice: by nvcc for the GPU and by the host compiler for the sim.
// Each compilation puts its code in its own namespace, so the two builds of one template never
// meet at link time (same mangled name, different code would be an ODR violation).
// Host code names them explicitly: kernels::cuda_target::... or kernels::sim_target::...
#if defined(__CUDACC__)
#define SELFATTN_TARGET cuda_target
#define SELFATTN_SIM 0
#else
#define SELFATTN_TARGET sim_target
#define SELFATTN_SIM 1
#endif

#define SELFATTN_KERNELS_BEGIN \
  namespace selfattn {         \
  namespace kernels {          \
  inline namespace SELFATTN_TARGET {
#define SELFATTN_KERNELS_END \
  }                          \
  }                          \
  }
