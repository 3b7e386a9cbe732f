#pragma once
// The CUDA vocabulary kernels use, for both compilers. Under nvcc this adds nothing; under the
// host compiler (the sim) it maps each name onto the sim's engine (sim/include/selfattn_sim).
// Kernels include this first.
#include "target.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#if SELFATTN_SIM
#include <cmath>
#include <selfattn_sim/sim.h>

// A block's threads are fibers on one OS thread, so a function-level `static thread_local` is
// shared by the block's threads and by no other running block. Only dynamic shared memory is
// NaN-filled at block start: the library's kernels take all their shared memory from it.
#undef __shared__
#define __shared__ static thread_local
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif

#define threadIdx (::selfattn::sim::current_thread().thread_idx)
#define blockIdx (::selfattn::sim::current_thread().block_idx)
#define blockDim (::selfattn::sim::current_thread().block_dim)
#define gridDim (::selfattn::sim::current_thread().grid_dim)

inline void __syncthreads() { ::selfattn::sim::syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::selfattn::sim::syncwarp(mask); }
#endif
