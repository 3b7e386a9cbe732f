// The SIMT engine's core: one block's CUDA threads as fibers on the calling OS thread, barriers and
// warp collectives as the only points where a fiber gives way. (grid.cpp spreads a grid's blocks
// over worker threads.)
//
// Scheduling. A block runs in rounds: each round takes the fibers that are ready, in an order
// drawn from a random permutation (seeded by Options::seed mixed with the block's index, so a
// block's schedule does not depend on which worker runs it), and runs each until it waits at a
// barrier or a collective, or ends. The last arrival at a barrier or a collective releases the
// others; they run in the next round. A round that finds no fiber ready while some have not ended
// is a divergence (some thread waits where another never comes) and is reported, never hung.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "block_runner.h"
#include "crash_report.h"
#include "engine_block.h"
#include "fiber.h"
#include "profile_internal.h"
#include "racecheck.h"
#include "watchdog.h"
#include "selfattn_sim/sim.h"

namespace selfattn::sim {

using namespace detail::engine;

thread_local Fiber* detail::engine::t_fiber __attribute__((tls_model("initial-exec"))) = nullptr;

std::string detail::engine::block_name(const Block& b) {
  return "kernel '" + std::string(b.config->kernel_name) + "', block (" + std::to_string(b.index.x) + "," +
         std::to_string(b.index.y) + "," + std::to_string(b.index.z) + ")";
}

std::string detail::engine::thread_name(const ThreadContext& t) {
  return "thread (" + std::to_string(t.thread_idx.x) + "," + std::to_string(t.thread_idx.y) + "," +
         std::to_string(t.thread_idx.z) + ")";
}

namespace {

// Checked after each block: catches overruns the access checks did not see (they were off).
constexpr size_t kSmemGuardBytes = detail::race::kSharedGuardBytes;
constexpr unsigned char kSmemGuardByte = 0xA5;

// What each worker OS thread keeps between blocks: fibers with their stacks, shared memory.
struct Worker {
  std::vector<std::unique_ptr<Fiber>> fibers;
  std::vector<Fiber*> fiber_ptrs;
  std::vector<Fiber*> order, released;
  unsigned char* smem = nullptr;
  size_t smem_capacity = 0;
  uint64_t switches = 0;  // published to the watchdog
  detail::race::BlockState race;
  detail::profile::BlockProfile profile;
  ~Worker() { std::free(smem); }
};

thread_local Worker t_worker;

std::string hex(unsigned v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

void fiber_main(void* arg) {
  Fiber& f = *static_cast<Fiber*>(arg);
  Block& b = *f.block;
  detail::fiber_started(b.scheduler);
  try {
    b.body(b.params);
    // On the GPU the warpgroup's registers and shared-memory operands would be read after the
    // thread is gone; here the operations would never be performed.
    if (!f.thread.wgmma_open.empty() || !f.thread.wgmma_groups.empty()) {
      throw Error("sim: " + block_name(b) + ", " + thread_name(f.thread) +
                  " exited with wgmma operations not waited for (wgmma.wait_group)");
    }
  } catch (...) {
    if (!b.error) b.error = std::current_exception();
  }
  f.state = FiberState::exited;
  if (b.profile) detail::profile::on_exit(*b.profile, f.thread.linear_tid);
  ++b.exited;
  b.warps[f.thread.warp].exited |= 1u << f.thread.lane;
  detail::fiber_switch(f.context, b.scheduler, /*from_ends=*/true);
  std::abort();  // an exited fiber is never resumed
}

// ---- divergence report ------------------------------------------------------------------------

std::string wait_description(const Block& b, const Fiber& f) {
  switch (f.state) {
    case FiberState::exited: return "exited";
    case FiberState::at_barrier: return "wait at __syncthreads";
    case FiberState::at_collective: {
      const Warp& w = b.warps[f.thread.warp];
      for (const PendingCollective& p : w.pending) {
        if (p.mask != f.collective_mask) continue;
        return "wait at a warp collective (warp " + std::to_string(f.thread.warp) + ", mask " + hex(p.mask) +
               ", lanes still missing " + hex(p.expected & ~p.arrived) + ")";
      }
      return "wait at a warp collective";
    }
    case FiberState::at_group_collective: {
      const unsigned g = f.thread.linear_tid / kWarpgroupSize;
      return "wait at a warpgroup collective (warpgroup " + std::to_string(g) + ", " +
             std::to_string(b.warpgroups[g].arrived) + " of 128 threads arrived)";
    }
    case FiberState::at_mbarrier: return mbarrier_wait_description(b, f);
    case FiberState::at_setmaxnreg: return register_wait_description(b, f);
    case FiberState::ready: return "ready";
  }
  return "?";
}

[[noreturn]] void report_divergence(const Block& b) {
  std::string message = "sim: divergent barrier in " + block_name(b) +
                        ": no thread can proceed (a thread exited or waits at a different barrier "
                        "or warp collective than the others" +
                        std::string(b.hopper ? ", or waits on an mbarrier phase that can no longer complete, "
                                               "or for registers no warpgroup gives back"
                                             : "") +
                        "):";
  unsigned groups = 0;
  for (unsigned t = 0; t < b.thread_count;) {
    const std::string what = wait_description(b, *b.fibers[t]);
    unsigned end = t + 1;
    while (end < b.thread_count && wait_description(b, *b.fibers[end]) == what) ++end;
    if (++groups > 24) {
      message += " ...";
      break;
    }
    message += groups == 1 ? " " : "; ";
    if (end - t == 1) {
      message += thread_name(b.fibers[t]->thread) + " " + what;
    } else {
      message += "threads " + thread_name(b.fibers[t]->thread).substr(7) + ".." +
                 thread_name(b.fibers[end - 1]->thread).substr(7) + " " + what;
    }
    t = end;
  }
  throw Error(message);
}

// ---- one block --------------------------------------------------------------------------------

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void prepare_shared_memory(Worker& w, size_t bytes) {
  const size_t needed = bytes + kSmemGuardBytes;
  if (needed > w.smem_capacity) {
    std::free(w.smem);
    // 1024-byte alignment: what the GPU gives dynamic shared memory (swizzled layouts rely on it).
    w.smem = static_cast<unsigned char*>(std::aligned_alloc(1024, (needed + 1023) / 1024 * 1024));
    if (!w.smem) throw Error("sim: cannot allocate shared memory");
    w.smem_capacity = needed;
  }
  std::memset(w.smem, 0xFF, bytes);  // every float / half read before written is NaN
  std::memset(w.smem + bytes, kSmemGuardByte, kSmemGuardBytes);
}

void check_shared_memory_guard(const Worker& w, const Block& b, size_t bytes) {
  for (size_t i = 0; i < kSmemGuardBytes; ++i) {
    if (w.smem[bytes + i] != kSmemGuardByte) {
      throw Error("sim: " + block_name(b) + " wrote past the end of its dynamic shared memory (" +
                  std::to_string(bytes) + " bytes) at offset " + std::to_string(bytes + i));
    }
  }
}

}  // namespace

void detail::run_block(const LaunchConfig& config, void (*body)(const void*), const void* params, uint64_t linear,
                       uint64_t seed, const race::LaunchState* race, profile::LaunchProfiler* profiler) {
  Worker& w = t_worker;
  detail::install_crash_report();
  const dim3 bd = config.block;
  const dim3 gd = config.grid;
  const unsigned threads = bd.x * bd.y * bd.z;

  while (w.fibers.size() < threads) {
    auto f = std::make_unique<Fiber>();
    f->stack = std::make_unique<detail::FiberStack>(detail::fiber_stack_bytes());
    w.fiber_ptrs.push_back(f.get());
    w.fibers.push_back(std::move(f));
  }
  prepare_shared_memory(w, config.dynamic_smem_bytes);

  Block b;
  w.released.clear();
  b.released = &w.released;
  b.config = &config;
  b.body = body;
  b.params = params;
  b.index = uint3{unsigned(linear % gd.x), unsigned(linear / gd.x % gd.y), unsigned(linear / (uint64_t(gd.x) * gd.y))};
  b.thread_count = threads;
  b.fibers = w.fiber_ptrs.data();
  b.warps.resize((threads + kWarpSize - 1) / kWarpSize);
  for (unsigned i = 0; i < b.warps.size(); ++i) {
    const unsigned lanes = std::min(kWarpSize, threads - i * kWarpSize);
    b.warps[i].existing = lanes == kWarpSize ? ~0u : (1u << lanes) - 1;
  }

  for (unsigned t = 0; t < threads; ++t) {
    Fiber& f = *w.fibers[t];
    ThreadContext& c = f.thread;
    c.thread_idx = uint3{t % bd.x, t / bd.x % bd.y, t / (bd.x * bd.y)};
    c.block_idx = b.index;
    c.block_dim = bd;
    c.grid_dim = gd;
    c.linear_tid = t;
    c.lane = t % kWarpSize;
    c.warp = t / kWarpSize;
    c.dynamic_smem = w.smem;
    c.dynamic_smem_bytes = config.dynamic_smem_bytes;
    c.async_groups.clear();
    c.async_open.clear();
    c.wgmma_open.clear();
    c.wgmma_groups.clear();
    c.wgmma_retired.clear();
    c.wgmma_fenced = false;
    f.state = FiberState::ready;
    f.collective_mask = 0;
    w.released.push_back(&f);
    f.block = &b;
    f.fault = detail::FaultInfo{config.kernel_name, b.index, c.thread_idx,
                                reinterpret_cast<uintptr_t>(f.stack->guard_begin()),
                                reinterpret_cast<uintptr_t>(f.stack->guard_end()), f.stack->size()};
    detail::fiber_prepare(f.context, *f.stack, &fiber_main, &f);
  }
  if (race) {
    w.race.threads.resize(threads);
    for (unsigned t = 0; t < threads; ++t) {
      Fiber& f = *w.fibers[t];
      w.race.threads[t] = &f.race;
    }
    race::begin_block(w.race, *race, b.index, bd, linear, w.smem, config.dynamic_smem_bytes);
    if (race->racecheck) b.race = &w.race;
    if (profiler) {
      profile::begin_block(w.profile, *profiler, w.race.threads.data(), threads);
      b.profile = &w.profile;
    }
  }

  uint64_t rng = seed * 0xD1B54A32D192ED03ull;
  rng ^= splitmix64(rng) + linear;
  splitmix64(rng);

  struct ClearRunning {
    ~ClearRunning() {
      t_fiber = nullptr;
      detail::race::t_thread = nullptr;
      detail::this_thread_heartbeat().running.store(nullptr, std::memory_order_relaxed);
    }
  } clear_running;
  detail::Heartbeat& heartbeat = detail::this_thread_heartbeat();
  for (;;) {
    w.order.swap(w.released);
    w.released.clear();
    if (w.order.empty()) {
      if (b.exited == threads) {
        if (b.hopper) check_block_end(b);
        break;
      }
      // Nothing can run: the TMA writes in flight land now (the latest point the sim may choose),
      // and their complete-tx may release mbarrier waiters. Otherwise it is a deadlock.
      if (!b.hopper || !land_when_stalled(b)) report_divergence(b);
      w.order.swap(w.released);
      w.released.clear();
    }
    for (size_t i = w.order.size(); i > 1; --i) {  // Fisher-Yates; multiply-shift instead of a division
      std::swap(w.order[i - 1], w.order[(splitmix64(rng) >> 32) * i >> 32]);
    }
    for (Fiber* f : w.order) {
      t_fiber = f;
      if (race) detail::race::t_thread = &f->race;  // the hooks: for the racecheck, the profiler or both
      heartbeat.running.store(&f->fault, std::memory_order_relaxed);
      detail::fiber_switch(b.scheduler, f->context);
      heartbeat.running.store(nullptr, std::memory_order_relaxed);
      heartbeat.switches.store(++w.switches, std::memory_order_relaxed);
      t_fiber = nullptr;
      detail::race::t_thread = nullptr;
      if (b.error) std::rethrow_exception(b.error);
      if (b.race && b.race->hazard.space != detail::race::Hazard::Space::none) {
        throw Error(detail::race::describe(*b.race));  // the first hazard the fiber ran into
      }
    }
  }
  check_shared_memory_guard(w, b, config.dynamic_smem_bytes);
  if (b.profile) profile::end_block(*b.profile);
}


// ---- what kernel code calls ---------------------------------------------------------------------

const detail::FaultInfo* detail::running_fault_info() { return t_fiber ? &t_fiber->fault : nullptr; }

bool detail::inside_kernel() { return t_fiber != nullptr; }

ThreadContext& current_thread() { return running_fiber("threadIdx/blockIdx (current_thread)").thread; }

unsigned warp_live_mask() {
  Fiber& f = running_fiber("__activemask");
  const Warp& w = f.block->warps[f.thread.warp];
  return w.existing & ~w.exited;
}

void syncthreads() { (void)syncthreads_count(0); }

int syncthreads_count(int predicate) {
  Fiber& f = running_fiber("__syncthreads");
  Block& b = *f.block;
  f.state = FiberState::at_barrier;
  b.barrier_votes += predicate != 0;
  if (++b.at_barrier == b.thread_count) {
    b.barrier_result = b.barrier_votes;
    b.barrier_votes = 0;
    b.at_barrier = 0;
    if (b.race) detail::race::on_barrier(*b.race);
    if (b.profile) detail::profile::on_barrier(*b.profile);
    for (unsigned t = 0; t < b.thread_count; ++t) release(b, *b.fibers[t]);
  }
  yield_to_scheduler(f);
  // Safe to read now: the next barrier cannot complete (and overwrite it) before this thread gets there.
  return int(b.barrier_result);
}

void syncwarp(unsigned mask) { warp_collective_erased(mask, nullptr, nullptr, nullptr, nullptr); }

void warp_collective_erased(unsigned mask, const void* in, void* out, CollectiveFn fn, void* combine) {
  Fiber& f = running_fiber("a warp collective");
  Block& b = *f.block;
  Warp& w = b.warps[f.thread.warp];
  const unsigned lane = f.thread.lane;
  if (!(mask >> lane & 1u)) {
    throw Error("sim: " + block_name(b) + ", " + thread_name(f.thread) + ": warp collective with mask " + hex(mask) +
                " that leaves out the calling lane " + std::to_string(lane));
  }
  PendingCollective* p = nullptr;
  for (PendingCollective& q : w.pending) {
    if (q.mask == mask) p = &q;
  }
  if (!p) {
    w.pending.emplace_back();
    p = &w.pending.back();
    p->mask = mask;
    p->expected = mask & w.existing;
    p->fn = fn;
  } else if (p->fn != fn) {
    throw Error("sim: " + block_name(b) + ", " + thread_name(f.thread) + ": lanes of warp " +
                std::to_string(f.thread.warp) + " meet at different warp collectives with mask " + hex(mask) +
                " (e.g. a shuffle and a ballot, or __syncwarp and a shuffle)");
  }
  p->ins[lane] = in;
  p->outs[lane] = out;
  p->arrived |= 1u << lane;
  f.state = FiberState::at_collective;
  f.collective_mask = mask;
  if (p->arrived == p->expected) {
    const PendingCollective done = *p;
    w.pending.erase(w.pending.begin() + (p - w.pending.data()));
    for (unsigned l = 0; l < kWarpSize; ++l) {
      if (done.expected >> l & 1u) release(b, *b.fibers[f.thread.warp * kWarpSize + l]);
    }
    if (b.profile) detail::profile::on_warp_collective(*b.profile, f.thread.warp, done.expected, done.fn == nullptr);
    if (done.fn) {
      done.fn(done.ins, done.outs, combine);
    } else if (b.race) {  // __syncwarp: the one warp collective that orders memory
      detail::race::on_syncwarp(*b.race, f.thread.warp, done.expected);
    }
  }
  yield_to_scheduler(f);
}

// The warpgroup's 128 threads meet as a warp's lanes do at a full-mask collective; the last one to
// arrive runs the combine. A thread that exits or waits elsewhere leaves the others waiting: the
// scheduler reports it as a divergence.
void warpgroup_collective_erased(const void* in, void* out, GroupCollectiveFn fn, void* combine) {
  Fiber& f = running_fiber("a warpgroup collective");
  Block& b = *f.block;
  if (b.thread_count % kWarpgroupSize != 0) {
    throw Error("sim: " + block_name(b) + ", " + thread_name(f.thread) + ": warpgroup collective in a block of " +
                std::to_string(b.thread_count) + " threads (a warpgroup is 128 threads: the block must have whole "
                "warpgroups)");
  }
  if (b.warpgroups.empty()) b.warpgroups.resize(b.thread_count / kWarpgroupSize);
  const unsigned group = f.thread.linear_tid / kWarpgroupSize, index = f.thread.linear_tid % kWarpgroupSize;
  PendingGroupCollective& p = b.warpgroups[group];
  if (p.arrived == 0) {
    p.fn = fn;
  } else if (p.fn != fn) {
    throw Error("sim: " + block_name(b) + ", " + thread_name(f.thread) + ": threads of warpgroup " +
                std::to_string(group) + " meet at different warpgroup collectives (e.g. a wgmma and a "
                "wgmma.wait_group)");
  }
  p.ins[index] = in;
  p.outs[index] = out;
  f.state = FiberState::at_group_collective;
  if (++p.arrived == kWarpgroupSize) {
    for (unsigned i = 0; i < kWarpgroupSize; ++i) release(b, *b.fibers[group * kWarpgroupSize + i]);
    p.arrived = 0;  // before the combine: a combine that throws leaves no half-gathered collective
    p.fn = nullptr;
    if (b.profile) detail::profile::on_warpgroup_collective(*b.profile, group);
    fn(p.ins, p.outs, combine);
  }
  yield_to_scheduler(f);
}

}  // namespace selfattn::sim
