// The runtime for GCC's ThreadSanitizer instrumentation of kernel code (racecheck.h says why): the
// compiler turns every load and store of an instrumented translation unit into a call to
// __tsan_readN / __tsan_writeN before it, and every atomic operation into a __tsan_atomicN_* call
// that must perform it. Only the sim's kernel objects are compiled with -fsanitize=thread (never
// linked with it), so these definitions are the only ones in the process. Built only when
// SELFATTN_SIM_RACECHECK is ON (CMake): an ASan or a real TSan build leaves them out.
//
// Memory orders: every atomic here is sequentially consistent, at least as strong as any the
// caller asked for.
#include <cstddef>
#include <cstdint>

#include "racecheck.h"

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#error "tsan_hooks.cpp replaces the ThreadSanitizer runtime: build it without sanitizers"
#endif

using selfattn::sim::detail::race::on_access;

#define SELFATTN_PC reinterpret_cast<uintptr_t>(__builtin_return_address(0))

extern "C" {

void __tsan_init() {}
void __tsan_func_entry(void*) {}
void __tsan_func_exit() {}
void __tsan_vptr_update(void**, void*) {}
void __tsan_vptr_read(void**) {}

// Plain, unaligned and volatile accesses of 1..16 bytes, and ranges (aggregate copies). The plain
// and volatile ones are of an N-byte type the compiler takes as N-aligned (natural: a GPU faults
// when it is not); the unaligned ones, it knows may not be.
#define SELFATTN_TSAN_ACCESS(N)                                                                   \
  void __tsan_read##N(void* p) { on_access(p, N, false, SELFATTN_PC, true); }                    \
  void __tsan_write##N(void* p) { on_access(p, N, true, SELFATTN_PC, true); }                    \
  void __tsan_unaligned_read##N(void* p) { on_access(p, N, false, SELFATTN_PC); }                \
  void __tsan_unaligned_write##N(void* p) { on_access(p, N, true, SELFATTN_PC); }                \
  void __tsan_volatile_read##N(void* p) { on_access(p, N, false, SELFATTN_PC, true); }           \
  void __tsan_volatile_write##N(void* p) { on_access(p, N, true, SELFATTN_PC, true); }           \
  void __tsan_unaligned_volatile_read##N(void* p) { on_access(p, N, false, SELFATTN_PC); }       \
  void __tsan_unaligned_volatile_write##N(void* p) { on_access(p, N, true, SELFATTN_PC); }
SELFATTN_TSAN_ACCESS(1)
SELFATTN_TSAN_ACCESS(2)
SELFATTN_TSAN_ACCESS(4)
SELFATTN_TSAN_ACCESS(8)
SELFATTN_TSAN_ACCESS(16)
#undef SELFATTN_TSAN_ACCESS

void __tsan_read_range(void* p, size_t n) { on_access(p, n, false, SELFATTN_PC); }
void __tsan_write_range(void* p, size_t n) { on_access(p, n, true, SELFATTN_PC); }

// Atomics: performed, not recorded (sim/README.md: atomics are not checked).
#define SELFATTN_TSAN_ATOMIC(N, T)                                                                        \
  T __tsan_atomic##N##_load(const volatile T* a, int) { return __atomic_load_n(a, __ATOMIC_SEQ_CST); }      \
  void __tsan_atomic##N##_store(volatile T* a, T v, int) { __atomic_store_n(a, v, __ATOMIC_SEQ_CST); }      \
  T __tsan_atomic##N##_exchange(volatile T* a, T v, int) { return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST); } \
  T __tsan_atomic##N##_fetch_add(volatile T* a, T v, int) { return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST); } \
  T __tsan_atomic##N##_fetch_sub(volatile T* a, T v, int) { return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST); } \
  T __tsan_atomic##N##_fetch_and(volatile T* a, T v, int) { return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST); } \
  T __tsan_atomic##N##_fetch_or(volatile T* a, T v, int) { return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST); }   \
  T __tsan_atomic##N##_fetch_xor(volatile T* a, T v, int) { return __atomic_fetch_xor(a, v, __ATOMIC_SEQ_CST); } \
  T __tsan_atomic##N##_fetch_nand(volatile T* a, T v, int) { return __atomic_fetch_nand(a, v, __ATOMIC_SEQ_CST); } \
  int __tsan_atomic##N##_compare_exchange_strong(volatile T* a, T* expected, T v, int, int) {                \
    return __atomic_compare_exchange_n(a, expected, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);           \
  }                                                                                                       \
  int __tsan_atomic##N##_compare_exchange_weak(volatile T* a, T* expected, T v, int, int) {                  \
    return __atomic_compare_exchange_n(a, expected, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);            \
  }                                                                                                       \
  T __tsan_atomic##N##_compare_exchange_val(volatile T* a, T expected, T v, int, int) {                      \
    __atomic_compare_exchange_n(a, &expected, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                 \
    return expected;                                                                                      \
  }
SELFATTN_TSAN_ATOMIC(8, uint8_t)
SELFATTN_TSAN_ATOMIC(16, uint16_t)
SELFATTN_TSAN_ATOMIC(32, uint32_t)
SELFATTN_TSAN_ATOMIC(64, uint64_t)
#undef SELFATTN_TSAN_ATOMIC

void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
void __tsan_atomic_signal_fence(int) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }

}  // extern "C"
