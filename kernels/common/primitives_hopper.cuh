#pragma once
// Hopper (sm_90a) primitives: mbarrier, TMA tensor loads, the async-proxy fence, setmaxnreg and
// (primitives_hopper_wgmma.cuh) warpgroup MMA (wgmma.mma_async). As in primitives.cuh, each function is its nvcc body (the
// instruction) with its sim twin beside it. The twins' arithmetic and address maps live in
// primitives_hopper_sim.cuh (checked against CUTLASS/CuTe by tests/primitives/test_hopper_layouts);
// their synchronisation (mbarrier phases, when a TMA write lands, the async-proxy hazards) is the
// sim engine's (sim/include/selfattn_sim/sim.h, "Hopper").
//
// The warpgroup MMA half (wgmma, its fences and waits, P's e4m3 packing) is in
// primitives_hopper_wgmma.cuh, included at the end: the contract below is both halves'.
//
// Contract for callers (as on the GPU; the sim checks what it can):
//   - mbarriers live in dynamic shared memory, 8-byte aligned, initialised by one thread, then
//     fence_barrier_init() and a __syncthreads() before any other thread or the TMA uses them.
//   - TMA destinations are 128-byte aligned (1024 for a 128-byte swizzle pattern to start at its
//     first row, which the kernels' layouts assume); their bytes are read only after a wait on the
//     barrier the copy completes.
//   - wgmma_*, wgmma_fence/commit/wait and setmaxnreg are executed by all 128 threads of a
//     warpgroup together, with warpgroup-uniform descriptors. wgmma_fence() comes before the first
//     wgmma of a batch whose accumulator or A registers were touched by other instructions; the
//     accumulators are read, and the shared-memory operands rewritten, only after a wgmma_wait<>
//     that covers the group, and, after that wait, wgmma_fence_operands on the accumulators and A
//     fragments it retired (below: the compiler sees wgmma write them at issue and read them
//     there, so without it it may read them before the wait or reuse them while wgmma still reads).
//     Shared memory written by ordinary stores and read by wgmma needs
//     fence_proxy_async() by the writer (and then a barrier) in between.
//   - Only code built for sm_90a may call them (nvcc refuses wgmma and setmaxnreg elsewhere).
#include <cstdint>

#include "compat.h"
#include "primitives.cuh"
#include "tma_descriptor.h"
#if SELFATTN_SIM
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "primitives_hopper_sim.cuh"
#endif

SELFATTN_KERNELS_BEGIN

// The shared-memory address PTX wants: an offset in the block's shared window. On the sim, the
// offset in dynamic shared memory, whose base is 1024-byte aligned as on the GPU, so swizzles
// computed from address bits agree.
__device__ __forceinline__ uint32_t smem_address(const void* p) {
#if !SELFATTN_SIM
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
#else
  return uint32_t(static_cast<const unsigned char*>(p) - sim::current_thread().dynamic_smem);
#endif
}

// ======================================== mbarrier ===========================================

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, unsigned arrival_count) {
#if !SELFATTN_SIM
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(arrival_count) : "memory");
#else
  sim::mbarrier_init(bar, arrival_count);
#endif
}

// Makes initialised barriers visible to the other threads and to the async proxy (the TMA unit).
__device__ __forceinline__ void fence_barrier_init() {
#if !SELFATTN_SIM
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#else
  sim::fence_mbarrier_init();
#endif
}

__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
#if !SELFATTN_SIM
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(bar)) : "memory");
#else
  sim::mbarrier_arrive(bar, 1);
#endif
}

// Announces `bytes` of TMA transactions for the current phase, and arrives.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, unsigned bytes) {
#if !SELFATTN_SIM
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
#else
  sim::mbarrier_arrive_expect_tx(bar, bytes);
#endif
}

// Returns once the phase with this parity has completed (phase 0 has parity 0). A thread waits on
// phase k of a barrier with parity k & 1 and must not fall two phases behind.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, unsigned parity) {
#if !SELFATTN_SIM
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(smem_address(bar)),
      "r"(parity)
      : "memory");
#else
  sim::mbarrier_wait_parity(bar, parity);
#endif
}

// ordinary (generic-proxy) shared-memory stores so far -> visible to the async proxy (wgmma, TMA).
__device__ __forceinline__ void fence_proxy_async() {
#if !SELFATTN_SIM
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#else
  sim::fence_proxy_async();
#endif
}

// ======================================== TMA loads ==========================================
// One box of a 4-D tensor map (coordinates innermost first, in elements; out-of-bounds elements
// arrive as zeros) into shared memory at `dst`; its bytes count as transactions on `bar`. Issued
// by one thread.

#if SELFATTN_SIM
namespace sim_hopper {
// noinline: its return address is the kernel's TMA issue, which the racecheck reports.
__attribute__((noinline)) inline void tma_issue(void* dst, const TmaDescriptor* map, const int32_t* coords,
                                                uint64_t* bar) {
  SimTmaMap m;
  std::memcpy(&m, map->bytes, sizeof m);
  std::vector<unsigned char> image;
  const std::string problem = tma_box_image(m, coords, smem_address(dst), image, __builtin_return_address(0));
  if (sim::profiling()) sim::profile_bulk_done();  // the box's reads, one request
  if (!problem.empty()) sim_warp::fail("cp.async.bulk.tensor", problem);
  sim::tma_write(bar, dst, std::move(image), __builtin_return_address(0));
}
}  // namespace sim_hopper
#endif

__device__ __forceinline__ void tma_load_4d(void* dst, const TmaDescriptor* map, int32_t c0, int32_t c1, int32_t c2,
                                            int32_t c3, uint64_t* bar) {
#if !SELFATTN_SIM
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(smem_address(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_address(bar))
      : "memory");
#else
  const int32_t coords[4] = {c0, c1, c2, c3};
  sim_hopper::tma_issue(dst, map, coords, bar);
#endif
}

// ====================================== setmaxnreg ===========================================
// Moves registers between the warpgroups of a warp-specialised block: producers give theirs up,
// consumers take them. Count: a multiple of 8 in [24, 256]; all 128 threads of the warpgroup.

#if SELFATTN_SIM
namespace sim_hopper {
inline void setmaxnreg_check(int count, bool increase) {
  int out = 0;
  sim::warpgroup_collective(count, out, [](const int* const* ins, int* const*) SELFATTN_SIM_UNCHECKED {
    for (int t = 1; t < 128; ++t)
      if (*ins[t] != *ins[0]) sim_warp::fail("setmaxnreg", "all 128 threads of the warpgroup must ask for the same count");
  });
  // Once per warpgroup, against the block's register pool (sim.h).
  if (sim::current_thread().linear_tid % 128 == 0) sim::setmaxnreg(unsigned(count), increase);
}
}  // namespace sim_hopper
#endif

template <int Count>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(Count % 8 == 0 && Count >= 24 && Count <= 256, "setmaxnreg takes multiples of 8 in [24, 256]");
#if !SELFATTN_SIM
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Count));
#else
  sim_hopper::setmaxnreg_check(Count, /*increase=*/true);
#endif
}

template <int Count>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(Count % 8 == 0 && Count >= 24 && Count <= 256, "setmaxnreg takes multiples of 8 in [24, 256]");
#if !SELFATTN_SIM
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Count));
#else
  sim_hopper::setmaxnreg_check(Count, /*increase=*/false);
#endif
}

SELFATTN_KERNELS_END

#include "primitives_hopper_wgmma.cuh"  // warpgroup MMA: the second half of these primitives
