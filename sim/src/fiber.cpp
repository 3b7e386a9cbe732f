#include "fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "selfattn_sim/sim.h"

#if SELFATTN_SIM_ASAN
#include <sanitizer/asan_interface.h>
#endif

#if SELFATTN_SIM_HAVE_ASM_SWITCH
// selfattn_sim_switch(void** save_sp, void* load_sp): pushes the callee-saved state of the running
// execution, stores its stack pointer in *save_sp, loads load_sp and pops the state saved there.
// Caller-saved registers need no saving: the call itself tells the compiler they are clobbered.
// selfattn_sim_fiber_start is where a fresh fiber's first switch "returns" to: it calls
// entry(arg), passed in r13 / r12 by fiber_prepare's initial frame.
asm(R"(
  .text
  .p2align 4
  .globl selfattn_sim_switch
  .hidden selfattn_sim_switch
  .type selfattn_sim_switch, @function
selfattn_sim_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $16, %rsp
  stmxcsr 8(%rsp)
  fnstcw 12(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr 8(%rsp)
  fldcw 12(%rsp)
  addq $16, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size selfattn_sim_switch, .-selfattn_sim_switch

  .p2align 4
  .globl selfattn_sim_fiber_start
  .hidden selfattn_sim_fiber_start
  .type selfattn_sim_fiber_start, @function
selfattn_sim_fiber_start:
  movq %r12, %rdi
  callq *%r13
  ud2
  .size selfattn_sim_fiber_start, .-selfattn_sim_fiber_start
)");
extern "C" void selfattn_sim_fiber_start();
#endif

namespace selfattn::sim::detail {

namespace {

size_t page_size() {
  static const size_t bytes = size_t(sysconf(_SC_PAGESIZE));
  return bytes;
}

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

FiberStack::FiberStack(size_t bytes) {
  const size_t page = page_size();
  // 64 KB of guard: a frame with a large local array can step over a single guard page.
  const size_t guard = round_up(64 * 1024, page);
  usable_bytes_ = round_up(bytes, page);
  mapping_bytes_ = usable_bytes_ + guard;
  void* p = mmap(nullptr, mapping_bytes_, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
  if (p == MAP_FAILED) throw Error("sim: cannot reserve a fiber stack of " + std::to_string(bytes) + " bytes");
  mapping_ = static_cast<unsigned char*>(p);
  mprotect(mapping_, guard, PROT_NONE);  // stacks grow down: the guard is below the usable part
  usable_ = mapping_ + guard;
}

FiberStack::~FiberStack() { munmap(mapping_, mapping_bytes_); }

size_t fiber_stack_bytes() {
  static const size_t bytes = [] {
    const char* env = std::getenv("SELFATTN_SIM_STACK_KB");
    const long kb = env ? std::atol(env) : 0;
    return kb > 0 ? size_t(kb) * 1024 : size_t(256) * 1024;
  }();
  return bytes;
}

namespace {

SwitchKind choose_switch_kind() {
  const char* env = std::getenv("SELFATTN_SIM_FIBERS");
  if (!SELFATTN_SIM_HAVE_ASM_SWITCH || (env && std::strcmp(env, "ucontext") == 0)) return SwitchKind::ucontext;
  return SwitchKind::assembly;
}

}  // namespace

// Chosen at load time, so that each switch reads a plain global rather than a guarded static.
// (Read before its initialisation it is 0, `assembly`: the default anyway.)
const SwitchKind g_switch_kind = choose_switch_kind();

SwitchKind switch_kind() { return g_switch_kind; }

namespace {

// makecontext passes only ints: the entry and its argument travel as halves of 64-bit words.
void ucontext_start(unsigned entry_lo, unsigned entry_hi, unsigned arg_lo, unsigned arg_hi) {
  const auto entry = reinterpret_cast<FiberEntry>(uintptr_t(entry_hi) << 32 | entry_lo);
  void* arg = reinterpret_cast<void*>(uintptr_t(arg_hi) << 32 | arg_lo);
  entry(arg);
  std::abort();  // entries never return
}

}  // namespace

void fiber_prepare(FiberContext& fiber, FiberStack& stack, FiberEntry entry, void* arg) {
  fiber.stack_bottom = stack.base();
  fiber.stack_size = stack.size();
#if SELFATTN_SIM_ASAN
  // A reused stack keeps the poisoned redzones of frames that never returned (fibers end by
  // switching away); the new fiber starts from a clean stack.
  __asan_unpoison_memory_region(stack.base(), stack.size());
#endif
#if SELFATTN_SIM_HAVE_ASM_SWITCH
  if (switch_kind() == SwitchKind::assembly) {
    // The frame selfattn_sim_switch pops: [mxcsr, fpu cw][r15 r14 r13 r12 rbx rbp][return address].
    // `ret` leaves rsp 16-byte aligned at selfattn_sim_fiber_start, so its call meets the ABI.
    auto top = reinterpret_cast<uintptr_t>(stack.base() + stack.size()) & ~uintptr_t(15);
    auto* frame = reinterpret_cast<uint64_t*>(top - 88);
    uint32_t mxcsr = 0;
    uint16_t fpu_cw = 0;
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(fpu_cw));
    std::memset(frame, 0, 88);
    std::memcpy(reinterpret_cast<unsigned char*>(frame) + 8, &mxcsr, 4);
    std::memcpy(reinterpret_cast<unsigned char*>(frame) + 12, &fpu_cw, 2);
    frame[2 + 2] = reinterpret_cast<uint64_t>(entry);  // r13
    frame[2 + 3] = reinterpret_cast<uint64_t>(arg);    // r12
    frame[8] = reinterpret_cast<uint64_t>(&selfattn_sim_fiber_start);
    fiber.stack_pointer = frame;
    return;
  }
#endif
  getcontext(&fiber.uc);
  fiber.uc.uc_stack.ss_sp = stack.base();
  fiber.uc.uc_stack.ss_size = stack.size();
  fiber.uc.uc_link = nullptr;
  const auto e = reinterpret_cast<uintptr_t>(entry);
  const auto a = reinterpret_cast<uintptr_t>(arg);
  makecontext(&fiber.uc, reinterpret_cast<void (*)()>(&ucontext_start), 4, unsigned(e), unsigned(e >> 32),
              unsigned(a), unsigned(a >> 32));
}

void ucontext_switch(FiberContext& from, FiberContext& to) { swapcontext(&from.uc, &to.uc); }

}  // namespace selfattn::sim::detail
