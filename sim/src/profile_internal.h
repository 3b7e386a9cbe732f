#pragma once
// The profiler's engine side (profile.cpp; the model is in sim/README.md, "The profiler"): the
// accesses a block's lanes make, grouped into warp-level requests, and what those requests cost
// (global sectors, shared-memory wavefronts), counted per block and merged into the launch's
// counters at the block's end. The engine calls in at block start and end, at barriers, warp and
// warpgroup collectives and thread exits; the racecheck's hooks and the twins report the accesses.
#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "racecheck.h"
#include "selfattn_sim/profile.h"
#include "selfattn_sim/sim.h"

namespace selfattn::sim::detail::profile {

constexpr unsigned kWarpSize = 32;

// A request's key: the code address (low 56 bits) and what the instruction does (top 8 bits:
// kGlobalRead, kGlobalWrite, or kShared + a SharedOp). Lanes' accesses with the same key and the
// same dynamic occurrence form one warp-level request.
constexpr unsigned kGlobalRead = 0, kGlobalWrite = 1, kShared = 2;
inline uint64_t request_key(uintptr_t pc, unsigned what) { return uint64_t(pc) | uint64_t(what) << 56; }
inline unsigned what_of(uint64_t key) { return unsigned(key >> 56); }
inline uintptr_t pc_of(uint64_t key) { return uintptr_t(key & ((uint64_t(1) << 56) - 1)); }

// One lane's part of a request: a shared-memory offset, or a device address and the index of its
// buffer in the launch's ranges (race::LaunchState::ranges).
struct LaneAccess {
  uintptr_t address = 0;
  uint32_t bytes = 0;
  uint32_t range = 0;
};

struct Request {
  uint32_t lanes = 0;  // the lanes that have made their access
  LaneAccess access[kWarpSize];
};

// One key's requests of one warp that have not been counted yet, by occurrence.
struct Queue {
  uint32_t next[kWarpSize] = {};  // each lane's next occurrence
  uint32_t base = 0;              // the occurrence of pending.front()
  std::deque<Request*> pending;   // null: counted already
  bool listed = false;            // in WarpState::touched
};

struct WarpState {
  unsigned live = 0;  // lanes that exist and have not exited: a request of all of them is whole
  std::unordered_map<uint64_t, Queue> queues;
  std::vector<std::pair<uint64_t, Queue*>> touched;  // the queues used since the warp's last flush
};

struct SharedCounters {
  uint64_t instructions = 0, bytes = 0, wavefronts = 0, ideal_wavefronts = 0;
};

struct TensorCount {
  unsigned m = 0, n = 0, k = 0;
  const char* dtype = "";
  uint64_t instructions = 0;
};

// What a block counted (and, summed, what the launch counted).
struct Counters {
  std::vector<std::array<GlobalTraffic, 2>> global;  // per launch range: [0] reads, [1] writes
  std::unordered_map<uint64_t, SharedCounters> shared;  // by request key (pc, kShared + op)
  std::vector<TensorCount> tensor;
  std::array<uint64_t, kMufuKinds> mufu{};
  uint64_t barriers = 0, warp_syncs = 0, warp_collectives = 0, warpgroup_collectives = 0;

  void reset(size_t ranges);
  void add_to(Counters& total) const;
};

// One profiled launch (profile_launch.cpp): its blocks' counters, merged, and the grid-wide record of
// the sectors touched (a bitmap per buffer, reads and writes apart, reserved lazily and zero until
// touched).
class LaunchProfiler {
 public:
  LaunchProfiler(const LaunchConfig& config, const race::LaunchState& race, uint64_t blocks);
  ~LaunchProfiler();
  LaunchProfiler(const LaunchProfiler&) = delete;
  LaunchProfiler& operator=(const LaunchProfiler&) = delete;

  const race::LaunchState& race() const { return race_; }
  // Marks the range's sector (index from its start) read or written; true when the grid had not
  // touched it that way before (any worker, lock-free).
  bool first_touch(uint32_t range, bool write, uint64_t sector);
  void merge(const Counters& block);  // thread-safe
  LaunchProfile finish();             // after every block has merged

 private:
  struct Bitmap {
    std::atomic<std::atomic<uint64_t>*> words{nullptr};
    size_t bytes = 0;
  };
  const LaunchConfig& config_;
  const race::LaunchState& race_;
  uint64_t blocks_;
  std::unique_ptr<Bitmap[]> bitmaps_;  // 2 per range: read, write
  std::mutex mutex_;
  Counters total_;
};

// Per worker OS thread, reused from block to block.
struct BlockProfile {
  LaunchProfiler* launch = nullptr;
  std::vector<race::ThreadState*> threads;
  std::vector<WarpState> warps;
  Counters counters;
  std::vector<std::unique_ptr<Request>> owned;  // every request ever made; the free ones:
  std::vector<Request*> free_requests;
  std::vector<LaneAccess> bulk;           // the open TMA box's element reads, contiguous runs merged
  std::vector<uint64_t> scratch;          // sectors or words of the request being counted
};

// The engine's calls (engine.cpp). `threads` are the block's racecheck thread states, which carry
// the pointer the hooks follow.
void begin_block(BlockProfile& block, LaunchProfiler& launch, race::ThreadState* const* threads, unsigned count);
void on_barrier(BlockProfile& block);  // a __syncthreads completed
// A warp collective of `lanes` completed (syncwarp: a __syncwarp).
void on_warp_collective(BlockProfile& block, unsigned warp, unsigned lanes, bool syncwarp);
void on_warpgroup_collective(BlockProfile& block, unsigned group);
void on_exit(BlockProfile& block, unsigned thread);
void end_block(BlockProfile& block);  // counts what is left and merges into the launch

// While a LaunchProfiler lives, the twins' profiling() is true.
class ProfilingLaunch {
 public:
  ProfilingLaunch() { sim::detail::profiling_launch.store(true, std::memory_order_relaxed); }
  ~ProfilingLaunch() { sim::detail::profiling_launch.store(false, std::memory_order_relaxed); }
};

// A finished launch's profile joins those take_profiles() returns.
void record(LaunchProfile profile);

}  // namespace selfattn::sim::detail::profile
