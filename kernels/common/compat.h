#pragma once
// The CUDA vocabulary kernels use, for both compilers. Under nvcc this adds nothing; under the
// host compiler (the sim) it maps each name onto the sim's engine (sim/include/selfattn_sim).
// Kernels include this first.
//
// What the toolkit headers already give the host compiler (cuda_fp16.h / cuda_bf16.h / cuda_fp8.h):
// __half, __nv_bfloat16, __nv_fp8_e4m3 and __nv_fp8_e5m2 with their conversions (FP8's in software
// on the host), arithmetic and h* intrinsics; __device__, __global__, __host__ and __forceinline__
// (as always_inline). Everything else a kernel may use is here.
#include "target.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

// Unrolls the loop that follows under nvcc, so that the register arrays its counter indexes stay in
// registers (a loop nvcc keeps rolled puts them in local memory); the sim runs it as written.
#if SELFATTN_SIM
#define SELFATTN_UNROLL
#else
#define SELFATTN_UNROLL _Pragma("unroll")
#endif

#if SELFATTN_SIM
#include <math.h>  // the C++ <math.h>: std::isnan, fmaf, exp2f... in the global namespace, as CUDA has them

#include <cstdint>
#include <cstring>
#include <type_traits>

#include <selfattn_sim/sim.h>

// A block's threads are fibers on one OS thread, so a function-level `static thread_local` is
// shared by the block's threads and by no other running block. Only dynamic shared memory is
// NaN-filled at block start: the library's kernels take all their shared memory from it.
#undef __shared__
#define __shared__ static thread_local
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
// A kernel parameter the kernel only reads, kept in parameter memory (TMA maps must stay there);
// the sim passes parameters by value to each thread.
#ifndef __grid_constant__
#define __grid_constant__
#endif

#define threadIdx (::selfattn::sim::current_thread().thread_idx)
#define blockIdx (::selfattn::sim::current_thread().block_idx)
#define blockDim (::selfattn::sim::current_thread().block_dim)
#define gridDim (::selfattn::sim::current_thread().grid_dim)
static constexpr int warpSize = 32;

inline void __syncthreads() { ::selfattn::sim::syncthreads(); }
inline int __syncthreads_count(int predicate) { return ::selfattn::sim::syncthreads_count(predicate); }
inline int __syncthreads_and(int predicate) {
  return ::selfattn::sim::syncthreads_count(predicate) == int(blockDim.x * blockDim.y * blockDim.z);
}
inline int __syncthreads_or(int predicate) { return ::selfattn::sim::syncthreads_count(predicate) > 0; }
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::selfattn::sim::syncwarp(mask); }
[[noreturn]] inline void __trap() {
  const ::selfattn::sim::ThreadContext& t = ::selfattn::sim::current_thread();
  throw ::selfattn::sim::Error("sim: __trap() in block (" + std::to_string(t.block_idx.x) + "," +
                               std::to_string(t.block_idx.y) + "," + std::to_string(t.block_idx.z) + "), thread (" +
                               std::to_string(t.thread_idx.x) + "," + std::to_string(t.thread_idx.y) + "," +
                               std::to_string(t.thread_idx.z) + ")");
}
inline void __nanosleep(unsigned) {}
inline unsigned __activemask() { return ::selfattn::sim::warp_live_mask(); }
// Blocks run concurrently on worker threads: fences are real fences.
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_signal_fence(__ATOMIC_SEQ_CST); }

// ---- warp shuffles ---------------------------------------------------------------------------
// PTX shfl.sync's definition, verbatim: c packs the segment mask (32 - width) << 8 and the clamp
// (0 for up, 31 otherwise). A source outside the segment yields the lane's own value; a source
// lane that is not in the mask is undefined on the GPU and reads as 0xFF bytes (NaN) here.
namespace selfattn::sim::compat {

enum class ShuffleMode { idx, up, down, bfly };

template <ShuffleMode Mode, class T>
T shuffle(unsigned mask, T value, int b, int width) {
  // (__half2 has a user-written assignment, so not is_trivially_copyable, but is plain bits.)
  static_assert(sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8, "__shfl_*_sync takes 16-, 32- or 64-bit values");
  if (width < 1 || width > 32 || (width & (width - 1)) != 0) {
    throw Error("sim: __shfl_*_sync width " + std::to_string(width) + " is not a power of two in [1, 32]");
  }
  struct In {
    T value;
    unsigned lane, bval, clamp, segmask;
  };
  const unsigned lane = current_thread().lane;
  const In in{value, lane, unsigned(b) & 31u, Mode == ShuffleMode::up ? 0u : 31u, unsigned(32 - width) & 31u};
  T out = value;  // overwritten by the combine; initialised to keep -Wmaybe-uninitialized quiet
  warp_collective(mask, in, out, [](const In* const* ins, T* const* outs) SELFATTN_SIM_UNCHECKED {
    for (unsigned l = 0; l < 32; ++l) {
      if (!outs[l]) continue;
      const In& me = *ins[l];
      const int max_lane = int((me.lane & me.segmask) | (me.clamp & ~me.segmask));
      const int min_lane = int(me.lane & me.segmask);
      int j = 0;
      bool in_range = false;
      switch (Mode) {
        case ShuffleMode::up: j = int(me.lane) - int(me.bval); in_range = j >= max_lane; break;
        case ShuffleMode::down: j = int(me.lane + me.bval); in_range = j <= max_lane; break;
        case ShuffleMode::bfly: j = int(me.lane ^ me.bval); in_range = j <= max_lane; break;
        case ShuffleMode::idx: j = min_lane | int(me.bval & ~me.segmask); in_range = j <= max_lane; break;
      }
      if (!in_range) j = int(me.lane);
      if (ins[j]) {
        *outs[l] = ins[j]->value;
      } else {
        std::memset(static_cast<void*>(outs[l]), 0xFF, sizeof(T));
      }
    }
  });
  return out;
}

enum class VoteMode { ballot, any, all };

template <VoteMode Mode>
unsigned vote(unsigned mask, int predicate) {
  const unsigned in = predicate != 0;
  unsigned out = 0;
  warp_collective(mask, in, out, [](const unsigned* const* ins, unsigned* const* outs) SELFATTN_SIM_UNCHECKED {
    unsigned ballot = 0, members = 0;
    for (unsigned l = 0; l < 32; ++l) {
      if (!ins[l]) continue;
      members |= 1u << l;
      ballot |= *ins[l] << l;
    }
    const unsigned result = Mode == VoteMode::ballot ? ballot
                            : Mode == VoteMode::any  ? unsigned(ballot != 0)
                                                     : unsigned(ballot == members);
    for (unsigned l = 0; l < 32; ++l) {
      if (outs[l]) *outs[l] = result;
    }
  });
  return out;
}

enum class ReduceMode { add, min, max };

template <ReduceMode Mode, class T>
T reduce(unsigned mask, T value) {
  T out{};
  warp_collective(mask, value, out, [](const T* const* ins, T* const* outs) SELFATTN_SIM_UNCHECKED {
    bool first = true;
    T r{};
    for (unsigned l = 0; l < 32; ++l) {
      if (!ins[l]) continue;
      const T v = *ins[l];
      r = first ? v : Mode == ReduceMode::add ? T(r + v) : Mode == ReduceMode::min ? (v < r ? v : r) : (v > r ? v : r);
      first = false;
    }
    for (unsigned l = 0; l < 32; ++l) {
      if (outs[l]) *outs[l] = r;
    }
  });
  return out;
}

template <class To, class From>
To bit_cast(From from) {
  static_assert(sizeof(To) == sizeof(From));
  To to;
  std::memcpy(&to, &from, sizeof to);
  return to;
}

}  // namespace selfattn::sim::compat

template <class T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize) {
  return ::selfattn::sim::compat::shuffle<::selfattn::sim::compat::ShuffleMode::idx>(mask, var, src_lane, width);
}
template <class T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  return ::selfattn::sim::compat::shuffle<::selfattn::sim::compat::ShuffleMode::up>(mask, var, int(delta), width);
}
template <class T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  return ::selfattn::sim::compat::shuffle<::selfattn::sim::compat::ShuffleMode::down>(mask, var, int(delta), width);
}
template <class T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize) {
  return ::selfattn::sim::compat::shuffle<::selfattn::sim::compat::ShuffleMode::bfly>(mask, var, lane_mask, width);
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  return ::selfattn::sim::compat::vote<::selfattn::sim::compat::VoteMode::ballot>(mask, predicate);
}
inline int __any_sync(unsigned mask, int predicate) {
  return int(::selfattn::sim::compat::vote<::selfattn::sim::compat::VoteMode::any>(mask, predicate));
}
inline int __all_sync(unsigned mask, int predicate) {
  return int(::selfattn::sim::compat::vote<::selfattn::sim::compat::VoteMode::all>(mask, predicate));
}
// sm_80's warp reductions (redux.sync).
inline unsigned __reduce_add_sync(unsigned mask, unsigned value) {
  return ::selfattn::sim::compat::reduce<::selfattn::sim::compat::ReduceMode::add>(mask, value);
}
inline int __reduce_add_sync(unsigned mask, int value) {
  return int(__reduce_add_sync(mask, unsigned(value)));  // wraps like the hardware's 32-bit add
}
inline unsigned __reduce_min_sync(unsigned mask, unsigned value) {
  return ::selfattn::sim::compat::reduce<::selfattn::sim::compat::ReduceMode::min>(mask, value);
}
inline int __reduce_min_sync(unsigned mask, int value) {
  return ::selfattn::sim::compat::reduce<::selfattn::sim::compat::ReduceMode::min>(mask, value);
}
inline unsigned __reduce_max_sync(unsigned mask, unsigned value) {
  return ::selfattn::sim::compat::reduce<::selfattn::sim::compat::ReduceMode::max>(mask, value);
}
inline int __reduce_max_sync(unsigned mask, int value) {
  return ::selfattn::sim::compat::reduce<::selfattn::sim::compat::ReduceMode::max>(mask, value);
}

// ---- atomics (relaxed, like CUDA's; blocks really do run concurrently) -----------------------
#define SELFATTN_SIM_ATOMIC_INT(T)                                                                   \
  inline T atomicAdd(T* a, T v) { return __atomic_fetch_add(a, v, __ATOMIC_RELAXED); }              \
  inline T atomicSub(T* a, T v) { return __atomic_fetch_sub(a, v, __ATOMIC_RELAXED); }              \
  inline T atomicExch(T* a, T v) { return __atomic_exchange_n(a, v, __ATOMIC_RELAXED); }            \
  inline T atomicAnd(T* a, T v) { return __atomic_fetch_and(a, v, __ATOMIC_RELAXED); }              \
  inline T atomicOr(T* a, T v) { return __atomic_fetch_or(a, v, __ATOMIC_RELAXED); }                \
  inline T atomicXor(T* a, T v) { return __atomic_fetch_xor(a, v, __ATOMIC_RELAXED); }              \
  inline T atomicCAS(T* a, T expected, T desired) {                                                 \
    __atomic_compare_exchange_n(a, &expected, desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);   \
    return expected;                                                                                \
  }                                                                                                 \
  inline T atomicMax(T* a, T v) {                                                                   \
    T old = __atomic_load_n(a, __ATOMIC_RELAXED);                                                   \
    while (old < v && !__atomic_compare_exchange_n(a, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) { \
    }                                                                                               \
    return old;                                                                                     \
  }                                                                                                 \
  inline T atomicMin(T* a, T v) {                                                                   \
    T old = __atomic_load_n(a, __ATOMIC_RELAXED);                                                   \
    while (v < old && !__atomic_compare_exchange_n(a, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) { \
    }                                                                                               \
    return old;                                                                                     \
  }
SELFATTN_SIM_ATOMIC_INT(int)
SELFATTN_SIM_ATOMIC_INT(unsigned)
SELFATTN_SIM_ATOMIC_INT(unsigned long long)
SELFATTN_SIM_ATOMIC_INT(long long)
#undef SELFATTN_SIM_ATOMIC_INT

namespace selfattn::sim::compat {
// Floating-point atomics: a compare-and-swap loop on the bits.
template <class F, class Bits, class Op>
F atomic_float(F* address, Op op) {
  Bits* bits = reinterpret_cast<Bits*>(address);
  Bits old = __atomic_load_n(bits, __ATOMIC_RELAXED);
  for (;;) {
    const Bits desired = bit_cast<Bits>(op(bit_cast<F>(old)));
    if (__atomic_compare_exchange_n(bits, &old, desired, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
      return bit_cast<F>(old);
    }
  }
}
}  // namespace selfattn::sim::compat

inline float atomicAdd(float* a, float v) {
  return ::selfattn::sim::compat::atomic_float<float, uint32_t>(a, [v](float x) { return x + v; });
}
inline double atomicAdd(double* a, double v) {
  return ::selfattn::sim::compat::atomic_float<double, uint64_t>(a, [v](double x) { return x + v; });
}
inline float atomicExch(float* a, float v) {
  return ::selfattn::sim::compat::bit_cast<float>(
      __atomic_exchange_n(reinterpret_cast<uint32_t*>(a), ::selfattn::sim::compat::bit_cast<uint32_t>(v), __ATOMIC_RELAXED));
}

// ---- math ------------------------------------------------------------------------------------
// CUDA's math functions and intrinsics with the error bounds CUDA documents: sim_math.h.
#include "sim_math.h"

inline float __saturatef(float x) { return isnan(x) ? 0.0f : x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
inline int __float2int_rn(float x) { return int(nearbyintf(x)); }
inline int __float2int_rz(float x) { return int(x); }
inline int __float2int_rd(float x) { return int(floorf(x)); }
inline int __float2int_ru(float x) { return int(ceilf(x)); }
inline float __int2float_rn(int x) { return float(x); }

inline float __int_as_float(int x) { return ::selfattn::sim::compat::bit_cast<float>(x); }
inline int __float_as_int(float x) { return ::selfattn::sim::compat::bit_cast<int>(x); }
inline float __uint_as_float(unsigned x) { return ::selfattn::sim::compat::bit_cast<float>(x); }
inline unsigned __float_as_uint(float x) { return ::selfattn::sim::compat::bit_cast<unsigned>(x); }
inline double __longlong_as_double(long long x) { return ::selfattn::sim::compat::bit_cast<double>(x); }
inline long long __double_as_longlong(double x) { return ::selfattn::sim::compat::bit_cast<long long>(x); }

inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(unsigned(x)); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
  x = (x >> 1 & 0x55555555u) | (x & 0x55555555u) << 1;
  x = (x >> 2 & 0x33333333u) | (x & 0x33333333u) << 2;
  x = (x >> 4 & 0x0F0F0F0Fu) | (x & 0x0F0F0F0Fu) << 4;
  return __builtin_bswap32(x);
}
inline unsigned __umulhi(unsigned a, unsigned b) { return unsigned((unsigned long long)a * b >> 32); }
inline int __mulhi(int a, int b) { return int((long long)a * b >> 32); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return (unsigned long long)((unsigned __int128)a * b >> 64);
}

// Loads and stores with cache hints are plain loads and stores here.
template <class T>
T __ldg(const T* p) {
  return *p;
}
template <class T>
T __ldcg(const T* p) {
  return *p;
}
template <class T>
T __ldca(const T* p) {
  return *p;
}
template <class T>
T __ldcs(const T* p) {
  return *p;
}
template <class T>
T __ldlu(const T* p) {
  return *p;
}
template <class T>
T __ldcv(const T* p) {
  return *p;
}
template <class T>
void __stcg(T* p, T v) {
  *p = v;
}
template <class T>
void __stcs(T* p, T v) {
  *p = v;
}
template <class T>
void __stwb(T* p, T v) {
  *p = v;
}
template <class T>
void __stwt(T* p, T v) {
  *p = v;
}

// prmt's default mode: byte i of the result is byte s[4i+2:4i] of the 8-byte {y, x}.
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const unsigned long long bytes = (unsigned long long)y << 32 | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= unsigned(bytes >> (8 * ((s >> (4 * i)) & 7u)) & 0xFFu) << (8 * i);
  return r;
}
// shf: the high / low 32 bits of the 64-bit {hi, lo} shifted by n & 31 (wrap) or min(n, 32) (clamp).
inline unsigned __funnelshift_l(unsigned lo, unsigned hi, unsigned n) {
  return unsigned(((unsigned long long)hi << 32 | lo) << (n & 31u) >> 32);
}
inline unsigned __funnelshift_lc(unsigned lo, unsigned hi, unsigned n) {
  return unsigned(((unsigned long long)hi << 32 | lo) << (n < 32u ? n : 32u) >> 32);
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned n) {
  return unsigned(((unsigned long long)hi << 32 | lo) >> (n & 31u));
}
inline unsigned __funnelshift_rc(unsigned lo, unsigned hi, unsigned n) {
  return unsigned(((unsigned long long)hi << 32 | lo) >> (n < 32u ? n : 32u));
}

// CUDA's min / max overloads; mixed argument types take their common type, as CUDA's do.
#define SELFATTN_SIM_MINMAX(T)                   \
  inline T min(T a, T b) { return b < a ? b : a; } \
  inline T max(T a, T b) { return a < b ? b : a; }
SELFATTN_SIM_MINMAX(int)
SELFATTN_SIM_MINMAX(unsigned)
SELFATTN_SIM_MINMAX(long)
SELFATTN_SIM_MINMAX(unsigned long)
SELFATTN_SIM_MINMAX(long long)
SELFATTN_SIM_MINMAX(unsigned long long)
#undef SELFATTN_SIM_MINMAX
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }
template <class A, class B, class = std::enable_if_t<std::is_arithmetic_v<A> && std::is_arithmetic_v<B>>>
std::common_type_t<A, B> min(A a, B b) {
  return min(std::common_type_t<A, B>(a), std::common_type_t<A, B>(b));
}
template <class A, class B, class = std::enable_if_t<std::is_arithmetic_v<A> && std::is_arithmetic_v<B>>>
std::common_type_t<A, B> max(A a, B b) {
  return max(std::common_type_t<A, B>(a), std::common_type_t<A, B>(b));
}

#endif  // SELFATTN_SIM
