// The racecheck's core (see racecheck.h for the model): the shadow of shared and device memory and
// the happens-before test on it; launches, blocks, __syncthreads and __syncwarp (the per-warp clocks,
// and the block-wide ones at a barrier); the checks of shared-memory accesses, retired cp.async
// copies and device-memory writes. The Hopper rules (vector clocks, TMA, the async proxy, wgmma's
// reads) are in racecheck_hopper.cpp, the text of the reports in racecheck_reports.cpp.
#include "racecheck_internal.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>

namespace selfattn::sim::detail::race {

thread_local ThreadState* t_thread __attribute__((tls_model("initial-exec"))) = nullptr;

// ---- happens-before (ordered(): racecheck_internal.h) ---------------------------------------------

void found_shared(BlockState& b, size_t offset, Stamp earlier, uint64_t earlier_site, Stamp later,
                  uint64_t later_site, bool missing_proxy_fence) {
  if (b.hazard.space != Hazard::Space::none) return;  // the first one is reported
  b.hazard.space = Hazard::Space::shared;
  b.hazard.missing_proxy_fence = missing_proxy_fence;
  b.hazard.offset = offset;
  b.hazard.earlier = earlier;
  b.hazard.earlier_site = earlier_site;
  b.hazard.later = later;
  b.hazard.later_site = later_site;
}

namespace {

void reset_warp_clocks(WarpClocks& w, uint32_t epoch) {
  w.epoch = epoch;
  for (unsigned l = 0; l < kWarpSize; ++l)
    for (unsigned k = 0; k < kWarpSize; ++k) w.vc[l][k] = l == k ? 1 : 0;
}

// ---- device memory -------------------------------------------------------------------------------
// A global stamp: the block's serial (32 bits), the thread (10), the block's barrier epoch counted
// from its start (22, wrapping: two writes 2^22 barriers apart would look concurrent).
inline uint64_t global_stamp(const BlockState& b, const ThreadState& t) {
  return uint64_t(b.serial) << 32 | uint64_t(thread_of(t.stamp)) << 22 | ((b.epoch - b.first_epoch) & 0x3FFFFFu);
}

bool global_conflict(const BlockState& b, uint64_t earlier, uint64_t now) {
  const uint32_t serial = uint32_t(earlier >> 32);
  if (uint32_t(serial - b.launch->first_serial) >= b.launch->blocks) return false;  // another launch, or never
  if (serial != b.serial) return true;  // two blocks of one launch
  const unsigned e = unsigned(earlier >> 22) & 1023u, n = unsigned(now >> 22) & 1023u;
  if (e == n) return false;
  if (((earlier ^ now) & 0x3FFFFFu) != 0) return false;  // a __syncthreads lies between them
  if (b.vector_clocks) {
    // As below, across the block: if n ever synchronised with e, give the benefit of the doubt.
    const VectorClock& vc = b.clocks[n];
    return !(e < vc.size() && vc[e] > 0);
  }
  if ((e ^ n) / kWarpSize == 0) {
    // One warp: the global record has no clock. If a __syncwarp joined the two lanes in this
    // interval it may have ordered them: give the benefit of the doubt (no false report).
    const WarpClocks& w = b.warps[n / kWarpSize];
    if (w.epoch == b.epoch && w.vc[n % kWarpSize][e % kWarpSize] > 0) return false;
  }
  return true;
}

}  // namespace

// ---- launch and block -----------------------------------------------------------------------------

void begin_launch(LaunchState& launch, const LaunchConfig& config, uint64_t blocks) {
  // Serials are handed out under the launch mutex (launches run one at a time). Serial 0 is never
  // used, so a shadow cell never written (zeros) belongs to no launch.
  static uint32_t next_serial = 1;
  launch.config = &config;
  launch.blocks = blocks;
  launch.check_global = blocks < (uint64_t(1) << 31);
  if (!launch.check_global) return;
  if (uint64_t(next_serial) + blocks > 0xFFFFFFFFull) next_serial = 1;
  launch.first_serial = next_serial;
  next_serial += uint32_t(blocks);
  device_ranges(launch.ranges);
  launch.lowest = launch.ranges.empty() ? 0 : launch.ranges.front().mapped_begin;
  launch.highest = 0;
  for (const DeviceRange& r : launch.ranges) launch.highest = std::max(launch.highest, r.mapped_end);
}

void begin_block(BlockState& b, const LaunchState& launch, uint3 index, dim3 block_dim, uint64_t linear,
                 unsigned char* smem, size_t smem_bytes) {
  if (b.epoch >= 0x80000000u) {  // epochs would wrap: forget every record (never, in practice)
    std::fill(b.cells.begin(), b.cells.end(), Cell{});
    for (WarpClocks& w : b.warps) w.epoch = 0;
    b.epoch = 0;
  }
  b.launch = &launch;
  b.index = index;
  b.block_dim = block_dim;
  b.linear = linear;
  b.serial = launch.first_serial + uint32_t(linear);
  b.first_epoch = b.epoch = b.epoch + 1;
  if (b.cells.size() < smem_bytes) {
    b.cells.resize(smem_bytes);
    b.sites.resize(smem_bytes);
  }
  const size_t warps = (b.threads.size() + kWarpSize - 1) / kWarpSize;
  if (b.warps.size() < warps) b.warps.resize(warps);
  b.hazard = Hazard{};
  b.vector_clocks = false;
  b.agent_barrier.clear();
  b.agent_clock.clear();
  for (size_t t = 0; t < b.threads.size(); ++t) {
    ThreadState& s = *b.threads[t];
    s.smem_begin = reinterpret_cast<uintptr_t>(smem);
    s.smem_bytes = smem_bytes;
    s.device_lowest = launch.lowest;
    s.device_span = launch.check_global ? launch.highest - launch.lowest : 0;
    s.stamp = make_stamp(b.epoch, unsigned(t), 1);
    s.last_fence = 0;
    s.block = &b;
    s.last_range = nullptr;
    s.checks = launch.racecheck;
    s.profile = nullptr;  // the profiler's begin_block sets it when the launch profiles
    s.profile_muted = false;
  }
}

void on_barrier(BlockState& b) {
  ++b.epoch;
  if (b.vector_clocks) {
    // What any thread acquired from a TMA agent (a landed write's phase) before the barrier, every
    // thread knows after it: the agents' entries (ids past the threads) are joined over the block.
    const size_t threads = b.threads.size();
    size_t ids = threads;
    for (size_t t = 0; t < threads; ++t) ids = std::max(ids, b.clocks[t].size());
    if (ids > threads) {
      VectorClock agents(ids, 0);
      for (size_t t = 0; t < threads; ++t) {
        const VectorClock& vc = b.clocks[t];
        for (size_t k = threads; k < vc.size(); ++k) agents[k] = std::max(agents[k], vc[k]);
      }
      for (size_t t = 0; t < threads; ++t) {
        VectorClock& vc = b.clocks[t];
        vc.resize(ids, 0);
        for (size_t k = threads; k < ids; ++k) vc[k] = std::max(vc[k], agents[k]);
      }
    }
    // The clocks go on (never back: mbarrier phases hold clock values from before the barrier).
    for (size_t t = 0; t < b.threads.size(); ++t) {
      b.threads[t]->stamp = make_stamp(b.epoch, unsigned(t), b.clocks[t][t]);
    }
    return;
  }
  for (size_t t = 0; t < b.threads.size(); ++t) b.threads[t]->stamp = make_stamp(b.epoch, unsigned(t), 1);
}

void on_syncwarp(BlockState& b, unsigned warp, unsigned lanes) {
  if (b.vector_clocks) {
    VectorClock joined;
    for (unsigned l = 0; l < kWarpSize; ++l) {
      if (lanes >> l & 1u) join(joined, b.clocks[warp * kWarpSize + l]);
    }
    for (unsigned l = 0; l < kWarpSize; ++l) {
      if (!(lanes >> l & 1u)) continue;
      const unsigned thread = warp * kWarpSize + l;
      VectorClock& vc = b.clocks[thread];
      vc = joined;
      vc[thread] = std::min(joined[thread] + 1, kMaxClock);
      b.threads[thread]->stamp = make_stamp(b.epoch, thread, vc[thread]);
    }
    return;
  }
  WarpClocks& w = b.warps[warp];
  if (w.epoch != b.epoch) reset_warp_clocks(w, b.epoch);
  uint32_t joined[kWarpSize] = {};
  for (unsigned l = 0; l < kWarpSize; ++l) {
    if (!(lanes >> l & 1u)) continue;
    for (unsigned k = 0; k < kWarpSize; ++k) joined[k] = std::max(joined[k], w.vc[l][k]);
  }
  for (unsigned l = 0; l < kWarpSize; ++l) {
    if (!(lanes >> l & 1u)) continue;
    std::memcpy(w.vc[l], joined, sizeof joined);
    w.vc[l][l] = std::min(joined[l] + 1, kMaxClock);
    const unsigned thread = warp * kWarpSize + l;
    b.threads[thread]->stamp = make_stamp(b.epoch, thread, w.vc[l][l]);
  }
}

// ---- accesses -----------------------------------------------------------------------------------

void shared_access(ThreadState& t, size_t offset, size_t bytes, Kind kind, uintptr_t pc) {
  BlockState& b = *t.block;
  const size_t end = std::min(offset + bytes, t.smem_bytes);
  const bool write = writes(kind);
  const Stamp now = t.stamp;
  const Stamp mine = kind == Kind::cp_async_write || kind == Kind::tma_write ? now | kInFlight : now;
  const Stamp floor = Stamp(b.first_epoch) << 32;  // records below it are an earlier block's
  const uint64_t where = site(pc, kind);
  for (size_t i = offset; i < end; ++i) {
    Cell& c = b.cells[i];
    if (c.write >= floor && ((c.write & kInFlight) || !ordered(b, c.write, now))) {
      found_shared(b, i, c.write, b.sites[i].write, mine, where);
    }
    if (!write) {
      if (c.read[0] == mine || c.read[1] == mine) continue;
      // Two readers are kept. This read replaces one it is ordered after (a later write that races
      // with that one races with this one too); if both are concurrent with it, they stay: a later
      // write races with them unless it is ordered after both, which only __syncwarp can do (a
      // third reader in another warp is then missed: the price of two slots).
      // A wgmma read in flight is never replaced: a write before it is performed is a hazard.
      int slot = 0;
      if (c.read[0] >= floor && ((c.read[0] & kInFlight) || !ordered(b, c.read[0], now))) {
        if (c.read[1] >= floor && ((c.read[1] & kInFlight) || !ordered(b, c.read[1], now))) continue;
        slot = 1;
      }
      c.read[slot] = mine;
      b.sites[i].read[slot] = where;
    } else {
      for (int r = 0; r < 2; ++r) {
        if (c.read[r] >= floor && ((c.read[r] & kInFlight) || !ordered(b, c.read[r], now))) {
          found_shared(b, i, c.read[r], b.sites[i].read[r], mine, where);
        }
      }
      c.write = mine;
      c.read[0] = c.read[1] = 0;
      b.sites[i].write = where;
    }
  }
}

void async_landed(ThreadState& t, size_t offset, size_t bytes) {
  BlockState& b = *t.block;
  const size_t end = std::min(offset + bytes, t.smem_bytes);
  const Stamp floor = Stamp(b.first_epoch) << 32;
  const unsigned thread = thread_of(t.stamp);
  for (size_t i = offset; i < end; ++i) {
    Cell& c = b.cells[i];
    // The copy's write now happens, at the wait: ordered for others only by what follows it.
    if (c.write >= floor && (c.write & kInFlight) && thread_of(c.write) == thread &&
        kind_of(b.sites[i].write) == Kind::cp_async_write) {
      c.write = t.stamp;
    }
  }
}

void global_write(ThreadState& t, const DeviceRange& range, uintptr_t address, size_t bytes, uintptr_t pc) {
  BlockState& b = *t.block;
  const LaunchState& launch = *b.launch;
  GlobalCell* cells = range.shadow->cells();
  if (cells == nullptr) return;
  const size_t offset = address - range.begin;
  const size_t end = std::min(offset + bytes, size_t(range.end - range.begin));
  const uint64_t now = global_stamp(b, t);
  const uint64_t where = site(pc, Kind::write);
  for (size_t i = offset; i < end; ++i) {
    GlobalCell& c = cells[i];
    if (c.stamp.load(std::memory_order_relaxed) == now) continue;
    // An exchange: of two workers writing one byte at once, the second sees the first. (The site
    // is only for the report: at worst it names a third writer's line.)
    const uint64_t earlier = c.stamp.exchange(now, std::memory_order_relaxed);
    const uint64_t earlier_site = c.site.load(std::memory_order_relaxed);
    c.site.store(where, std::memory_order_relaxed);
    if (global_conflict(b, earlier, now) && b.hazard.space == Hazard::Space::none) {
      b.hazard.space = Hazard::Space::global;
      b.hazard.offset = i;
      b.hazard.buffer = range.label;
      b.hazard.earlier = earlier;
      b.hazard.earlier_site = earlier_site;
      b.hazard.earlier_block = uint32_t(earlier >> 32) - launch.first_serial;
      b.hazard.later = now;
      b.hazard.later_site = where;
    }
  }
}

// ---- device shadow --------------------------------------------------------------------------------

GlobalShadow::~GlobalShadow() {
  if (GlobalCell* c = cells_.load()) munmap(c, bytes_ * sizeof(GlobalCell));
}

GlobalCell* GlobalShadow::cells() {
  GlobalCell* c = cells_.load(std::memory_order_acquire);
  if (c != nullptr || bytes_ == 0) return c;
  void* p = mmap(nullptr, bytes_ * sizeof(GlobalCell), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return nullptr;  // unchecked, not wrong
  GlobalCell* expected = nullptr;
  if (!cells_.compare_exchange_strong(expected, static_cast<GlobalCell*>(p), std::memory_order_acq_rel)) {
    munmap(p, bytes_ * sizeof(GlobalCell));  // another worker reserved it first
    return expected;
  }
  return static_cast<GlobalCell*>(p);
}

}  // namespace selfattn::sim::detail::race

// ---- what the primitives' sim twins call ----------------------------------------------------------

namespace selfattn::sim {

using detail::race::t_thread;

void racecheck_shared(const void* address, size_t bytes, SharedAccess what, const void* site) {
  detail::race::ThreadState* t = t_thread;
  if (t == nullptr || !t->checks) return;
  const uintptr_t p = reinterpret_cast<uintptr_t>(address);
  if (p - t->smem_begin >= t->smem_bytes) return;
  const auto kind = what == SharedAccess::ldmatrix_row ? detail::race::Kind::ldmatrix_read
                                                       : detail::race::Kind::cp_async_write;
  detail::race::shared_access(*t, p - t->smem_begin, bytes, kind, reinterpret_cast<uintptr_t>(site));
}

void racecheck_async_landed(const void* address, size_t bytes) {
  detail::race::ThreadState* t = t_thread;
  if (t == nullptr || !t->checks) return;
  const uintptr_t p = reinterpret_cast<uintptr_t>(address);
  if (p - t->smem_begin >= t->smem_bytes) return;
  detail::race::async_landed(*t, p - t->smem_begin, bytes);
}

}  // namespace selfattn::sim
