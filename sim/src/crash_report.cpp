// When a kernel thread faults, say what it hit before the process dies: a fiber stack's guard page
// (stack overflow: raise SELFATTN_SIM_STACK_KB) or the no-access page around a device buffer (a far
// out-of-bounds access, naming the buffer). Then the previous SIGSEGV disposition takes over, so a
// debugger, a core dump or another handler sees the fault as usual.
#include "crash_report.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace selfattn::sim::detail {

namespace {

struct sigaction g_previous;
// The handler runs on its own stack: the faulting one may be the overflowed fiber stack.
constexpr size_t kAltStackBytes = 64 * 1024;
// On the heap, not in TLS: this library's TLS block is static (t_fiber is initial-exec), and a
// library loaded with dlopen (the Python module) gets only a few hundred bytes of static TLS.
struct AltStack {
  unsigned char* memory = nullptr;
  ~AltStack() {
    if (memory == nullptr) return;
    stack_t off{};
    off.ss_flags = SS_DISABLE;
    sigaltstack(&off, nullptr);
    std::free(memory);
  }
};
thread_local AltStack t_alt_stack;
thread_local bool t_alt_stack_set = false;

void write_all(const char* text) {
  size_t left = std::strlen(text);
  while (left > 0) {
    const ssize_t n = write(STDERR_FILENO, text, left);
    if (n <= 0) return;
    text += n;
    left -= size_t(n);
  }
}

void on_fault(int sig, siginfo_t* info, void* context) {
  static char message[1024];
  const void* address = info->si_addr;
  bool described = false;
  if (const FaultInfo* f = running_fault_info()) {
    const auto a = reinterpret_cast<uintptr_t>(address);
    if (f->stack_guard_begin <= a && a < f->stack_guard_end) {
      std::snprintf(message, sizeof message,
                    "\nsim: kernel '%s', block (%u,%u,%u), thread (%u,%u,%u) overflowed its %zu-byte fiber stack "
                    "(set SELFATTN_SIM_STACK_KB higher)\n",
                    f->kernel_name, f->block.x, f->block.y, f->block.z, f->thread.x, f->thread.y, f->thread.z,
                    f->stack_bytes);
      described = true;
    } else {
      std::snprintf(message, sizeof message, "\nsim: kernel '%s', block (%u,%u,%u), thread (%u,%u,%u) faulted at %p",
                    f->kernel_name, f->block.x, f->block.y, f->block.z, f->thread.x, f->thread.y, f->thread.z, address);
      write_all(message);
      char buffer[512];
      if (describe_device_address(address, buffer, sizeof buffer)) {
        std::snprintf(message, sizeof message, ": %s\n", buffer);
      } else {
        std::snprintf(message, sizeof message, "\n");
      }
      described = true;
    }
  }
  if (described) write_all(message);
  // Hand the fault back: returning re-executes the access under the previous disposition.
  sigaction(SIGSEGV, &g_previous, nullptr);
  (void)sig;
  (void)context;
}

}  // namespace

void install_crash_report() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action;
    std::memset(&action, 0, sizeof action);
    action.sa_sigaction = &on_fault;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    sigaction(SIGSEGV, &action, &g_previous);
  });
  if (!t_alt_stack_set) {
    stack_t current;
    // Keep a thread's own alternate stack if it has one (e.g. Python's faulthandler sets one).
    if (sigaltstack(nullptr, &current) == 0 && !(current.ss_flags & SS_DISABLE)) {
      t_alt_stack_set = true;
      return;
    }
    t_alt_stack.memory = static_cast<unsigned char*>(std::malloc(kAltStackBytes));
    if (t_alt_stack.memory == nullptr) return;  // no report on this thread's stack overflows, nothing worse
    stack_t alt;
    alt.ss_sp = t_alt_stack.memory;
    alt.ss_size = kAltStackBytes;
    alt.ss_flags = 0;
    sigaltstack(&alt, nullptr);
    t_alt_stack_set = true;
  }
}

}  // namespace selfattn::sim::detail
