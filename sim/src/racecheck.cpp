// The racecheck's shadow state, happens-before test and reports (see racecheck.h for the model).
#include "racecheck.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace selfattn::sim::detail::race {

thread_local ThreadState* t_thread __attribute__((tls_model("initial-exec"))) = nullptr;

namespace {

// ---- happens-before ------------------------------------------------------------------------------

// Whether the access recorded as `earlier` is ordered before an access by `now` (not in flight;
// both of the running block).
inline bool ordered(const BlockState& b, Stamp earlier, Stamp now) {
  const unsigned e = thread_of(earlier), n = thread_of(now);
  if (e >= b.threads.size()) {
    // A landed TMA write (its barrier's agent): ordered only through a phase it counted, acquired by
    // this thread or by one a __syncthreads since put before it (on_barrier joins the agents'
    // entries). A __syncthreads alone is no such promise: nothing may have waited for the write.
    if (!b.vector_clocks) return false;  // never: agents come with the vector clocks
    const VectorClock& vc = b.clocks[n];
    return e < vc.size() && clock_of(earlier) <= vc[e];
  }
  if (epoch_of(earlier) < epoch_of(now)) return true;  // a __syncthreads lies between them
  if (e == n) return true;  // program order
  if (__builtin_expect(b.vector_clocks, 0)) {
    const VectorClock& vc = b.clocks[n];
    return e < vc.size() && clock_of(earlier) <= vc[e];
  }
  if ((e ^ n) / kWarpSize != 0) return false;
  const WarpClocks& w = b.warps[n / kWarpSize];
  return w.epoch == epoch_of(now) && clock_of(earlier) <= w.vc[n % kWarpSize][e % kWarpSize];
}

void found_shared(BlockState& b, size_t offset, Stamp earlier, uint64_t earlier_site, Stamp later,
                  uint64_t later_site, bool missing_proxy_fence = false) {
  if (b.hazard.space != Hazard::Space::none) return;  // the first one is reported
  b.hazard.space = Hazard::Space::shared;
  b.hazard.missing_proxy_fence = missing_proxy_fence;
  b.hazard.offset = offset;
  b.hazard.earlier = earlier;
  b.hazard.earlier_site = earlier_site;
  b.hazard.later = later;
  b.hazard.later_site = later_site;
}

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

// ---- reports ------------------------------------------------------------------------------------

std::string hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string base_name(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// "file:line" of the code at `pc`, with the chain of functions it is inlined into ("a.cuh:12 in
// b.cuh:30 in kernel.cuh:77"), from the line tables (-g1) by addr2line; frames inside the sim's
// own headers (compat.h, primitives*.cuh) are dropped from the front, so an ldmatrix row names the
// kernel line that loads it. Without line tables: the module and offset.
std::string code_location_of(uintptr_t pc) {
  if (pc == 0) return "?";
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(pc), &info) == 0 || info.dli_fname == nullptr || info.dli_fbase == nullptr) {
    return hex(pc);
  }
  const auto* header = static_cast<const ElfW(Ehdr)*>(info.dli_fbase);
  // pc is a return address: -1 lands inside the call instruction, on the access's own line.
  const uintptr_t address = (header->e_type == ET_DYN ? pc - reinterpret_cast<uintptr_t>(info.dli_fbase) : pc) - 1;
  std::string module = info.dli_fname;
  if (module.empty() || access(module.c_str(), R_OK) != 0) module = "/proc/self/exe";
  const std::string fallback = base_name(module) + "+" + hex(address) +
                               (info.dli_sname ? std::string(" (") + info.dli_sname + ")" : std::string());

  const std::string command = "addr2line -f -i -C -e " + shell_quote(module) + " " + hex(address) + " 2>/dev/null";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return fallback;
  std::vector<std::string> lines;
  char buffer[4096];
  while (std::fgets(buffer, sizeof buffer, pipe)) {
    std::string line = buffer;
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
    lines.push_back(line);
  }
  pclose(pipe);
  std::vector<std::string> frames;  // innermost first; lines alternate function, file:line
  for (size_t i = 1; i < lines.size(); i += 2) {
    std::string where = lines[i];
    const size_t space = where.find(' ');  // " (discriminator N)"
    if (space != std::string::npos) where.resize(space);
    if (where.empty() || where[0] == '?') continue;
    frames.push_back(base_name(where));
  }
  auto internal = [](const std::string& f) { return f.rfind("compat.h:", 0) == 0 || f.rfind("primitives", 0) == 0; };
  size_t first = 0;
  while (first + 1 < frames.size() && internal(frames[first])) ++first;
  if (first == frames.size()) return fallback;
  std::string text = frames[first];
  for (size_t i = first + 1, shown = 1; i < frames.size() && shown < 3; ++i) {
    if (frames[i] == frames[i - 1]) continue;
    text += " in " + frames[i];
    ++shown;
  }
  return text;
}

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::read: return "read";
    case Kind::write: return "write";
    case Kind::ldmatrix_read: return "ldmatrix read";
    case Kind::cp_async_write: return "cp.async write";
    case Kind::tma_write: return "TMA write";
    case Kind::wgmma_read: return "wgmma read";
  }
  return "?";
}
Kind kind_of(uint64_t site) { return Kind(site >> 56); }
uintptr_t pc_of(uint64_t site) { return uintptr_t(site & ((uint64_t(1) << 56) - 1)); }
bool writes(Kind kind) { return kind == Kind::write || kind == Kind::cp_async_write || kind == Kind::tma_write; }
// Writes by threads through the generic proxy: an async-proxy read of them needs fence.proxy.async
// (cp.async is a generic-proxy operation of the issuing thread, PTX ISA "cp.async").
bool generic_proxy_write(Kind kind) { return kind == Kind::write || kind == Kind::cp_async_write; }

std::string dim_text(unsigned linear, dim3 shape) {
  return "(" + std::to_string(linear % shape.x) + "," + std::to_string(linear / shape.x % shape.y) + "," +
         std::to_string(linear / (shape.x * shape.y)) + ")";
}

std::string index_text(uint3 i) {
  return "(" + std::to_string(i.x) + "," + std::to_string(i.y) + "," + std::to_string(i.z) + ")";
}

std::string shared_report(const BlockState& b) {
  const Hazard& h = b.hazard;
  const Kind earlier = kind_of(h.earlier_site), later = kind_of(h.later_site);
  const bool in_flight = (h.earlier & kInFlight) != 0;
  const char* what = h.missing_proxy_fence                     ? "missing fence.proxy.async"
                     : in_flight && earlier == Kind::wgmma_read ? "wgmma read in flight"
                     : in_flight && earlier == Kind::tma_write  ? "TMA write in flight"
                     : in_flight                                ? "cp.async in flight"
                     : writes(earlier) && writes(later)         ? "write after write"
                     : writes(earlier)                          ? "read after write"
                                                                : "write after read";
  const unsigned block_threads = unsigned(b.threads.size());
  auto access = [&](Stamp s, uint64_t site) {
    const unsigned thread = thread_of(s);
    const std::string epoch = " (epoch " + std::to_string(epoch_of(s) - b.first_epoch) + ")";
    if (thread >= block_threads) {  // a landed TMA write: its agent stands for the barrier
      const size_t agent = thread - block_threads;
      const std::string barrier =
          agent < b.agent_barrier.size() ? std::to_string(b.agent_barrier[agent]) : std::string("?");
      return std::string(kind_name(kind_of(site))) + " (landed, counted by the mbarrier at shared offset " + barrier +
             ") issued at " + code_location_of(pc_of(site)) + epoch;
    }
    return std::string(kind_name(kind_of(site))) + " by thread " + dim_text(thread, b.block_dim) + " at " +
           code_location_of(pc_of(site)) + epoch;
  };
  std::string text = "sim: shared-memory hazard (" + std::string(what) + ") in kernel '" +
                     b.launch->config->kernel_name + "', block " + index_text(b.index) + ", at shared byte offset " +
                     std::to_string(h.offset) + ": ";
  if (h.missing_proxy_fence) {
    return text + "generic-proxy " + access(h.earlier, h.earlier_site) + " is read by wgmma (async proxy): " +
           access(h.later, h.later_site) + ", without fence.proxy.async by the writer between its write and "
           "what orders the read after it";
  }
  text += access(h.later, h.later_site);
  if (in_flight && earlier == Kind::wgmma_read) {
    text += " touches bytes that a " + access(h.earlier, h.earlier_site) +
            " still reads (issued, not yet performed by the warpgroup's wgmma.wait_group)";
  } else if (in_flight && earlier == Kind::tma_write) {
    text += " touches bytes of a " + access(h.earlier, h.earlier_site) +
            " still in flight (issued, not yet landed: no wait on its mbarrier has seen its phase complete)";
  } else if (in_flight) {
    text += " touches bytes of a " + access(h.earlier, h.earlier_site) +
            " still in flight (issued, not yet retired by that thread's cp.async.wait_group)";
  } else if (b.vector_clocks) {
    text += " is unordered with the earlier " + access(h.earlier, h.earlier_site) +
            ": no __syncthreads, __syncwarp or mbarrier arrive -> wait orders them";
  } else {
    text += " is unordered with the earlier " + access(h.earlier, h.earlier_site) +
            ": no __syncthreads (or, within a warp, __syncwarp) lies between them";
  }
  return text;
}

std::string global_report(const BlockState& b) {
  const Hazard& h = b.hazard;
  const unsigned later_thread = unsigned(h.later >> 22) & 1023u, earlier_thread = unsigned(h.earlier >> 22) & 1023u;
  const dim3 grid = b.launch->config->grid;
  auto writer = [&](unsigned block, unsigned thread, uint64_t stamp, uint64_t site) {
    return "block " + dim_text(block, grid) + " thread " + dim_text(thread, b.block_dim) + " at " +
           code_location_of(pc_of(site)) + " (epoch " + std::to_string(stamp & 0x3FFFFFu) + ")";
  };
  return "sim: global-memory write conflict in kernel '" + std::string(b.launch->config->kernel_name) +
         "': byte " + std::to_string(h.offset) + " of buffer '" + h.buffer + "' is written by " +
         writer(unsigned(b.linear), later_thread, h.later, h.later_site) + " and by " +
         writer(h.earlier_block, earlier_thread, h.earlier, h.earlier_site) +
         " in one launch" + (h.earlier_block == b.linear ? ", with no __syncthreads between them" : "");
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

std::string describe(const BlockState& b) {
  switch (b.hazard.space) {
    case Hazard::Space::none: return "";
    case Hazard::Space::shared: return shared_report(b);
    case Hazard::Space::global: return global_report(b);
    case Hazard::Space::out_of_bounds:
    case Hazard::Space::misaligned: return access_report(b);
  }
  return "";
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

// ---- Hopper: vector clocks, TMA writes, the async proxy ----------------------------------------------

std::string code_location(uintptr_t pc) { return code_location_of(pc); }

void use_vector_clocks(BlockState& b) {
  if (b.vector_clocks) return;
  const unsigned threads = unsigned(b.threads.size());
  b.clocks.resize(threads);
  for (unsigned t = 0; t < threads; ++t) {
    VectorClock& vc = b.clocks[t];
    vc.assign(threads, 0);
    // What the warp clocks know in this barrier interval carries over; the thread's own entry
    // goes on from its stamp's clock, so its earlier records keep their meaning.
    const WarpClocks& w = b.warps[t / kWarpSize];
    if (w.epoch == b.epoch) {
      for (unsigned k = 0; k < kWarpSize && t / kWarpSize * kWarpSize + k < threads; ++k) {
        vc[t / kWarpSize * kWarpSize + k] = w.vc[t % kWarpSize][k];
      }
    }
    vc[t] = clock_of(b.threads[t]->stamp);
  }
  b.vector_clocks = true;
}

void release_into(BlockState& b, unsigned thread, VectorClock& into) {
  VectorClock& vc = b.clocks[thread];
  join(into, vc);
  vc[thread] = std::min(vc[thread] + 1, kMaxClock);
  b.threads[thread]->stamp = make_stamp(b.epoch, thread, vc[thread]);
}

void acquire_from(BlockState& b, unsigned thread, const VectorClock& from) { join(b.clocks[thread], from); }

unsigned new_agent(BlockState& b, uint32_t barrier_offset) {
  const size_t id = b.threads.size() + b.agent_barrier.size();
  if (id >= kMaxThreadIds) {
    throw Error("sim: the racecheck has thread ids for " + std::to_string(kMaxThreadIds - b.threads.size()) +
                " mbarriers in a block of " + std::to_string(b.threads.size()) + " threads; the kernel initialises more");
  }
  b.agent_barrier.push_back(barrier_offset);
  b.agent_clock.push_back(0);
  return unsigned(id);
}

void tma_issued(ThreadState& issuer, size_t offset, size_t bytes, uintptr_t pc) {
  shared_access(issuer, offset, bytes, Kind::tma_write, pc);
}

uint32_t tma_landed(BlockState& b, unsigned agent, size_t offset, size_t bytes, uintptr_t pc) {
  uint32_t& clock = b.agent_clock[agent - b.threads.size()];
  clock = std::min(clock + 1, kMaxClock);
  const Stamp landed = make_stamp(b.epoch, agent, clock);
  const uint64_t where = site(pc, Kind::tma_write);
  const size_t end = std::min(offset + bytes, b.threads.empty() ? 0 : b.threads[0]->smem_bytes);
  for (size_t i = offset; i < end; ++i) {
    // Whatever touched the bytes since the issue was reported then; the write happens now.
    Cell& c = b.cells[i];
    c.write = landed;
    c.read[0] = c.read[1] = 0;
    b.sites[i].write = where;
  }
  return clock;
}

void proxy_fence(ThreadState& t) {
  BlockState& b = *t.block;
  use_vector_clocks(b);
  const unsigned thread = thread_of(t.stamp);
  t.last_fence = t.stamp;
  // Its own entry ticks: an access after the fence has a larger stamp than the fence, one before
  // it a smaller or equal one (the fence-after-write test compares them).
  VectorClock& vc = b.clocks[thread];
  vc[thread] = std::min(vc[thread] + 1, kMaxClock);
  t.stamp = make_stamp(b.epoch, thread, vc[thread]);
}

void async_read_begin(BlockState& b, unsigned thread, size_t offset, size_t bytes, uintptr_t pc) {
  use_vector_clocks(b);
  const Stamp reader = b.threads[thread]->stamp;
  const Stamp mine = reader | kInFlight;
  const Stamp floor = Stamp(b.first_epoch) << 32;
  const uint64_t where = site(pc, Kind::wgmma_read);
  const unsigned block_threads = unsigned(b.threads.size());
  const size_t end = std::min(offset + bytes, b.threads[thread]->smem_bytes);
  for (size_t i = offset; i < end; ++i) {
    Cell& c = b.cells[i];
    if (c.write >= floor) {
      if ((c.write & kInFlight) || !ordered(b, c.write, reader)) {
        found_shared(b, i, c.write, b.sites[i].write, mine, where);
      } else if (generic_proxy_write(kind_of(b.sites[i].write)) && thread_of(c.write) < block_threads) {
        // The writer's last fence must follow the write (same thread: stamps grow in program
        // order) and precede the read in happens-before.
        const Stamp fence = b.threads[thread_of(c.write)]->last_fence;
        if (fence < (c.write & ~kInFlight) || !ordered(b, fence, reader)) {
          found_shared(b, i, c.write, b.sites[i].write, mine, where, /*missing_proxy_fence=*/true);
        }
      }
    }
    if (c.read[0] == mine || c.read[1] == mine) continue;
    // Kept unless both slots hold reads in flight (a third wgmma on the same bytes at once goes
    // unrecorded): a slot that is free or ordered before this read first, else a concurrent plain
    // read gives way (a later write racing only with it is then missed).
    auto in_flight = [&](int r) { return c.read[r] >= floor && (c.read[r] & kInFlight); };
    auto free_or_ordered = [&](int r) { return c.read[r] < floor || (!in_flight(r) && ordered(b, c.read[r], reader)); };
    int slot = free_or_ordered(0) ? 0 : free_or_ordered(1) ? 1 : !in_flight(0) ? 0 : !in_flight(1) ? 1 : -1;
    if (slot < 0) continue;
    c.read[slot] = mine;
    b.sites[i].read[slot] = where;
  }
}

void async_read_end(BlockState& b, unsigned thread, size_t offset, size_t bytes) {
  const Stamp now = b.threads[thread]->stamp;
  const Stamp floor = Stamp(b.first_epoch) << 32;
  const size_t end = std::min(offset + bytes, b.threads[thread]->smem_bytes);
  for (size_t i = offset; i < end; ++i) {
    Cell& c = b.cells[i];
    for (int r = 0; r < 2; ++r) {
      // The read is performed now: a read by `thread` at its current stamp.
      if (c.read[r] >= floor && (c.read[r] & kInFlight) && thread_of(c.read[r]) == thread &&
          kind_of(b.sites[i].read[r]) == Kind::wgmma_read) {
        c.read[r] = now;
      }
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
  if (t == nullptr) return;
  const uintptr_t p = reinterpret_cast<uintptr_t>(address);
  if (p - t->smem_begin >= t->smem_bytes) return;
  const auto kind = what == SharedAccess::ldmatrix_row ? detail::race::Kind::ldmatrix_read
                                                       : detail::race::Kind::cp_async_write;
  detail::race::shared_access(*t, p - t->smem_begin, bytes, kind, reinterpret_cast<uintptr_t>(site));
}

void racecheck_async_landed(const void* address, size_t bytes) {
  detail::race::ThreadState* t = t_thread;
  if (t == nullptr) return;
  const uintptr_t p = reinterpret_cast<uintptr_t>(address);
  if (p - t->smem_begin >= t->smem_bytes) return;
  detail::race::async_landed(*t, p - t->smem_begin, bytes);
}

void fence_proxy_async() {
  detail::race::ThreadState* t = t_thread;
  if (t == nullptr) return;
  detail::race::proxy_fence(*t);
}

// The twins call these inside a warpgroup collective's combine, run by whichever thread arrived
// last: the block comes from the running thread, the reader is `thread`.
void racecheck_async_read_begin(unsigned thread, const void* address, size_t bytes, const void* site) {
  detail::race::ThreadState* t = t_thread;
  if (t == nullptr) return;
  const uintptr_t p = reinterpret_cast<uintptr_t>(address);
  if (p - t->smem_begin >= t->smem_bytes || thread >= t->block->threads.size()) return;
  detail::race::async_read_begin(*t->block, thread, p - t->smem_begin, bytes, reinterpret_cast<uintptr_t>(site));
}

void racecheck_async_read_end(unsigned thread, const void* address, size_t bytes) {
  detail::race::ThreadState* t = t_thread;
  if (t == nullptr) return;
  const uintptr_t p = reinterpret_cast<uintptr_t>(address);
  if (p - t->smem_begin >= t->smem_bytes || thread >= t->block->threads.size()) return;
  detail::race::async_read_end(*t->block, thread, p - t->smem_begin, bytes);
}

}  // namespace selfattn::sim
