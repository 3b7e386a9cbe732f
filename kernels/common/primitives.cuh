#pragma once
// Device primitives: the only place kernels meet inline PTX. Each function has its nvcc body (the
// instruction) and, right beside it, its sim twin built on the sim engine's warp collectives and
// per-thread state, computing what the PTX ISA says the instruction computes.
//
// Contract for callers (as on the GPU, and the sim checks what it can):
//   - mma_*, ldmatrix*, shuffles and warp reductions are executed by all 32 lanes of the warp
//     together (no lane exited or diverged), in blocks whose size is a multiple of 32.
//   - Shared-memory operands point into dynamic_smem(); ldmatrix rows are 16-byte aligned.
//   - cp.async destinations are read only after a cp_async_wait*<> that covers their group and a
//     __syncthreads() (when another thread reads them).
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "compat.h"
#include "primitives_fragments.cuh"
#if SELFATTN_SIM
#include "primitives_sim.cuh"
#endif

SELFATTN_KERNELS_BEGIN

// ================================ thread and memory helpers ==================================

__device__ __forceinline__ unsigned lane_id() {
#if !SELFATTN_SIM
  unsigned lane;
  asm("mov.u32 %0, %%laneid;" : "=r"(lane));
  return lane;
#else
  return sim::current_thread().lane;
#endif
}

// The block's dynamic shared memory, 16-byte aligned (the widest cp.async / ldmatrix access).
// On the sim it is NaN-filled at block start, so reading what nobody wrote shows up.
template <class T>
__device__ __forceinline__ T* dynamic_smem() {
#if !SELFATTN_SIM
  extern __shared__ __align__(16) unsigned char selfattn_dynamic_smem[];
  return reinterpret_cast<T*>(selfattn_dynamic_smem);
#else
  return reinterpret_cast<T*>(sim::current_thread().dynamic_smem);
#endif
}

// One load or store of a vector type (uint4, float4, uint2, float2): a single 8- or 16-byte
// instruction on the GPU, which faults unless the address is a multiple of its size. The host
// compiler splits such a struct copy into 4-byte pieces, so the sim's access checks would see
// only those: the twin checks the whole vector's alignment and bounds first.
template <class V>
__device__ __forceinline__ V load_vector(const V* address) {
#if SELFATTN_SIM
  const bool profiled = sim_warp::check_vector_access(address, sizeof(V), false);
  const V value = *address;
  if (profiled) sim::profile_vector_done();
  return value;
#else
  return *address;
#endif
}
template <class V>
__device__ __forceinline__ void store_vector(V* address, const V& value) {
#if SELFATTN_SIM
  const bool profiled = sim_warp::check_vector_access(address, sizeof(V), true);
  *address = value;
  if (profiled) sim::profile_vector_done();
#else
  *address = value;
#endif
}

// =================================== 16-bit packing ==========================================
// A b32 register holding two 16-bit values: `lo` in bits 0-15 (the lower-indexed element of a
// fragment), `hi` in bits 16-31. Conversions round to nearest-even.

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 pair = __floats2half2_rn(lo, hi);
  uint32_t bits;
  std::memcpy(&bits, &pair, sizeof bits);
  return bits;
}
__device__ __forceinline__ uint32_t pack_bf162(float lo, float hi) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
  uint32_t bits;
  std::memcpy(&bits, &pair, sizeof bits);
  return bits;
}
__device__ __forceinline__ float2 unpack_half2(uint32_t bits) {
  __half_raw lo, hi;
  lo.x = static_cast<unsigned short>(bits & 0xffffu);
  hi.x = static_cast<unsigned short>(bits >> 16);
  return make_float2(__half2float(__half(lo)), __half2float(__half(hi)));
}
__device__ __forceinline__ float2 unpack_bf162(uint32_t bits) {
  __nv_bfloat16_raw lo, hi;
  lo.x = static_cast<unsigned short>(bits & 0xffffu);
  hi.x = static_cast<unsigned short>(bits >> 16);
  return make_float2(__bfloat162float(__nv_bfloat16(lo)), __bfloat162float(__nv_bfloat16(hi)));
}

// The same, chosen by element type (__half or __nv_bfloat16), for kernels templated on it.
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  static_assert(std::is_same<T, __half>::value || std::is_same<T, __nv_bfloat16>::value, "f16 or bf16");
  if constexpr (std::is_same<T, __half>::value) return pack_half2(lo, hi);
  else return pack_bf162(lo, hi);
}
template <class T>
__device__ __forceinline__ float2 unpack2(uint32_t bits) {
  static_assert(std::is_same<T, __half>::value || std::is_same<T, __nv_bfloat16>::value, "f16 or bf16");
  if constexpr (std::is_same<T, __half>::value) return unpack_half2(bits);
  else return unpack_bf162(bits);
}

// ===================================== tensor cores ==========================================
// D = A * B + C on one 16x8x16 tile per warp, f32 accumulators. Fragment layouts: PTX ISA,
// "Matrix Fragments for mma.m16n8k16 with floating point type" (see primitives_fragments.cuh).
// d may alias c (the usual in-place accumulation).

#if SELFATTN_SIM
namespace sim_warp {
template <Operand T, int K, size_t ARegs, size_t BRegs>
inline void mma_collective(float (&d)[4], const uint32_t (&a)[ARegs], const uint32_t (&b)[BRegs], const float (&c)[4]) {
  require_full_warp(K == 16 ? "mma.m16n8k16" : "mma.m16n8k8");
  MmaLaneIn<K> in;
  std::memcpy(in.a, a, sizeof in.a);
  std::memcpy(in.b, b, sizeof in.b);
  std::memcpy(in.c, c, sizeof in.c);
  MmaLaneOut out;
  sim::warp_collective(kFullWarp, in, out, [](const MmaLaneIn<K>* const* ins, MmaLaneOut* const* outs) {
    mma_m16n8<T, K>(ins, outs);
    if (sim::profiling()) sim::profile_tensor_op(16, 8, K, T == Operand::f16 ? "f16" : "bf16");  // once per warp
  });
  std::memcpy(d, out.d, sizeof out.d);
}
}  // namespace sim_warp
#endif

__device__ __forceinline__ void mma_m16n8k16_f16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                                 const float (&c)[4]) {
#if !SELFATTN_SIM
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
#else
  sim_warp::mma_collective<sim_warp::Operand::f16, 16>(d, a, b, c);
#endif
}

__device__ __forceinline__ void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                                  const float (&c)[4]) {
#if !SELFATTN_SIM
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
#else
  sim_warp::mma_collective<sim_warp::Operand::bf16, 16>(d, a, b, c);
#endif
}

// m16n8k8: half the K of the above (A: 2 registers, B: 1).
__device__ __forceinline__ void mma_m16n8k8_f16(float (&d)[4], const uint32_t (&a)[2], const uint32_t (&b)[1],
                                                const float (&c)[4]) {
#if !SELFATTN_SIM
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%8,%9,%10};\n"
               : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(b[0]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
#else
  sim_warp::mma_collective<sim_warp::Operand::f16, 8>(d, a, b, c);
#endif
}

__device__ __forceinline__ void mma_m16n8k8_bf16(float (&d)[4], const uint32_t (&a)[2], const uint32_t (&b)[1],
                                                 const float (&c)[4]) {
#if !SELFATTN_SIM
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%8,%9,%10};\n"
               : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(b[0]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
#else
  sim_warp::mma_collective<sim_warp::Operand::bf16, 8>(d, a, b, c);
#endif
}

// By element type, for kernels templated on it.
template <class T>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                             const float (&c)[4]) {
  static_assert(std::is_same<T, __half>::value || std::is_same<T, __nv_bfloat16>::value, "f16 or bf16");
  if constexpr (std::is_same<T, __half>::value) mma_m16n8k16_f16(d, a, b, c);
  else mma_m16n8k16_bf16(d, a, b, c);
}

// ======================================== ldmatrix ===========================================
// Loads Count (1, 2, 4) 8x8 matrices of 16-bit elements from shared memory; lane 8m + r passes the
// address of row r of matrix m (16 contiguous bytes, 16-byte aligned); lanes from 8*Count on pass
// any address (ignored). Register m of each lane receives its fragment of matrix m, as in
// ldmatrix_element(): without .trans row lane/4, with .trans column lane/4 of the stored matrix.
// Typical use: row-major A or K tiles without .trans, a row-major V tile (as mma's B) with .trans.

#if SELFATTN_SIM
namespace sim_warp {
// noinline: its return address is the kernel's ldmatrix, which the racecheck reports.
template <int Count, bool Transposed>
__attribute__((noinline)) void ldmatrix_collective(uint32_t (&regs)[Count], const void* row) {
  require_full_warp(Transposed ? "ldmatrix.trans" : "ldmatrix");
  const sim::ThreadContext& t = sim::current_thread();
  if (t.lane < 8u * Count) {
    const std::string problem = ldmatrix_row_problem(row, t.dynamic_smem, t.dynamic_smem_bytes);
    if (!problem.empty()) fail(Transposed ? "ldmatrix.trans" : "ldmatrix", problem);
    // The combine reads the row for this lane.
    sim::racecheck_shared(row, 16, sim::SharedAccess::ldmatrix_row, __builtin_return_address(0));
    if (sim::profiling()) sim::profile_shared_access(row, 16, sim::SharedOp::ldmatrix, __builtin_return_address(0));
  }
  const RowAddress in{row};
  LdmatrixRegs<Count> out;
  sim::warp_collective(kFullWarp, in, out, [](const RowAddress* const* ins, LdmatrixRegs<Count>* const* outs) {
    ldmatrix<Count, Transposed>(ins, outs);
  });
  std::memcpy(regs, out.r, sizeof out.r);
}
}  // namespace sim_warp
#endif

template <int Count>
__device__ __forceinline__ void ldmatrix(uint32_t (&regs)[Count], const void* smem_row) {
  static_assert(Count == 1 || Count == 2 || Count == 4, "ldmatrix loads 1, 2 or 4 matrices");
#if !SELFATTN_SIM
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(smem_row));
  if constexpr (Count == 1) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(regs[0]) : "r"(address));
  } else if constexpr (Count == 2) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(regs[0]), "=r"(regs[1]) : "r"(address));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(regs[0]), "=r"(regs[1]), "=r"(regs[2]), "=r"(regs[3]) : "r"(address));
  }
#else
  sim_warp::ldmatrix_collective<Count, false>(regs, smem_row);
#endif
}

template <int Count>
__device__ __forceinline__ void ldmatrix_trans(uint32_t (&regs)[Count], const void* smem_row) {
  static_assert(Count == 1 || Count == 2 || Count == 4, "ldmatrix loads 1, 2 or 4 matrices");
#if !SELFATTN_SIM
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(smem_row));
  if constexpr (Count == 1) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n" : "=r"(regs[0]) : "r"(address));
  } else if constexpr (Count == 2) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(regs[0]), "=r"(regs[1]) : "r"(address));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(regs[0]), "=r"(regs[1]), "=r"(regs[2]), "=r"(regs[3]) : "r"(address));
  }
#else
  sim_warp::ldmatrix_collective<Count, true>(regs, smem_row);
#endif
}

// ======================================== cp.async ===========================================
// Asynchronous global -> shared copies of 4, 8 or 16 bytes. src_bytes < Bytes copies only the first
// src_bytes and zero-fills the rest (src_bytes == 0: nothing is read, the destination becomes zeros;
// the way to pad a tile past the end of a tensor). Both addresses are aligned to Bytes.
// A copy lands at the earliest when the thread waits for its group: issue, commit, ... wait<N>.
// .ca caches in L1 as well as L2; .cg (16 bytes only) bypasses L1: for tiles read once per block.

#if SELFATTN_SIM
namespace sim_warp {
// noinline: its return address is the kernel's cp.async, which the racecheck reports.
__attribute__((noinline)) inline void cp_async_issue(const char* what, void* dst, const void* src, unsigned cp_size,
                                                     unsigned src_size) {
  sim::ThreadContext& t = sim::current_thread();
  const std::string problem = cp_async_problem(dst, src, cp_size, src_size, t.dynamic_smem, t.dynamic_smem_bytes);
  if (!problem.empty()) fail(what, problem);
  // The source bytes it reads (none for src_size 0): the copy itself is made later, unseen.
  sim::check_access(src, src_size, false, false, __builtin_return_address(0));
  sim::racecheck_shared(dst, cp_size, sim::SharedAccess::cp_async_issue, __builtin_return_address(0));
  if (sim::profiling()) {
    sim::profile_global_access(src, src_size, false, __builtin_return_address(0));
    sim::profile_shared_access(dst, cp_size, sim::SharedOp::cp_async_dst, __builtin_return_address(0));
  }
  t.async_open.push_back(sim::AsyncCopy{dst, src, src_size, cp_size - src_size});
}
}  // namespace sim_warp
#endif

template <int Bytes>
__device__ __forceinline__ void cp_async_ca(void* smem_dst, const void* gmem_src, unsigned src_bytes = Bytes) {
  static_assert(Bytes == 4 || Bytes == 8 || Bytes == 16, "cp.async.ca copies 4, 8 or 16 bytes");
#if !SELFATTN_SIM
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  const size_t src = __cvta_generic_to_global(gmem_src);
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(Bytes), "r"(src_bytes)
               : "memory");
#else
  sim_warp::cp_async_issue("cp.async.ca", smem_dst, gmem_src, Bytes, src_bytes);
#endif
}

__device__ __forceinline__ void cp_async_cg(void* smem_dst, const void* gmem_src, unsigned src_bytes = 16) {
#if !SELFATTN_SIM
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  const size_t src = __cvta_generic_to_global(gmem_src);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
#else
  sim_warp::cp_async_issue("cp.async.cg", smem_dst, gmem_src, 16, src_bytes);
#endif
}

// Closes the group of copies issued since the last commit (possibly empty, as on the GPU).
__device__ __forceinline__ void cp_async_commit() {
#if !SELFATTN_SIM
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#else
  sim::ThreadContext& t = sim::current_thread();
  t.async_groups.push_back(std::move(t.async_open));
  t.async_open.clear();
#endif
}

// Waits until at most Pending of this thread's committed groups are still in flight: all groups but
// the newest Pending have landed. Uncommitted copies are not waited for.
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
  static_assert(Pending >= 0 && Pending <= 7, "cp.async.wait_group takes 0..7");
#if !SELFATTN_SIM
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
#else
  sim_warp::complete_all_but_newest(sim::current_thread().async_groups, Pending);
#endif
}

// Commits the open copies and waits for everything (cp.async.wait_all).
__device__ __forceinline__ void cp_async_wait_all() {
#if !SELFATTN_SIM
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#else
  cp_async_commit();
  sim_warp::complete_all_but_newest(sim::current_thread().async_groups, 0);
#endif
}

// ==================================== warp shuffles ==========================================
// Full-warp exchanges of 32-bit values (float, int, unsigned, a packed pair).

template <class T>
__device__ __forceinline__ T shuffle_xor(T value, int lane_mask) {
  static_assert(sizeof(T) == 4, "32-bit values");
#if !SELFATTN_SIM
  return __shfl_xor_sync(0xffffffffu, value, lane_mask);
#else
  sim_warp::require_full_warp("shuffle_xor");
  T out;
  sim::warp_collective(sim_warp::kFullWarp, value, out, [lane_mask](const T* const* ins, T* const* outs) {
    sim_warp::shuffle_xor(ins, outs, lane_mask);
  });
  return out;
#endif
}

// Reduces over aligned groups of Width lanes (2..32); every lane of a group gets the group's result.
// Width 4 is the four lanes of an mma row (threadID_in_group), 32 the whole warp.
template <int Width>
__device__ __forceinline__ float warp_reduce_max(float value) {
  static_assert(Width == 2 || Width == 4 || Width == 8 || Width == 16 || Width == 32, "power-of-two width");
#if !SELFATTN_SIM
#pragma unroll
  for (int offset = Width / 2; offset > 0; offset /= 2) value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
#else
  sim_warp::require_full_warp("warp_reduce_max");
  float out;
  sim::warp_collective(sim_warp::kFullWarp, value, out, [](const float* const* ins, float* const* outs) {
    sim_warp::butterfly_reduce<Width>(ins, outs, sim_warp::max_op);
  });
  return out;
#endif
}

template <int Width>
__device__ __forceinline__ float warp_reduce_sum(float value) {
  static_assert(Width == 2 || Width == 4 || Width == 8 || Width == 16 || Width == 32, "power-of-two width");
#if !SELFATTN_SIM
#pragma unroll
  for (int offset = Width / 2; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
#else
  sim_warp::require_full_warp("warp_reduce_sum");
  float out;
  sim::warp_collective(sim_warp::kFullWarp, value, out, [](const float* const* ins, float* const* outs) {
    sim_warp::butterfly_reduce<Width>(ins, outs, sim_warp::sum_op);
  });
  return out;
#endif
}

SELFATTN_KERNELS_END
