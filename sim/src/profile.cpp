// The profiler (sim/README.md, "The profiler"; the API is selfattn_sim/profile.h, the engine side
// profile_internal.h): lanes' accesses grouped into warp-level requests, each request's global
// sectors or shared-memory wavefronts, the twins' tensor-core and MUFU operations. The launch's
// merged counters, the grid's distinct sectors and the profile of a launch: profile_launch.cpp.
// Its totals and text report: profile_report.cpp; the speed-of-light estimate: speed_of_light.cpp.
#include "profile_internal.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace selfattn::sim {
std::atomic<bool> detail::profiling_launch{false};
}

namespace selfattn::sim::detail::profile {

namespace {

// ---- requests -----------------------------------------------------------------------------------

Request* new_request(BlockProfile& b) {
  if (b.free_requests.empty()) {
    b.owned.push_back(std::make_unique<Request>());
    return b.owned.back().get();
  }
  Request* r = b.free_requests.back();
  b.free_requests.pop_back();
  r->lanes = 0;
  return r;
}

// Global: per buffer the request touches (almost always one), one request, its bytes, its distinct
// 32-byte sectors, and which of those the grid touches for the first time. Buffers are
// page-aligned, so a sector of the address is a sector of the buffer.
void count_global(BlockProfile& b, const std::vector<LaneAccess>& accesses, bool write) {
  const std::vector<race::DeviceRange>& ranges = b.launch->race().ranges;
  std::vector<uint64_t>& sectors = b.scratch;
  uint32_t buffers[kWarpSize + 1];
  size_t buffer_count = 0;
  for (const LaneAccess& a : accesses) {
    if (buffer_count <= kWarpSize && std::find(buffers, buffers + buffer_count, a.range) == buffers + buffer_count)
      buffers[buffer_count++] = a.range;
  }
  for (size_t i = 0; i < buffer_count; ++i) {
    const uint32_t range = buffers[i];
    sectors.clear();
    uint64_t bytes = 0;
    for (const LaneAccess& a : accesses) {
      if (a.range != range) continue;
      bytes += a.bytes;
      for (uint64_t s = a.address >> 5; s <= (a.address + a.bytes - 1) >> 5; ++s) sectors.push_back(s);
    }
    std::sort(sectors.begin(), sectors.end());
    sectors.erase(std::unique(sectors.begin(), sectors.end()), sectors.end());
    GlobalTraffic& g = b.counters.global[range][write ? 1 : 0];
    ++g.requests;
    g.bytes_requested += bytes;
    g.sectors += sectors.size();
    const uint64_t first = ranges[range].begin >> 5;
    for (uint64_t s : sectors) g.distinct_sectors += b.launch->first_touch(range, write, s - first);
  }
}

// Shared memory, as NVIDIA describes the pipeline for 32 banks of 4 bytes (README): the warp is
// served in phases, all 32 lanes at once for accesses of up to 4 bytes, half-warps for 8 bytes,
// quarter-warps for 16 (an ldmatrix's 8 rows of one matrix are such a quarter); a phase takes as
// many wavefronts as the most distinct 4-byte words any one bank holds (lanes reading one word
// share it), and at best its distinct words / 32.
void count_shared(BlockProfile& b, uint64_t key, const Request& r) {
  unsigned widest = 0;
  for (unsigned lane = 0; lane < kWarpSize; ++lane)
    if (r.lanes >> lane & 1u) widest = std::max(widest, r.access[lane].bytes);
  const unsigned phases = widest <= 4 ? 1 : widest <= 8 ? 2 : 4, per_phase = kWarpSize / phases;
  std::vector<uint64_t>& words = b.scratch;
  uint64_t wavefronts = 0, ideal = 0, bytes = 0;
  for (unsigned phase = 0; phase < phases; ++phase) {
    words.clear();
    for (unsigned lane = phase * per_phase; lane < (phase + 1) * per_phase; ++lane) {
      if (!(r.lanes >> lane & 1u)) continue;
      const LaneAccess& a = r.access[lane];
      bytes += a.bytes;
      for (uint64_t w = a.address >> 2; w <= (a.address + a.bytes - 1) >> 2; ++w) words.push_back(w);
    }
    if (words.empty()) continue;
    std::sort(words.begin(), words.end());
    words.erase(std::unique(words.begin(), words.end()), words.end());
    unsigned per_bank[kWarpSize] = {}, most = 0;
    for (uint64_t w : words) most = std::max(most, ++per_bank[w % kWarpSize]);
    wavefronts += most;
    ideal += (words.size() + kWarpSize - 1) / kWarpSize;
  }
  SharedCounters& c = b.counters.shared[key];
  ++c.instructions;
  c.bytes += bytes;
  c.wavefronts += wavefronts;
  c.ideal_wavefronts += ideal;
}

void count(BlockProfile& b, uint64_t key, const Request& r) {
  if (r.lanes == 0) return;
  const unsigned what = what_of(key);
  if (what >= kShared) {
    count_shared(b, key, r);
    return;
  }
  static thread_local std::vector<LaneAccess> accesses;
  accesses.clear();
  for (unsigned lane = 0; lane < kWarpSize; ++lane)
    if (r.lanes >> lane & 1u) accesses.push_back(r.access[lane]);
  count_global(b, accesses, what == kGlobalWrite);
}

// Counts (or, at the start of a block after a failed one, drops) every request of the warp still
// open, and starts its occurrences over: the warp's lanes have all reached one point.
void flush_warp(BlockProfile& b, WarpState& w, bool counting = true) {
  for (auto& [key, q] : w.touched) {
    for (Request* r : q->pending) {
      if (r == nullptr) continue;
      if (counting) count(b, key, *r);
      b.free_requests.push_back(r);
    }
    q->pending.clear();
    q->base = 0;
    std::fill(std::begin(q->next), std::end(q->next), 0u);
    q->listed = false;
  }
  w.touched.clear();
}

void flush_all(BlockProfile& b) {
  for (WarpState& w : b.warps) flush_warp(b, w);
}

// One lane's access: joins the request of its warp with the same key and occurrence; a request that
// every live lane of the warp has joined is counted at once (most are: the lanes of a warp run the
// same code), the others at the warp's next barrier, full collective or the block's end.
void add_access(race::ThreadState& t, uint64_t key, uintptr_t address, size_t bytes, uint32_t range) {
  if (bytes == 0) return;
  BlockProfile& b = *t.profile;
  const unsigned thread = race::thread_of(t.stamp), lane = thread % kWarpSize;
  WarpState& w = b.warps[thread / kWarpSize];
  Queue& q = w.queues[key];
  if (!q.listed) {
    q.listed = true;
    w.touched.push_back({key, &q});
  }
  const size_t index = q.next[lane]++ - q.base;
  while (q.pending.size() <= index) q.pending.push_back(new_request(b));
  if (q.pending[index] == nullptr) q.pending[index] = new_request(b);  // never: counted requests are whole
  Request& r = *q.pending[index];
  r.access[lane] = LaneAccess{address, uint32_t(bytes), range};
  r.lanes |= 1u << lane;
  if ((w.live & ~r.lanes) != 0) return;
  count(b, key, r);
  b.free_requests.push_back(&r);
  q.pending[index] = nullptr;
  while (!q.pending.empty() && q.pending.front() == nullptr) {
    q.pending.pop_front();
    ++q.base;
  }
}

// The device buffer (index in the launch's ranges) that holds [address, address + bytes), or -1:
// outside every buffer, or out of bounds (the access checks report that, and nothing is counted).
int64_t buffer_of(race::ThreadState& t, uintptr_t address, size_t bytes) {
  const race::DeviceRange* r = race::range_of(t, address);
  if (r == nullptr || address < r->begin || address + bytes > r->end) return -1;
  return r - t.block->launch->ranges.data();
}

race::ThreadState* profiled_thread() {
  race::ThreadState* t = race::t_thread;
  return t != nullptr && t->profile != nullptr ? t : nullptr;
}

void add_shared(race::ThreadState& t, uintptr_t p, size_t bytes, SharedOp op, uintptr_t site) {
  const uintptr_t offset = p - t.smem_begin;
  if (offset >= t.smem_bytes) return;
  add_access(t, request_key(site, kShared + unsigned(op)), offset, std::min(bytes, t.smem_bytes - offset), 0);
}

void add_global(race::ThreadState& t, uintptr_t p, size_t bytes, bool write, uintptr_t site) {
  if (p - t.device_lowest >= t.device_span) return;
  const int64_t range = buffer_of(t, p, bytes);
  if (range >= 0) add_access(t, request_key(site, write ? kGlobalWrite : kGlobalRead), p, bytes, uint32_t(range));
}

std::mutex& profiles_mutex() {
  static std::mutex m;
  return m;
}
std::vector<LaunchProfile>& recorded_profiles() {
  static std::vector<LaunchProfile> profiles;
  return profiles;
}

}  // namespace

// ---- the racecheck hooks' entries ---------------------------------------------------------------

}  // namespace selfattn::sim::detail::profile

namespace selfattn::sim::detail::race {

void profile_shared(ThreadState& t, size_t offset, size_t bytes, bool write, uintptr_t pc) {
  if (t.profile_muted) return;  // a piece of a vector access its twin counted whole
  const SharedOp op = write ? SharedOp::store : SharedOp::load;
  profile::add_access(t, profile::request_key(pc, profile::kShared + unsigned(op)), offset,
                      std::min(bytes, t.smem_bytes - offset), 0);
}

void profile_device(ThreadState& t, uintptr_t address, size_t bytes, bool write, uintptr_t pc) {
  if (t.profile_muted) return;
  profile::add_global(t, address, bytes, write, pc);
}

}  // namespace selfattn::sim::detail::race

namespace selfattn::sim::detail::profile {

// ---- the recorded profiles (a launch's counters and sectors: profile_launch.cpp) ----------------

void record(LaunchProfile profile) {
  std::lock_guard<std::mutex> lock(profiles_mutex());
  recorded_profiles().push_back(std::move(profile));
}

// ---- the engine's calls ---------------------------------------------------------------------------

void begin_block(BlockProfile& b, LaunchProfiler& launch, race::ThreadState* const* threads, unsigned count) {
  b.launch = &launch;
  b.counters.reset(launch.race().ranges.size());
  b.bulk.clear();
  const unsigned warps = (count + kWarpSize - 1) / kWarpSize;
  if (b.warps.size() < warps) b.warps.resize(warps);
  for (unsigned w = 0; w < b.warps.size(); ++w) {
    flush_warp(b, b.warps[w], /*counting=*/false);  // what a failed block left
    const unsigned lanes = w < warps ? std::min(kWarpSize, count - w * kWarpSize) : 0;
    b.warps[w].live = lanes == kWarpSize ? ~0u : (1u << lanes) - 1;
  }
  for (unsigned t = 0; t < count; ++t) threads[t]->profile = &b;
}

void on_barrier(BlockProfile& b) {
  ++b.counters.barriers;
  flush_all(b);
}

void on_warp_collective(BlockProfile& b, unsigned warp, unsigned lanes, bool syncwarp) {
  ++(syncwarp ? b.counters.warp_syncs : b.counters.warp_collectives);
  WarpState& w = b.warps[warp];
  // Only when every live lane is there: others may still be on their way to an earlier request.
  if ((w.live & ~lanes) == 0) flush_warp(b, w);
}

void on_warpgroup_collective(BlockProfile& b, unsigned group) {
  ++b.counters.warpgroup_collectives;
  for (unsigned w = 4 * group; w < 4 * group + 4 && w < b.warps.size(); ++w) flush_warp(b, b.warps[w]);
}

void on_exit(BlockProfile& b, unsigned thread) { b.warps[thread / kWarpSize].live &= ~(1u << thread % kWarpSize); }

void end_block(BlockProfile& b) {
  flush_all(b);
  b.launch->merge(b.counters);
}

}  // namespace selfattn::sim::detail::profile

// ---- the public API -------------------------------------------------------------------------------

namespace selfattn::sim {

using detail::profile::profiled_thread;

std::vector<LaunchProfile> take_profiles() {
  std::lock_guard<std::mutex> lock(detail::profile::profiles_mutex());
  std::vector<LaunchProfile> out;
  out.swap(detail::profile::recorded_profiles());
  return out;
}

void profile_shared_access(const void* address, size_t bytes, SharedOp op, const void* site) {
  if (auto* t = profiled_thread()) {
    detail::profile::add_shared(*t, reinterpret_cast<uintptr_t>(address), bytes, op, reinterpret_cast<uintptr_t>(site));
  }
}

void profile_global_access(const void* address, size_t bytes, bool write, const void* site) {
  if (auto* t = profiled_thread()) {
    detail::profile::add_global(*t, reinterpret_cast<uintptr_t>(address), bytes, write, reinterpret_cast<uintptr_t>(site));
  }
}

void profile_vector_access(const void* address, size_t bytes, bool write, const void* site) {
  auto* t = profiled_thread();
  if (t == nullptr) return;
  const uintptr_t p = reinterpret_cast<uintptr_t>(address), pc = reinterpret_cast<uintptr_t>(site);
  if (p - t->smem_begin < t->smem_bytes) {
    detail::profile::add_shared(*t, p, bytes, write ? SharedOp::store : SharedOp::load, pc);
  } else {
    detail::profile::add_global(*t, p, bytes, write, pc);
  }
  t->profile_muted = true;
}

void profile_vector_done() {
  if (auto* t = profiled_thread()) t->profile_muted = false;
}

void profile_bulk_read(const void* address, size_t bytes) {
  auto* t = profiled_thread();
  if (t == nullptr || bytes == 0) return;
  const uintptr_t p = reinterpret_cast<uintptr_t>(address);
  if (p - t->device_lowest >= t->device_span) return;
  const int64_t range = detail::profile::buffer_of(*t, p, bytes);
  if (range < 0) return;
  std::vector<detail::profile::LaneAccess>& bulk = t->profile->bulk;
  if (!bulk.empty() && bulk.back().range == uint32_t(range) && bulk.back().address + bulk.back().bytes == p) {
    bulk.back().bytes += uint32_t(bytes);  // the next element of a row
  } else {
    bulk.push_back({p, uint32_t(bytes), uint32_t(range)});
  }
}

void profile_bulk_done() {
  auto* t = profiled_thread();
  if (t == nullptr || t->profile->bulk.empty()) return;
  detail::profile::count_global(*t->profile, t->profile->bulk, /*write=*/false);
  t->profile->bulk.clear();
}

void profile_tensor_op(unsigned m, unsigned n, unsigned k, const char* dtype) {
  auto* t = profiled_thread();
  if (t == nullptr) return;
  std::vector<detail::profile::TensorCount>& counts = t->profile->counters.tensor;
  for (detail::profile::TensorCount& c : counts) {
    if (c.m == m && c.n == n && c.k == k && std::strcmp(c.dtype, dtype) == 0) {
      ++c.instructions;
      return;
    }
  }
  counts.push_back({m, n, k, dtype, 1});
}

void profile_mufu(Mufu kind) {
  if (auto* t = profiled_thread()) ++t->profile->counters.mufu[size_t(kind)];
}

}  // namespace selfattn::sim
