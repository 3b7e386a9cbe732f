// One profiled launch: its blocks' counters merged, the grid's distinct sectors, its LaunchProfile.
#include "profile_internal.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <utility>

namespace selfattn::sim::detail::profile {

namespace {

// The code locations of shared-memory sites, resolved once per process (addr2line is slow).
std::string location_of(uintptr_t pc) {
  static std::mutex mutex;
  static std::unordered_map<uintptr_t, std::string> cache;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(pc);
    if (it != cache.end()) return it->second;
  }
  std::string location = race::code_location(pc);
  std::lock_guard<std::mutex> lock(mutex);
  return cache.emplace(pc, std::move(location)).first->second;
}

}  // namespace

// ---- counters -------------------------------------------------------------------------------------

void Counters::reset(size_t ranges) {
  global.assign(ranges, {});
  shared.clear();
  tensor.clear();
  mufu.fill(0);
  barriers = warp_syncs = warp_collectives = warpgroup_collectives = 0;
}

void Counters::add_to(Counters& total) const {
  for (size_t r = 0; r < global.size() && r < total.global.size(); ++r) {
    total.global[r][0] += global[r][0];
    total.global[r][1] += global[r][1];
  }
  for (const auto& [key, c] : shared) {
    SharedCounters& t = total.shared[key];
    t.instructions += c.instructions;
    t.bytes += c.bytes;
    t.wavefronts += c.wavefronts;
    t.ideal_wavefronts += c.ideal_wavefronts;
  }
  for (const TensorCount& c : tensor) {
    auto it = std::find_if(total.tensor.begin(), total.tensor.end(), [&](const TensorCount& t) {
      return t.m == c.m && t.n == c.n && t.k == c.k && std::strcmp(t.dtype, c.dtype) == 0;
    });
    if (it == total.tensor.end()) {
      total.tensor.push_back(c);
    } else {
      it->instructions += c.instructions;
    }
  }
  for (size_t i = 0; i < mufu.size(); ++i) total.mufu[i] += mufu[i];
  total.barriers += barriers;
  total.warp_syncs += warp_syncs;
  total.warp_collectives += warp_collectives;
  total.warpgroup_collectives += warpgroup_collectives;
}

// ---- the launch -----------------------------------------------------------------------------------

LaunchProfiler::LaunchProfiler(const LaunchConfig& config, const race::LaunchState& race, uint64_t blocks)
    : config_(config), race_(race), blocks_(blocks), bitmaps_(new Bitmap[2 * race.ranges.size()]) {
  for (size_t r = 0; r < race.ranges.size(); ++r) {
    const uint64_t sectors = (race.ranges[r].end - race.ranges[r].begin + 31) / 32;
    bitmaps_[2 * r].bytes = bitmaps_[2 * r + 1].bytes = (sectors + 63) / 64 * 8;
  }
  total_.reset(race.ranges.size());
}

LaunchProfiler::~LaunchProfiler() {
  for (size_t i = 0; i < 2 * race_.ranges.size(); ++i) {
    if (std::atomic<uint64_t>* words = bitmaps_[i].words.load()) munmap(words, bitmaps_[i].bytes);
  }
}

bool LaunchProfiler::first_touch(uint32_t range, bool write, uint64_t sector) {
  Bitmap& m = bitmaps_[2 * size_t(range) + (write ? 1 : 0)];
  std::atomic<uint64_t>* words = m.words.load(std::memory_order_acquire);
  if (words == nullptr) {
    // Zero pages, committed as touched: a 2^33-byte buffer costs 32 MB of address space and a page
    // per 8 KB of sectors touched.
    void* p = mmap(nullptr, m.bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return false;  // uncounted, not wrong
    std::atomic<uint64_t>* expected = nullptr;
    if (m.words.compare_exchange_strong(expected, static_cast<std::atomic<uint64_t>*>(p), std::memory_order_acq_rel)) {
      words = static_cast<std::atomic<uint64_t>*>(p);
    } else {
      munmap(p, m.bytes);  // another worker's came first
      words = expected;
    }
  }
  const uint64_t bit = uint64_t(1) << (sector % 64);
  return (words[sector / 64].fetch_or(bit, std::memory_order_relaxed) & bit) == 0;
}

void LaunchProfiler::merge(const Counters& block) {
  std::lock_guard<std::mutex> lock(mutex_);
  block.add_to(total_);
}

LaunchProfile LaunchProfiler::finish() {
  LaunchProfile p;
  p.kernel = config_.kernel_name;
  p.grid = config_.grid;
  p.block = config_.block;
  p.dynamic_smem_bytes = config_.dynamic_smem_bytes;
  p.blocks = blocks_;
  std::map<std::string, BufferTraffic> by_label;
  for (size_t r = 0; r < race_.ranges.size(); ++r) {
    const auto& traffic = total_.global[r];
    if (traffic[0].requests == 0 && traffic[1].requests == 0) continue;
    BufferTraffic& b = by_label[race_.ranges[r].label];
    b.label = race_.ranges[r].label;
    b.read += traffic[0];
    b.write += traffic[1];
  }
  for (auto& [label, b] : by_label) p.global.push_back(std::move(b));
  // Several code addresses can be one source line (unrolled or inlined copies): one site per line.
  std::map<std::pair<std::string, unsigned>, std::pair<uintptr_t, SharedSite>> sites;
  for (const auto& [key, c] : total_.shared) {
    const unsigned op = what_of(key) - kShared;
    const uintptr_t pc = pc_of(key);
    auto& [first_pc, site] = sites[{location_of(pc), op}];
    if (site.instructions == 0 || pc < first_pc) first_pc = pc;
    site.op = SharedOp(op);
    site.instructions += c.instructions;
    site.bytes += c.bytes;
    site.wavefronts += c.wavefronts;
    site.ideal_wavefronts += c.ideal_wavefronts;
  }
  std::vector<std::pair<uintptr_t, SharedSite>> ordered;
  for (auto& [where, entry] : sites) {
    entry.second.location = where.first;
    ordered.push_back(std::move(entry));
  }
  std::sort(ordered.begin(), ordered.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : a.second.op < b.second.op;
  });
  for (auto& entry : ordered) p.shared.push_back(std::move(entry.second));
  for (const TensorCount& c : total_.tensor) {
    TensorOps t;
    t.shape = "m" + std::to_string(c.m) + "n" + std::to_string(c.n) + "k" + std::to_string(c.k);
    t.dtype = c.dtype;
    t.instructions = c.instructions;
    t.flops = 2ull * c.m * c.n * c.k * c.instructions;
    p.tensor.push_back(std::move(t));
  }
  p.mufu = total_.mufu;
  p.barriers = total_.barriers;
  p.warp_syncs = total_.warp_syncs;
  p.warp_collectives = total_.warp_collectives;
  p.warpgroup_collectives = total_.warpgroup_collectives;
  return p;
}

}  // namespace selfattn::sim::detail::profile
