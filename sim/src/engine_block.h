#pragma once
// The block engine's state (engine.cpp runs it; mbarrier.cpp adds the Hopper synchronisation on
// top): a block's fibers, the barrier and collectives they wait at, the mbarriers they wait on.
// Internal to sim/src.
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "fiber.h"
#include "crash_report.h"
#include "racecheck.h"
#include "selfattn_sim/sim.h"

namespace selfattn::sim::detail::profile {
struct BlockProfile;
}

namespace selfattn::sim::detail::engine {

constexpr unsigned kWarpSize = 32;
constexpr unsigned kWarpgroupSize = 128;

enum class FiberState : uint8_t {
  ready, at_barrier, at_collective, at_group_collective, at_mbarrier, at_setmaxnreg, exited
};

struct Block;

struct Fiber {
  ThreadContext thread;
  detail::FiberContext context;
  std::unique_ptr<detail::FiberStack> stack;
  FiberState state = FiberState::ready;
  unsigned collective_mask = 0;  // the mask it waits with, while at_collective
  uint32_t mbarrier_offset = 0;  // the barrier and parity it waits for, while at_mbarrier
  unsigned mbarrier_parity = 0;
  unsigned setmaxnreg_count = 0;  // the registers per thread its setmaxnreg.inc asks for, while at_setmaxnreg
  Block* block = nullptr;
  detail::FaultInfo fault;
  detail::race::ThreadState race;
};

// One warp collective that some lanes have reached. Keyed by its mask: lanes of one warp may wait
// at collectives with different (e.g. disjoint) masks at the same time.
struct PendingCollective {
  unsigned mask = 0;      // as the lanes passed it
  unsigned expected = 0;  // mask & the warp's existing lanes
  unsigned arrived = 0;
  CollectiveFn fn = nullptr;
  const void* ins[kWarpSize] = {};
  void* outs[kWarpSize] = {};
};

// The one warpgroup collective the threads of a warpgroup are gathering at (no mask: all 128 take
// part, so at most one is pending per warpgroup).
struct PendingGroupCollective {
  unsigned arrived = 0;
  GroupCollectiveFn fn = nullptr;
  const void* ins[kWarpgroupSize] = {};
  void* outs[kWarpgroupSize] = {};
};

struct Warp {
  unsigned existing = 0;  // lanes that exist (the last warp of a block may be partial)
  unsigned exited = 0;
  std::vector<PendingCollective> pending;
};

// ---- Hopper: mbarriers and TMA writes in flight (mbarrier.cpp) ---------------------------------

// One mbarrier object, kept beside the shared memory it lives in (the 8 bytes are never read).
struct Mbarrier {
  uint32_t offset = 0;          // in dynamic shared memory
  uint32_t arrival_count = 0;   // per phase, from init
  uint32_t pending = 0;         // arrivals the current phase still waits for
  int64_t tx = 0;               // the current phase's transaction count (negative: bytes landed early)
  uint32_t phase = 0;           // phases completed since init (the current phase's number)
  unsigned tma_in_flight = 0;   // TMA writes issued to it, not landed
  unsigned agent = 0;           // the racecheck's thread id for the TMA writes it counts
  unsigned initialised_by = 0;  // the thread whose mbarrier.init made it
  bool init_fenced = false;     // that thread's fence.mbarrier_init came after the init: the TMA unit sees it
  std::vector<uint32_t> observed;  // per thread: phases completed as of its last arrive / passed wait
  std::vector<unsigned> waiters;   // threads blocked in mbarrier_wait_parity on the current phase
  race::VectorClock releases;   // racecheck: what the current phase's arrivals (and TMA writes) release
  race::VectorClock completed;  // racecheck: what acquiring a completed phase gives (cumulative)
};

// A TMA write issued, not landed: its final bytes and what its issuer had done at the issue.
struct TmaInFlight {
  uint32_t barrier = 0;  // the mbarrier's offset
  uint32_t dst = 0;      // destination offset in dynamic shared memory
  std::vector<unsigned char> image;
  unsigned issuer = 0;   // linear thread index
  const void* site = nullptr;
  race::VectorClock issuer_clock;  // racecheck: released into the phase the write counts toward
};

struct HopperState {
  std::vector<Mbarrier> barriers;  // in order of first init (few per kernel: a linear search)
  std::vector<TmaInFlight> tma;    // in issue order
  // The register pool (setmaxnreg): per warpgroup, the registers per thread it holds (what the launch
  // gave it until its first setmaxnreg), and the warpgroups' threads whose inc waits for room.
  std::vector<unsigned> registers;
  std::vector<Fiber*> register_waiters;
};

struct Block {
  const LaunchConfig* config = nullptr;
  void (*body)(const void*) = nullptr;
  const void* params = nullptr;
  uint3 index{};
  unsigned thread_count = 0;
  Fiber* const* fibers = nullptr;
  std::vector<Warp> warps;
  std::vector<PendingGroupCollective> warpgroups;  // sized at the first warpgroup collective
  unsigned at_barrier = 0;
  unsigned barrier_votes = 0;   // non-zero predicates of the threads at the barrier so far
  unsigned barrier_result = 0;  // the last completed barrier's count; read by each thread on leaving
  unsigned exited = 0;
  std::vector<Fiber*>* released = nullptr;  // made ready since the round began: the next round's fibers
  std::exception_ptr error;
  detail::FiberContext scheduler;
  detail::race::BlockState* race = nullptr;  // the racecheck's state, when it is on
  detail::profile::BlockProfile* profile = nullptr;  // the profiler's, when the launch profiles
  std::unique_ptr<HopperState> hopper;       // created by the block's first mbarrier_init or setmaxnreg
};

// The fiber running on this OS thread, if any. Read by every threadIdx / blockIdx, hence the
// initial-exec model: a plain %fs-relative load instead of a __tls_get_addr call.
extern thread_local Fiber* t_fiber __attribute__((tls_model("initial-exec")));

inline Fiber& running_fiber(const char* what) {
  if (!t_fiber) throw Error(std::string("sim: ") + what + " called outside a kernel launch");
  return *t_fiber;
}

inline void yield_to_scheduler(Fiber& f) { detail::fiber_switch(f.context, f.block->scheduler); }

inline void release(Block& b, Fiber& f) {
  f.state = FiberState::ready;
  b.released->push_back(&f);
}

std::string block_name(const Block& b);
std::string thread_name(const ThreadContext& t);

// mbarrier.cpp, for the scheduler: when no fiber is ready, lands every TMA write in flight (their
// complete-tx may complete phases and release waiters); true if that made a fiber ready.
bool land_when_stalled(Block& b);
// Throws sim::Error if the block ended (all threads exited) with a TMA write in flight.
void check_block_end(const Block& b);
// What a fiber at_mbarrier waits for, for the divergence report.
std::string mbarrier_wait_description(const Block& b, const Fiber& f);
// What a thread whose setmaxnreg.inc waits for registers waits for (mbarrier.cpp).
std::string register_wait_description(const Block& b, const Fiber& f);

}  // namespace selfattn::sim::detail::engine
