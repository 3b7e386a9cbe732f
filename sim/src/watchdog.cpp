#include "watchdog.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

namespace selfattn::sim::detail {

namespace {

// Heartbeats live in a fixed table that is never freed, so the watchdog may read a slot whose
// thread has ended. Threads past the table's end run unwatched.
constexpr unsigned kMaxWatched = 256;
Heartbeat g_heartbeats[kMaxWatched];
std::atomic<unsigned> g_heartbeat_count{0};
thread_local Heartbeat t_unwatched;

unsigned watchdog_seconds() {
  const char* env = std::getenv("SELFATTN_SIM_WATCHDOG_S");
  return env ? unsigned(std::strtoul(env, nullptr, 10)) : 120u;
}

[[noreturn]] void report_stuck(const FaultInfo& f, unsigned seconds) {
  std::fprintf(stderr,
               "\nsim: kernel '%s', block (%u,%u,%u), thread (%u,%u,%u) has run for %u s without reaching a barrier, "
               "a warp collective or its end: an endless loop, or a spin-wait on another thread of its block (the "
               "sim runs a block's threads one at a time and never preempts them). SELFATTN_SIM_WATCHDOG_S sets "
               "the limit (0: off).\n",
               f.kernel_name, f.block.x, f.block.y, f.block.z, f.thread.x, f.thread.y, f.thread.z, seconds);
  std::fflush(stderr);
  std::abort();
}

void watch(unsigned limit_seconds) {
  uint64_t last_switches[kMaxWatched] = {};
  unsigned unchanged_seconds[kMaxWatched] = {};
  for (;;) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    const unsigned count = std::min(g_heartbeat_count.load(), kMaxWatched);
    for (unsigned i = 0; i < count; ++i) {
      const FaultInfo* running = g_heartbeats[i].running.load(std::memory_order_relaxed);
      const uint64_t switches = g_heartbeats[i].switches.load(std::memory_order_relaxed);
      if (running == nullptr || switches != last_switches[i]) {
        last_switches[i] = switches;
        unchanged_seconds[i] = 0;
      } else if (++unchanged_seconds[i] >= limit_seconds) {
        report_stuck(*running, unchanged_seconds[i]);
      }
    }
  }
}

}  // namespace

Heartbeat& this_thread_heartbeat() {
  thread_local Heartbeat* mine = [] {
    const unsigned slot = g_heartbeat_count.fetch_add(1);
    return slot < kMaxWatched ? &g_heartbeats[slot] : &t_unwatched;
  }();
  return *mine;
}

void start_watchdog() {
  static std::mutex mutex;
  static pid_t started_in = 0;
  std::lock_guard<std::mutex> lock(mutex);
  if (started_in == getpid()) return;
  started_in = getpid();
  const unsigned seconds = watchdog_seconds();
  if (seconds > 0) std::thread(watch, seconds).detach();
}

}  // namespace selfattn::sim::detail
