#pragma once
// The racecheck: finds shared-memory hazards (and write-write conflicts in device memory) between
// the CUDA threads of a launch, whatever order the sim happened to run them in.
//
// How accesses reach it. Kernel code compiled for the sim is instrumented by the compiler's
// ThreadSanitizer pass (-fsanitize=thread at compile time only; libtsan is never linked): every load
// and store calls a __tsan_readN / __tsan_writeN hook, which tsan_hooks.cpp defines to call in here,
// the way the Linux kernel's KCSAN brings its own runtime for that instrumentation. The primitives'
// sim twins report what the instrumentation cannot see (each lane's ldmatrix row, cp.async copies)
// through sim::racecheck_shared / racecheck_async_landed, with the right thread.
//
// The happens-before model (what orders two accesses by different threads of one block):
//   - a __syncthreads between them: each access carries the block's barrier epoch, and the earlier
//     one's epoch is smaller (not for a landed TMA write: see the Hopper rule below);
//   - for lanes of one warp, a __syncwarp that both took part in, directly or through other lanes:
//     per-warp vector clocks, joined at each __syncwarp over its mask. Other warp collectives
//     (shuffles, votes, mma, ldmatrix) exchange registers, not memory: they order nothing here.
//   - a cp.async write is in flight from its issue until the cp.async.wait_group of the issuing
//     thread that retires it: any access to those bytes meanwhile, even by that thread, is a hazard;
//     once retired it is a write by that thread at the time of the wait.
//   - in blocks that use the Hopper primitives (mbarriers, TMA, the async proxy), block-wide vector
//     clocks instead of the per-warp ones: an mbarrier arrive releases the arriving thread's clock
//     into the barrier's phase, a wait that sees the phase complete acquires it; a landed TMA write
//     is a write by its barrier's "TMA agent" (a thread id past the block's threads), ordered
//     before the threads that acquired a phase that counted it and, through their later
//     synchronisation (a __syncthreads joins the agents' entries over the block), others; never by
//     a __syncthreads alone. Activated by the block's
//     first Hopper call, so other kernels keep the per-warp clocks and their cost.
//   - wgmma's shared-memory reads are in flight from the issue to the wgmma.wait_group that
//     performs them (a write to the bytes meanwhile is a hazard), and need the generic-proxy
//     writes they read to be followed by fence.proxy.async of their writer.
// Shadow state: per byte of dynamic shared memory, the last write and up to two readers (bytes, not
// words: two threads storing neighbouring 16-bit elements of one word is no race, and kernels do it).
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "selfattn_sim/sim.h"

namespace selfattn::sim::detail::race {

constexpr unsigned kWarpSize = 32;

// One access, packed in 64 bits (all the happens-before test needs):
//   bits 63..32  epoch: a per-worker counter, +1 at each block start and each __syncthreads, so a
//                record left by an earlier block is older than every access of the running one
//   bits 31..21  thread (linear index in the block; from the block's thread count on, the TMA
//                agents of its mbarriers: 11 bits, so a 1024-thread block still has room for them)
//   bit  20      in flight (a cp.async or TMA write not yet landed, a wgmma read not yet performed)
//   bits 19..0   the thread's clock: its warp clock, or in blocks with vector clocks its own entry
//                (saturating: past 2^20 - 1 releases, accesses could only look more ordered than
//                they are)
using Stamp = uint64_t;
constexpr Stamp kInFlight = Stamp(1) << 20;
constexpr uint32_t kMaxClock = (1u << 20) - 1;
constexpr unsigned kMaxThreadIds = 2048;
inline Stamp make_stamp(uint32_t epoch, unsigned thread, uint32_t clock) {
  return Stamp(epoch) << 32 | Stamp(thread) << 21 | clock;
}
inline uint32_t epoch_of(Stamp s) { return uint32_t(s >> 32); }
inline unsigned thread_of(Stamp s) { return unsigned(s >> 21) & (kMaxThreadIds - 1); }
inline uint32_t clock_of(Stamp s) { return uint32_t(s) & kMaxClock; }

// What an access was; kept beside its code address for the report.
enum class Kind : uint8_t { read, write, ldmatrix_read, cp_async_write, tma_write, wgmma_read };

// A block-wide vector clock: entry k is the latest clock of thread (or TMA agent) k known; entries
// past the end are 0. Only blocks with vector clocks (see above) have them.
using VectorClock = std::vector<uint32_t>;
inline void join(VectorClock& into, const VectorClock& from) {
  if (into.size() < from.size()) into.resize(from.size(), 0);
  for (size_t k = 0; k < from.size(); ++k) into[k] = into[k] > from[k] ? into[k] : from[k];
}

struct Cell {  // per shared-memory byte
  Stamp write = 0;
  Stamp read[2] = {0, 0};
};
struct CellSites {  // the code address (low 56 bits) and Kind (top 8 bits) of each record of a Cell
  uint64_t write = 0;
  uint64_t read[2] = {0, 0};
};
inline uint64_t site(uintptr_t pc, Kind kind) { return uint64_t(pc) | uint64_t(kind) << 56; }

// Vector clocks of one warp for one barrier interval: vc[l][k] is the latest clock of lane k that
// lane l has synchronised with. Valid while `epoch` is the block's epoch; otherwise every lane's
// own clock is 1 and it knows nothing of the others (a barrier already orders the earlier past).
struct WarpClocks {
  uint32_t epoch = 0;
  uint32_t vc[kWarpSize][kWarpSize];
};

// ---- device memory ------------------------------------------------------------------------------
// Per byte of a device allocation: the last writer in this process (a stamp of its own shape, see
// global_stamp() in racecheck.cpp) and its code address. Reserved lazily on the first checked write
// (MAP_NORESERVE: only pages that kernels write are committed), freed with the allocation.
struct GlobalCell {
  std::atomic<uint64_t> stamp;
  std::atomic<uint64_t> site;
};
class GlobalShadow {
 public:
  explicit GlobalShadow(size_t bytes) : bytes_(bytes) {}
  ~GlobalShadow();
  GlobalShadow(const GlobalShadow&) = delete;
  GlobalShadow& operator=(const GlobalShadow&) = delete;
  GlobalCell* cells();  // thread-safe; nullptr if the reservation failed

 private:
  size_t bytes_;
  std::atomic<GlobalCell*> cells_{nullptr};
};

struct DeviceRange {
  uintptr_t begin = 0, end = 0;              // the buffer's bytes
  uintptr_t mapped_begin = 0, mapped_end = 0;  // with its guard zones (accessible, but out of bounds)
  GlobalShadow* shadow = nullptr;
  const char* label = "";
};

// Bytes after a block's dynamic shared memory that the engine fills with a guard pattern: an access
// there is out of bounds (the GPU faults past the block's allocation).
constexpr size_t kSharedGuardBytes = 1024;

// ---- one launch ---------------------------------------------------------------------------------
struct LaunchState {
  const LaunchConfig* config = nullptr;
  // The racecheck and the access checks. Off when the hooks run for the profiler alone (its
  // Options::profile on, Options::racecheck off): they then only count.
  bool racecheck = true;
  uint32_t first_serial = 0;   // block b of the launch has serial first_serial + b (mod 2^32)
  uint64_t blocks = 0;
  bool check_global = false;   // off for grids of 2^31 blocks or more (serials would alias)
  std::vector<DeviceRange> ranges;  // sorted by begin; fixed for the launch
  uintptr_t lowest = 0, highest = 0;  // the mapped extent of all of them (guard zones included)
};
// Takes the launch's block serials and a snapshot of the device allocations. Called with the launch
// mutex held.
void begin_launch(LaunchState& launch, const LaunchConfig& config, uint64_t blocks);
// The live device allocations, sorted by address (device_memory.cpp).
void device_ranges(std::vector<DeviceRange>& out);

// ---- one block ----------------------------------------------------------------------------------
struct BlockState;
}  // namespace selfattn::sim::detail::race

namespace selfattn::sim::detail::profile {
struct BlockProfile;  // profile_internal.h
}

namespace selfattn::sim::detail::race {

// What the hooks read on every access: one per CUDA thread (fiber).
struct ThreadState {
  uintptr_t smem_begin = 0;
  size_t smem_bytes = 0;
  uintptr_t device_lowest = 0;  // the launch's device allocations, guard zones included: accesses
  size_t device_span = 0;       // in [lowest, lowest + span) are checked (0: none, a huge grid)
  Stamp stamp = 0;  // epoch, thread, clock of the thread's next access
  Stamp last_fence = 0;  // the stamp of its last fence.proxy.async in this block (0: none)
  BlockState* block = nullptr;
  const DeviceRange* last_range = nullptr;  // the allocation this thread wrote last
  bool checks = true;  // the launch's racecheck and access checks (LaunchState::racecheck)
  // The profiler's block state, when the launch profiles (else null: nothing more is paid), and
  // whether the thread's instrumented accesses are the pieces of a vector access its twin counted.
  profile::BlockProfile* profile = nullptr;
  bool profile_muted = false;
};

// The first hazard a block ran into, as plain data; turned into text after the fiber yields.
struct Hazard {
  // shared, global: a race (two accesses); out_of_bounds, misaligned: one access the GPU would
  // fault on (access_checks.cpp), in shared memory when `buffer` is null.
  enum class Space : uint8_t { none, shared, global, out_of_bounds, misaligned } space = Space::none;
  bool missing_proxy_fence = false;  // shared: an async-proxy read of a generic write not fenced
  Stamp earlier = 0, later = 0;
  uint64_t earlier_site = 0, later_site = 0;
  uint64_t offset = 0;            // in shared memory, or in the buffer
  uint32_t earlier_block = 0;     // global: the earlier writer's block (linear index)
  const char* buffer = nullptr;   // global, out_of_bounds, misaligned: the buffer's label
  // out_of_bounds, misaligned: the access (by `later` at `later_site`), and the buffer's size;
  // offset is then signed as an int64 (negative: before the buffer's start).
  uint64_t bytes = 0, buffer_bytes = 0;
  bool write = false;
};

// Per worker OS thread, reused from block to block (the shadow keeps its size).
struct BlockState {
  const LaunchState* launch = nullptr;
  uint3 index{};
  dim3 block_dim{};
  uint64_t linear = 0;
  uint32_t serial = 0;
  uint32_t first_epoch = 0;  // the epoch of the block's start
  uint32_t epoch = 0;        // the current one
  std::vector<Cell> cells;
  std::vector<CellSites> sites;
  std::vector<WarpClocks> warps;
  std::vector<ThreadState*> threads;
  Hazard hazard;
  // Blocks that use the Hopper primitives: block-wide vector clocks, per thread (then the stamps'
  // clocks are their own entries, never reset), and the TMA agents (agent a has thread id
  // threads.size() + a), each with the mbarrier offset it writes for and its clock.
  bool vector_clocks = false;
  std::vector<VectorClock> clocks;
  std::vector<uint32_t> agent_barrier, agent_clock;
};

// Called by the engine: at block start (threads[t] is thread t's state; stacks as given), when a
// __syncthreads completes, when a __syncwarp over `lanes` of `warp` completes.
void begin_block(BlockState& block, const LaunchState& launch, uint3 index, dim3 block_dim, uint64_t linear,
                 unsigned char* smem, size_t smem_bytes);
void on_barrier(BlockState& block);
void on_syncwarp(BlockState& block, unsigned warp, unsigned lanes);

// ---- Hopper (called by mbarrier.cpp) ------------------------------------------------------------
// Switches the block to vector clocks (idempotent): every thread's clock starts from what its warp
// clocks know in the current barrier interval.
void use_vector_clocks(BlockState& block);
// A release by `thread` into `into` (an mbarrier phase, a TMA write's issue): `into` joins the
// thread's clock, then the thread's own entry ticks so its later accesses are not covered.
void release_into(BlockState& block, unsigned thread, VectorClock& into);
// An acquire: the thread's clock joins `from`.
void acquire_from(BlockState& block, unsigned thread, const VectorClock& from);
// A new TMA agent for the mbarrier at `barrier_offset`: its thread id (0 if the ids ran out: its
// writes are then charged to no one and unordered with everything).
unsigned new_agent(BlockState& block, uint32_t barrier_offset);
// A TMA write by `issuer` from `site`, issued now: checked against earlier accesses like any
// write, then in flight.
void tma_issued(ThreadState& issuer, size_t offset, size_t bytes, uintptr_t site);
// It lands: its bytes become a write by `agent` at the agent's next clock, returned (the phase it
// counts toward must release it).
uint32_t tma_landed(BlockState& block, unsigned agent, size_t offset, size_t bytes, uintptr_t site);
// fence.proxy.async by the thread.
void proxy_fence(ThreadState& t);
// wgmma reads, charged to block thread `thread`: in flight from begin to end.
void async_read_begin(BlockState& block, unsigned thread, size_t offset, size_t bytes, uintptr_t site);
void async_read_end(BlockState& block, unsigned thread, size_t offset, size_t bytes);
// "file:line in file:line" of a kernel code address (for the engine's reports).
std::string code_location(uintptr_t pc);
// The sim::Error text of the block's hazard ("" if none).
std::string describe(const BlockState& block);

// ---- what the hooks call ------------------------------------------------------------------------
// The running kernel thread's state, or nullptr (no kernel running on this OS thread, or the
// racecheck off). Initial-exec TLS: one %fs-relative load in every hook.
extern thread_local ThreadState* t_thread __attribute__((tls_model("initial-exec")));

void shared_access(ThreadState& t, size_t offset, size_t bytes, Kind kind, uintptr_t pc);
// A write inside `range`'s buffer: the device-memory write conflict check.
void global_write(ThreadState& t, const DeviceRange& range, uintptr_t address, size_t bytes, uintptr_t pc);
void async_landed(ThreadState& t, size_t offset, size_t bytes);

// ---- single accesses: what a GPU faults on and x86 lets pass (access_checks.cpp) ----------------
// An access of device memory (an address in [device_lowest, + device_span)): out of bounds when it
// leaves its buffer for a guard zone; misaligned when `natural` (the compiler's access of an
// N-byte type, which a GPU makes with one N-byte instruction) and the address is not a multiple of
// N; a write then goes on to the write conflict check.
void device_access(ThreadState& t, uintptr_t address, size_t bytes, bool write, uintptr_t pc, bool natural);
// An access at `offset` from the block's dynamic shared memory that is out of bounds (offset past
// its size, into the guard) or, when natural, misaligned.
void shared_fault(ThreadState& t, size_t offset, size_t bytes, bool write, uintptr_t pc);
// The sim::Error text of an out_of_bounds or misaligned hazard.
std::string access_report(const BlockState& block);

// ---- the profiler's view of the same accesses (profile.cpp) ---------------------------------------
// An instrumented access of dynamic shared memory at `offset`, and of device memory at `address`.
void profile_shared(ThreadState& t, size_t offset, size_t bytes, bool write, uintptr_t pc);
void profile_device(ThreadState& t, uintptr_t address, size_t bytes, bool write, uintptr_t pc);
// The launch's allocation whose mapping (guard zones included) holds `address`, or null
// (access_checks.cpp).
const DeviceRange* range_of(ThreadState& t, uintptr_t address);

// The filter every instrumented access goes through; inline so the hooks stay a few instructions
// for the stack and host-memory accesses that are most of what kernels do. `natural`: one of the
// aligned hooks (__tsan_readN / writeN, N = bytes), whose address a GPU requires N-aligned; the
// unaligned hooks and ranges (aggregate copies, which a GPU splits as their alignment allows) are
// not checked for it.
inline void on_access(const void* address, size_t bytes, bool write, uintptr_t pc, bool natural = false) {
  ThreadState* t = t_thread;
  if (__builtin_expect(t == nullptr, 1)) return;
  const uintptr_t p = reinterpret_cast<uintptr_t>(address);
  const uintptr_t offset = p - t->smem_begin;
  if (offset < t->smem_bytes) {
    if (__builtin_expect(t->profile != nullptr, 0)) {
      profile_shared(*t, offset, bytes, write, pc);
      if (!t->checks) return;
    }
    if (__builtin_expect(natural && (p & (bytes - 1)) != 0, 0) || offset + bytes > t->smem_bytes) {
      shared_fault(*t, offset, bytes, write, pc);
    }
    shared_access(*t, offset, bytes, write ? Kind::write : Kind::read, pc);
  } else if (p - t->device_lowest < t->device_span) {
    if (__builtin_expect(t->profile != nullptr, 0)) {
      profile_device(*t, p, bytes, write, pc);
      if (!t->checks) return;
    }
    device_access(*t, p, bytes, write, pc, natural);
  } else if (__builtin_expect(offset - t->smem_bytes < kSharedGuardBytes, 0) && t->checks) {
    shared_fault(*t, offset, bytes, write, pc);
  }
}

}  // namespace selfattn::sim::detail::race
