#pragma once
// The watchdog: a kernel thread that runs on and on without reaching a barrier, a collective or its
// end (an endless loop, or a spin-wait on another thread, which the sim can never satisfy: it
// runs a block's threads one at a time and does not preempt) is named on stderr and the process
// aborted, after SELFATTN_SIM_WATCHDOG_S seconds (default 120; 0 turns the watchdog off).
#include <atomic>
#include <cstdint>

#include "crash_report.h"

namespace selfattn::sim::detail {

// What a worker OS thread publishes for the watchdog: the fiber it runs and a count of switches.
struct Heartbeat {
  std::atomic<const FaultInfo*> running{nullptr};
  std::atomic<uint64_t> switches{0};
};

// This OS thread's heartbeat, registered with the watchdog on first use.
Heartbeat& this_thread_heartbeat();

// Starts the watchdog thread (once per process, and again in a fork()ed child).
void start_watchdog();

}  // namespace selfattn::sim::detail
