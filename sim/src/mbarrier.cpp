// Hopper synchronisation on the block engine: mbarriers (PTX ISA "mbarrier"), TMA writes that land
// on them, and what the racecheck learns from both (sim.h, "Hopper"; sim/README.md, "Hopper").
//
// Phases. A barrier counts completed phases (`phase`); the current phase completes when its
// pending arrivals reach 0 and its tx-count is 0, and the next starts with the full arrival count.
// A wait on parity p returns when the current phase's parity differs from p: the phase before it,
// which has parity p, has completed. Completion releases the waiters into the next round; each
// has acquired the phase at that moment (it observed it then, as try_wait would have).
//
// Landing. A TMA write lands at the latest point the hardware allows: when a thread tests or waits
// on its barrier and only transactions are outstanding (the arrivals are all in), or when no fiber
// of the block can run. Landing copies the image, releases the issuer's history at the issue (and
// the write itself, as a write by the barrier's TMA agent) into the current phase, and performs
// complete-tx. So a consumer that reads a stage without waiting on its barrier meets the write in
// flight, or, if another thread's wait landed it, unordered.
//
// Which phase a parity means. Per (barrier, thread) the number of completed phases the thread has
// observed: at each arrival (an arrive returns the phase it arrived on) and at each passed wait or
// test. If the barrier is two or more phases past it, parity p names two completed phases at once:
// reported. The ring pattern stays within one: a consumer waits full[s] once per round (the
// producer cannot refill the stage before the consumer arrives on empty[s]); the producer waits
// empty[s] with the opposite parity, round 0's passing at once on the fresh barrier, and its own
// arrive on full[s] keeps its count current for a wait on full[s].
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "compiled_kernels.h"
#include "engine_block.h"

namespace selfattn::sim {

using namespace detail::engine;

namespace {

constexpr unsigned kMaxArrivalCount = (1u << 20) - 1;  // mbarrier.init's count range (PTX ISA)

[[noreturn]] void fail(const Fiber& f, const std::string& what) {
  throw Error("sim: " + block_name(*f.block) + ", " + thread_name(f.thread) + ": " + what);
}

[[noreturn]] void fail_at(const Fiber& f, const char* op, uint32_t offset, const std::string& problem) {
  fail(f, std::string(op) + " on the mbarrier at shared offset " + std::to_string(offset) + ": " + problem);
}

// The barrier's offset in dynamic shared memory, checked: 8 bytes, 8-byte aligned, inside.
uint32_t barrier_offset(const Fiber& f, const void* bar, const char* op) {
  const ThreadContext& c = f.thread;
  const auto* p = static_cast<const unsigned char*>(bar);
  const uintptr_t offset = uintptr_t(p) - uintptr_t(c.dynamic_smem);
  if (uintptr_t(p) < uintptr_t(c.dynamic_smem) || offset + 8 > c.dynamic_smem_bytes || offset % 8 != 0) {
    char address[32];
    std::snprintf(address, sizeof address, "%p", bar);
    fail(f, std::string(op) + " at address " + address +
                ": an mbarrier is 8 bytes at an 8-byte aligned offset of the block's dynamic shared memory (" +
                std::to_string(c.dynamic_smem_bytes) + " bytes)");
  }
  return uint32_t(offset);
}

Mbarrier* find(HopperState* h, uint32_t offset) {
  if (h == nullptr) return nullptr;
  for (Mbarrier& m : h->barriers) {
    if (m.offset == offset) return &m;
  }
  return nullptr;
}

Mbarrier& live_barrier(const Fiber& f, const void* bar, const char* op) {
  const uint32_t offset = barrier_offset(f, bar, op);
  Mbarrier* m = find(f.block->hopper.get(), offset);
  if (m == nullptr) fail_at(f, op, offset, "no initialised mbarrier there (mbarrier.init it first)");
  return *m;
}

std::string phase_state(const Mbarrier& m) {
  return "phase " + std::to_string(m.phase) + " has " + std::to_string(m.pending) + " of " +
         std::to_string(m.arrival_count) + " arrivals and " + std::to_string(m.tx) + " transaction bytes outstanding" +
         (m.tma_in_flight ? ", " + std::to_string(m.tma_in_flight) + " TMA write(s) in flight" : std::string());
}

// The thread sees the last completed phase: it acquires what the phases released.
void observe_completed(Block& b, Mbarrier& m, unsigned thread) {
  if (b.race) detail::race::acquire_from(*b.race, thread, m.completed);
  m.observed[thread] = m.phase;
}

void complete_if_done(Block& b, Mbarrier& m) {
  if (m.pending != 0 || m.tx != 0) return;
  ++m.phase;
  m.pending = m.arrival_count;
  if (b.race) {
    // Cumulative: a phase completes only after the one before it, so acquiring phase k also gives
    // what earlier phases released.
    detail::race::join(m.completed, m.releases);
    m.releases.clear();
  }
  for (unsigned t : m.waiters) {
    observe_completed(b, m, t);
    release(b, *b.fibers[t]);
  }
  m.waiters.clear();
}

void land(Block& b, TmaInFlight& w) {
  Mbarrier& m = *find(b.hopper.get(), w.barrier);  // a barrier with writes in flight is never re-initialised
  std::memcpy(b.fibers[0]->thread.dynamic_smem + w.dst, w.image.data(), w.image.size());
  if (b.race) {
    const uint32_t clock = detail::race::tma_landed(*b.race, m.agent, w.dst, w.image.size(),
                                                    reinterpret_cast<uintptr_t>(w.site));
    detail::race::join(m.releases, w.issuer_clock);
    if (m.releases.size() <= m.agent) m.releases.resize(m.agent + 1, 0);
    m.releases[m.agent] = std::max(m.releases[m.agent], clock);
  }
  m.tx -= int64_t(w.image.size());
  --m.tma_in_flight;
  complete_if_done(b, m);
}

// Lands the writes in flight that count on the barrier at `offset` (all of them: -1), in issue order.
void land_all(Block& b, int64_t offset) {
  std::vector<TmaInFlight>& tma = b.hopper->tma;
  std::vector<TmaInFlight> landing;
  size_t kept = 0;
  for (size_t i = 0; i < tma.size(); ++i) {
    if (offset < 0 || tma[i].barrier == uint32_t(offset)) {
      landing.push_back(std::move(tma[i]));
    } else {
      if (kept != i) tma[kept] = std::move(tma[i]);
      ++kept;
    }
  }
  tma.resize(kept);
  for (TmaInFlight& w : landing) land(b, w);
}

// Whether the phase with `parity` has completed, for the calling thread (test_wait / try_wait).
bool phase_with_parity_done(Fiber& f, Mbarrier& m, unsigned parity, const char* op) {
  Block& b = *f.block;
  const unsigned t = f.thread.linear_tid;
  if (parity > 1) fail_at(f, op, m.offset, "parity " + std::to_string(parity) + " (it is 0 or 1)");
  if (m.phase - m.observed[t] >= 2) {
    fail_at(f, op, m.offset,
            "the barrier has completed " + std::to_string(m.phase - m.observed[t]) +
                " phases since this thread last observed it (after phase " + std::to_string(m.observed[t]) +
                "): parity " + std::to_string(parity) +
                " no longer says which phase it means (a thread must not fall two phases behind)");
  }
  if ((m.phase & 1u) != parity) {
    observe_completed(b, m, t);
    return true;
  }
  if (m.pending == 0 && m.tma_in_flight > 0) {  // only transactions outstanding: they land now
    land_all(b, m.offset);
    if ((m.phase & 1u) != parity) {
      observe_completed(b, m, t);
      return true;
    }
  }
  return false;
}

void arrive(Fiber& f, Mbarrier& m, unsigned count, const char* op) {
  Block& b = *f.block;
  const unsigned t = f.thread.linear_tid;
  if (count == 0 || count > m.pending) {
    fail_at(f, op, m.offset,
            std::to_string(count) + " arrival(s) when the current phase has " + std::to_string(m.pending) +
                " pending (more arrivals than the phase expects; " + phase_state(m) + ")");
  }
  if (b.race) detail::race::release_into(*b.race, t, m.releases);
  m.observed[t] = std::max(m.observed[t], m.phase);
  m.pending -= count;
  complete_if_done(b, m);
}

void expect_tx(Block& b, Mbarrier& m, unsigned tx_bytes) {
  m.tx += tx_bytes;
  complete_if_done(b, m);  // bytes that landed early (negative tx-count) may now balance
}

// ---- the register pool (setmaxnreg) ----
// What the launch gave each thread: what ptxas gave the kernel where its report is recorded
// (compiled_kernels.cpp), else what it allocates under __launch_bounds__(threads, 1), the most a
// block of this size can get (65536 per SM, in multiples of 8 per thread, at most 256).
unsigned launch_registers(const Block& b) {
  const unsigned compiled = detail::compiled_registers(b.config->kernel_key);
  return compiled != 0 ? (compiled + 7) / 8 * 8 : std::min(65536u / b.thread_count / 8 * 8, 256u);
}
// setmaxnreg moves registers within what the launch gave the block, never beyond.
uint64_t register_pool(const Block& b) { return uint64_t(launch_registers(b)) * b.thread_count; }
uint64_t registers_in_use(const Block& b) {
  uint64_t used = 0;
  for (unsigned count : b.hopper->registers) used += uint64_t(count) * kWarpgroupSize;
  return used;
}

// Lets waiting setmaxnreg.inc requests through, oldest first, while the pool has room for them.
void grant_waiting_increases(Block& b) {
  std::vector<Fiber*>& waiters = b.hopper->register_waiters;
  for (auto it = waiters.begin(); it != waiters.end();) {
    Fiber& w = **it;
    unsigned& held = b.hopper->registers[w.thread.linear_tid / kWarpgroupSize];
    if (registers_in_use(b) + uint64_t(w.setmaxnreg_count - held) * kWarpgroupSize > register_pool(b)) break;
    held = w.setmaxnreg_count;
    release(b, w);
    it = waiters.erase(it);
  }
}

}  // namespace

// ---- the scheduler's side ---------------------------------------------------------------------------

bool detail::engine::land_when_stalled(Block& b) {
  if (b.hopper->tma.empty()) return false;
  land_all(b, -1);
  return !b.released->empty();
}

void detail::engine::check_block_end(const Block& b) {
  const std::vector<TmaInFlight>& tma = b.hopper->tma;
  if (tma.empty()) return;
  const TmaInFlight& w = tma.front();
  throw Error("sim: " + block_name(b) + " ended with " + std::to_string(tma.size()) +
              " TMA write(s) in flight: " + thread_name(b.fibers[w.issuer]->thread) + " issued one at " +
              detail::race::code_location(reinterpret_cast<uintptr_t>(w.site)) + " (" +
              std::to_string(w.image.size()) + " bytes to shared offset " + std::to_string(w.dst) +
              ", counted by the mbarrier at shared offset " + std::to_string(w.barrier) +
              ") that no thread waited for");
}

std::string detail::engine::mbarrier_wait_description(const Block& b, const Fiber& f) {
  std::string text = "wait at mbarrier (offset " + std::to_string(f.mbarrier_offset) + ", parity " +
                     std::to_string(f.mbarrier_parity) + ")";
  if (const Mbarrier* m = find(b.hopper.get(), f.mbarrier_offset)) text += ": its " + phase_state(*m);
  return text;
}

// ---- what kernel code calls ---------------------------------------------------------------------------

void setmaxnreg(unsigned count, bool increase) {
  Fiber& f = running_fiber("setmaxnreg");
  Block& b = *f.block;
  const char* op = increase ? "setmaxnreg.inc" : "setmaxnreg.dec";
  if (!b.hopper) b.hopper = std::make_unique<HopperState>();
  std::vector<unsigned>& counts = b.hopper->registers;
  if (counts.empty()) counts.assign(b.thread_count / kWarpgroupSize, launch_registers(b));
  const unsigned group = f.thread.linear_tid / kWarpgroupSize;
  const unsigned current = counts[group];
  if (increase ? count < current : count > current) {
    fail(f, std::string(op) + " " + std::to_string(count) + " from the warpgroup's current " + std::to_string(current) +
                " registers per thread (an inc must not lower the count, a dec must not raise it)");
  }
  if (!increase) {
    counts[group] = count;
    grant_waiting_increases(b);  // what the dec gave back may be what an inc waits for
    return;
  }
  if (registers_in_use(b) + uint64_t(count - current) * kWarpgroupSize <= register_pool(b)) {
    counts[group] = count;
    return;
  }
  // setmaxnreg.inc blocks until the pool has room (PTX ISA): until other warpgroups' dec give
  // registers back. If none ever does, no thread can run and the block's report names this wait.
  f.state = FiberState::at_setmaxnreg;
  f.setmaxnreg_count = count;
  b.hopper->register_waiters.push_back(&f);
  yield_to_scheduler(f);
}

std::string detail::engine::register_wait_description(const Block& b, const Fiber& f) {
  const unsigned group = f.thread.linear_tid / kWarpgroupSize;
  const std::vector<unsigned>& counts = b.hopper->registers;
  std::string held;
  for (size_t g = 0; g < counts.size(); ++g) held += (g ? ", " : "") + std::to_string(counts[g]);
  const uint64_t free = register_pool(b) - registers_in_use(b);
  return "wait at setmaxnreg.inc " + std::to_string(f.setmaxnreg_count) + " (warpgroup " + std::to_string(group) +
         " holds " + std::to_string(counts[group]) + " registers per thread and needs " +
         std::to_string(uint64_t(f.setmaxnreg_count - counts[group]) * kWarpgroupSize) + " more; the block's pool of " +
         std::to_string(register_pool(b)) + " (" + std::to_string(launch_registers(b)) + " x " +
         std::to_string(b.thread_count) + " threads at launch) has " + std::to_string(free) +
         " free, the warpgroups holding " + held + " per thread: no setmaxnreg.dec will give it more)";
}

void mbarrier_init(void* bar, unsigned arrival_count) {
  Fiber& f = running_fiber("mbarrier.init");
  Block& b = *f.block;
  const char* op = "mbarrier.init";
  const uint32_t offset = barrier_offset(f, bar, op);
  if (arrival_count == 0 || arrival_count > kMaxArrivalCount) {
    fail_at(f, op, offset,
            "arrival count " + std::to_string(arrival_count) + " (it is 1 .. " + std::to_string(kMaxArrivalCount) + ")");
  }
  if (!b.hopper) b.hopper = std::make_unique<HopperState>();
  if (b.race) detail::race::use_vector_clocks(*b.race);
  Mbarrier* m = find(b.hopper.get(), offset);
  if (m != nullptr) {
    if (m->pending != m->arrival_count || m->tx != 0 || m->tma_in_flight != 0 || !m->waiters.empty()) {
      fail_at(f, op, offset,
              "re-initialised while its current phase is in progress (re-arming a live barrier: its " +
                  phase_state(*m) + (m->waiters.empty() ? "" : ", with threads waiting on it") + ")");
    }
  } else {
    b.hopper->barriers.emplace_back();
    m = &b.hopper->barriers.back();
    m->offset = offset;
    if (b.race) m->agent = detail::race::new_agent(*b.race, offset);
  }
  m->arrival_count = m->pending = arrival_count;
  m->tx = 0;
  m->phase = 0;
  m->initialised_by = f.thread.linear_tid;
  m->init_fenced = false;
  m->observed.assign(b.thread_count, 0);
  m->releases.clear();
  m->completed.clear();
}

void fence_mbarrier_init() {
  Fiber& f = running_fiber("fence.mbarrier_init");
  if (!f.block->hopper) return;
  for (Mbarrier& m : f.block->hopper->barriers) {
    if (m.initialised_by == f.thread.linear_tid) m.init_fenced = true;
  }
}

void mbarrier_arrive(void* bar, unsigned count) {
  Fiber& f = running_fiber("mbarrier.arrive");
  arrive(f, live_barrier(f, bar, "mbarrier.arrive"), count, "mbarrier.arrive");
}

void mbarrier_expect_tx(void* bar, unsigned tx_bytes) {
  Fiber& f = running_fiber("mbarrier.expect_tx");
  expect_tx(*f.block, live_barrier(f, bar, "mbarrier.expect_tx"), tx_bytes);
}

void mbarrier_arrive_expect_tx(void* bar, unsigned tx_bytes) {
  Fiber& f = running_fiber("mbarrier.arrive.expect_tx");
  const char* op = "mbarrier.arrive.expect_tx";
  Mbarrier& m = live_barrier(f, bar, op);
  if (m.pending == 0) arrive(f, m, 1, op);  // throws (an arrival too many) before the tx-count changes
  m.tx += tx_bytes;  // one operation: the phase cannot complete between the expect-tx and the arrival
  arrive(f, m, 1, op);
}

bool mbarrier_test_parity(void* bar, unsigned parity) {
  Fiber& f = running_fiber("mbarrier.test_wait");
  return phase_with_parity_done(f, live_barrier(f, bar, "mbarrier.test_wait.parity"), parity,
                                "mbarrier.test_wait.parity");
}

void mbarrier_wait_parity(void* bar, unsigned parity) {
  Fiber& f = running_fiber("mbarrier.try_wait");
  Mbarrier& m = live_barrier(f, bar, "mbarrier.try_wait.parity");
  if (phase_with_parity_done(f, m, parity, "mbarrier.try_wait.parity")) return;
  f.state = FiberState::at_mbarrier;
  f.mbarrier_offset = m.offset;
  f.mbarrier_parity = parity;
  m.waiters.push_back(f.thread.linear_tid);
  yield_to_scheduler(f);  // the phase's completion acquired it for this thread and released it
}

void tma_write(void* bar, void* dst, std::vector<unsigned char> image, const void* site) {
  Fiber& f = running_fiber("a TMA write (cp.async.bulk.tensor)");
  Block& b = *f.block;
  const char* op = "cp.async.bulk.tensor";
  Mbarrier& m = live_barrier(f, bar, op);
  const ThreadContext& c = f.thread;
  const uintptr_t offset = uintptr_t(dst) - uintptr_t(c.dynamic_smem);
  const size_t bytes = image.size();
  if (uintptr_t(dst) < uintptr_t(c.dynamic_smem) || offset + bytes > c.dynamic_smem_bytes) {
    fail(f, std::string(op) + ": destination [" + std::to_string(intptr_t(offset)) + ", " +
                std::to_string(intptr_t(offset + bytes)) + ") is not inside the block's dynamic shared memory (" +
                std::to_string(c.dynamic_smem_bytes) + " bytes)");
  }
  if (offset % 16 != 0 || bytes == 0 || bytes % 16 != 0) {
    fail(f, std::string(op) + ": destination offset " + std::to_string(offset) + " and size " + std::to_string(bytes) +
                " must be non-zero multiples of 16 bytes");
  }
  for (const Mbarrier& other : b.hopper->barriers) {
    if (other.offset < offset + bytes && offset < other.offset + 8) {
      fail(f, std::string(op) + ": destination [" + std::to_string(offset) + ", " + std::to_string(offset + bytes) +
                  ") overlaps the mbarrier at shared offset " + std::to_string(other.offset));
    }
  }
  if (!m.init_fenced) {
    // The TMA unit completes its bytes on the barrier through the async proxy, which sees the
    // generic proxy's mbarrier.init only after the initialising thread's fence.mbarrier_init.
    fail(f, std::string(op) + ": its mbarrier at shared offset " + std::to_string(m.offset) + " was initialised by " +
                thread_name(b.fibers[m.initialised_by]->thread) +
                " with no fence.mbarrier_init (fence_barrier_init) after the init: the TMA unit (the async proxy) "
                "may not see the initialised barrier");
  }
  TmaInFlight w;
  w.barrier = m.offset;
  w.dst = uint32_t(offset);
  w.image = std::move(image);
  w.issuer = c.linear_tid;
  w.site = site;
  if (b.race) {
    detail::race::tma_issued(f.race, offset, bytes, reinterpret_cast<uintptr_t>(site));
    detail::race::release_into(*b.race, c.linear_tid, w.issuer_clock);
  }
  ++m.tma_in_flight;
  b.hopper->tma.push_back(std::move(w));
}

}  // namespace selfattn::sim
