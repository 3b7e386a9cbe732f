#pragma once
// A SIGSEGV report for faults inside kernel threads (see crash_report.cpp).
#include <cstddef>
#include <cstdint>

#include <vector_types.h>

namespace selfattn::sim::detail {

// What the fault handler may say about the running fiber; plain data, read inside the handler.
struct FaultInfo {
  const char* kernel_name = "";
  uint3 block{};
  uint3 thread{};
  uintptr_t stack_guard_begin = 0, stack_guard_end = 0;
  size_t stack_bytes = 0;
};

// Installs the handler (once per process) and an alternate signal stack (once per OS thread).
void install_crash_report();
// The fiber running on this OS thread (nullptr: none); defined by the engine, called by the handler.
const FaultInfo* running_fault_info();

// Writes what `address` is to a device buffer ("N bytes past the end of buffer 'label' ...") and
// returns true, if it lies in a buffer's mapping. Called from the fault handler: never blocks.
bool describe_device_address(const void* address, char* text, size_t text_bytes);

}  // namespace selfattn::sim::detail
