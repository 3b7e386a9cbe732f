#pragma once
// Fibers: one per simulated CUDA thread. A fiber runs until it switches back to its scheduler
// (at a barrier, a warp collective or its end); nothing preempts it.
//
// Two switch implementations sit behind one interface:
//   - a hand-written x86-64 switch (saves the six callee-saved registers, MXCSR and the x87
//     control word; ~ns per switch), the default on x86-64;
//   - ucontext (swapcontext also saves the signal mask: one sigprocmask syscall per switch),
//     portable; chosen with SELFATTN_SIM_FIBERS=ucontext, or everywhere but x86-64.
#include <cstddef>
#include <cstdint>

#include <ucontext.h>

#if defined(__SANITIZE_ADDRESS__)
#define SELFATTN_SIM_ASAN 1
#include <sanitizer/common_interface_defs.h>
#else
#define SELFATTN_SIM_ASAN 0
#endif

namespace selfattn::sim::detail {

// A fiber's stack: reserved with mmap, committed by the kernel page by page as it is touched, with
// an inaccessible guard zone below it so an overflow faults instead of corrupting a neighbour.
class FiberStack {
 public:
  explicit FiberStack(size_t bytes);
  ~FiberStack();
  FiberStack(const FiberStack&) = delete;
  FiberStack& operator=(const FiberStack&) = delete;
  unsigned char* base() const { return usable_; }  // lowest usable byte
  size_t size() const { return usable_bytes_; }
  unsigned char* guard_begin() const { return mapping_; }
  unsigned char* guard_end() const { return usable_; }

 private:
  unsigned char* mapping_ = nullptr;
  size_t mapping_bytes_ = 0;
  unsigned char* usable_ = nullptr;
  size_t usable_bytes_ = 0;
};

// Stack bytes per fiber: 256 KB, or SELFATTN_SIM_STACK_KB.
size_t fiber_stack_bytes();

#if defined(__x86_64__) && defined(__linux__)
#define SELFATTN_SIM_HAVE_ASM_SWITCH 1
#else
#define SELFATTN_SIM_HAVE_ASM_SWITCH 0
#endif

enum class SwitchKind { assembly, ucontext };
SwitchKind switch_kind();  // fixed at load time (SELFATTN_SIM_FIBERS=ucontext)

// A suspended execution: either a saved stack pointer (assembly) or a ucontext.
struct FiberContext {
  void* stack_pointer = nullptr;
  ucontext_t uc;
  // The stack it runs on, told to AddressSanitizer at each switch (ASan builds only).
  const void* stack_bottom = nullptr;
  size_t stack_size = 0;
};

using FiberEntry = void (*)(void* arg);

// Prepares `fiber` so that the first switch into it calls entry(arg) on `stack`. entry must never
// return: it ends by switching away for good.
void fiber_prepare(FiberContext& fiber, FiberStack& stack, FiberEntry entry, void* arg);

void ucontext_switch(FiberContext& from, FiberContext& to);
extern const SwitchKind g_switch_kind;

}  // namespace selfattn::sim::detail

#if SELFATTN_SIM_HAVE_ASM_SWITCH
extern "C" void selfattn_sim_switch(void** save_sp, void* load_sp);
#endif

namespace selfattn::sim::detail {

inline void raw_fiber_switch(FiberContext& from, FiberContext& to) {
#if SELFATTN_SIM_HAVE_ASM_SWITCH
  if (g_switch_kind == SwitchKind::assembly) {
    selfattn_sim_switch(&from.stack_pointer, to.stack_pointer);
    return;
  }
#endif
  ucontext_switch(from, to);
}

// Saves the running execution into `from` and resumes `to`. Inline: it runs twice per wait.
// `from_ends`: the running fiber never resumes (ASan may free its fake stack).
inline void fiber_switch(FiberContext& from, FiberContext& to, bool from_ends = false) {
#if SELFATTN_SIM_ASAN
  void* fake_stack = nullptr;
  __sanitizer_start_switch_fiber(from_ends ? nullptr : &fake_stack, to.stack_bottom, to.stack_size);
  raw_fiber_switch(from, to);
  __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#else
  (void)from_ends;
  raw_fiber_switch(from, to);
#endif
}

// First thing a fiber entry does: completes the switch that started it and records the stack it
// came from in `caller` (ASan builds; nothing otherwise).
inline void fiber_started(FiberContext& caller) {
#if SELFATTN_SIM_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &caller.stack_bottom, &caller.stack_size);
#else
  (void)caller;
#endif
}

}  // namespace selfattn::sim::detail
