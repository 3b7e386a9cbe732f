#pragma once
// Which build of a kernel a context runs: the host compiler's for the sim, nvcc's for cuda. Every
// lookup in kernels/registry.inc exists in both namespaces, sim_target and cuda_target; a build
// without nvcc defines only the sim's.
#include "kernels/registry.h"
#include "selfattn/types.h"

// kernels::sim_target::LOOKUP on the sim backend, kernels::cuda_target::LOOKUP on cuda; on cuda in a
// build without nvcc, an empty result (the lookup's type, value-initialised), which the caller turns
// into NotAvailable. LOOKUP is a call, e.g. SELFATTN_KERNEL_FOR(backend, fill_kernel_ref()).
#if SELFATTN_HAVE_CUDA
#define SELFATTN_KERNEL_FOR(backend, lookup)                                    \
  ((backend) == ::selfattn::Backend::sim ? ::selfattn::kernels::sim_target::lookup \
                                         : ::selfattn::kernels::cuda_target::lookup)
#else
#define SELFATTN_KERNEL_FOR(backend, lookup)                                    \
  ((backend) == ::selfattn::Backend::sim ? ::selfattn::kernels::sim_target::lookup \
                                         : decltype(::selfattn::kernels::sim_target::lookup){})
#endif
