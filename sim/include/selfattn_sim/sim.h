#pragma once
// The sim: runs CUDA kernel source on the CPU. Each CUDA thread is a fiber; a block's fibers run
// on one OS thread, cooperatively, switching only at barriers and warp collectives. Between two
// such points, a block's threads run one after another in an order drawn from a seeded random
// permutation, so a missing barrier changes the result instead of hiding.
//
// CONTRACT (written before the implementation; keep the names, extend freely):
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <vector_types.h>

namespace selfattn::sim {

// Everything the sim reports (divergent barrier, guard-zone violation, bad launch) is a sim::Error
// whose message names the kernel, the block and the thread (or the buffer and the offset).
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct LaunchConfig {
  const char* kernel_name = "kernel";
  dim3 grid;
  dim3 block;
  size_t dynamic_smem_bytes = 0;  // up to 227 KB (H200's opt-in limit)
  // Which compiled kernel this is, for the launch checks against what ptxas gave it (below): a
  // mangled type name whose demangling holds the kernel's name (kernels/launch.h makes it), or null.
  const char* kernel_key = nullptr;
};

// What ptxas gave a kernel for one architecture (its -Xptxas -v report, recorded at build time).
// With these registered, every launch of that kernel is checked as a GPU of each recorded
// architecture checks it, and refused as "too many resources requested for launch": registers per
// thread (allocated per warp in units of 256) times the block's warps within the SM's 65536;
// static plus dynamic shared memory within the architecture's per-block limit. The register pool
// setmaxnreg moves within is then this count times the block's threads.
struct CompiledKernel {
  const char* mangled_name;   // as ptxas names the entry function (the cuda_target build's)
  const char* arch;           // "sm_90a", "sm_80", ...
  unsigned registers = 0;     // per thread
  unsigned static_smem = 0;   // bytes
  unsigned stack_frame = 0;   // bytes per thread (local memory)
  unsigned max_threads = 0;   // per block, from __launch_bounds__ (the PTX's .maxntid); 0: none given
};
// Adds kernels to the table (a later entry for the same kernel and architecture replaces it).
void register_compiled_kernels(const CompiledKernel* kernels, size_t count);
// The architectures recorded for the kernel of a LaunchConfig::kernel_key ("sm_80 sm_90", "" when none).
std::string compiled_kernel_architectures(const char* kernel_key);
// The threads per block its __launch_bounds__ allows, as recorded (0: no bound, or no record).
unsigned compiled_kernel_max_threads(const char* kernel_key);
// Why a GPU of `kernel.arch` refuses to launch `kernel` with `block` and this much dynamic shared
// memory ("too many resources requested for launch"), or "" when it launches: the rule each launch
// is checked with (a GPU test holds it against the hardware's own verdict).
std::string launch_refusal(const CompiledKernel& kernel, dim3 block, size_t dynamic_smem_bytes);
// The kernel's name as both builds agree on it, from a mangled function name or a LaunchConfig's
// kernel_key: demangled, the target namespace (sim_target, cuda_target) left out. "" if unknown.
std::string compiled_kernel_name(const char* mangled);

// Runs `body(params)` once per CUDA thread of every block of the grid; returns when all are done.
// Blocks may run on several worker OS threads. Checks every device allocation's guard zones after
// the launch. Throws sim::Error.
void launch(const LaunchConfig& config, void (*body)(const void* params), const void* params);

struct Options {
  uint64_t seed = 1;        // scheduling permutation seed; env SELFATTN_SIM_SEED overrides at start-up
  int worker_threads = 0;   // 0: hardware concurrency; env SELFATTN_SIM_THREADS
  // Shared-memory hazards and device-memory write conflicts reported as sim::Error (sim/README.md);
  // env SELFATTN_SIM_RACECHECK=0 turns it off.
  bool racecheck = true;
  // Count each launch's memory traffic, shared-memory wavefronts, tensor-core and MUFU operations
  // and synchronisation (selfattn_sim/profile.h, take_profiles()); env SELFATTN_SIM_PROFILE=1 turns
  // it on. Works with the racecheck off too, on the same instrumentation.
  bool profile = false;
};
Options options();
void set_options(const Options& options);

// One pending cp.async: the copy happens when its group is waited for, not before.
struct AsyncCopy {
  void* dst;
  const void* src;
  uint32_t bytes;     // bytes to copy from src
  uint32_t zero_fill; // bytes after them to zero (cp.async's src-size < cp-size form)
};

// Per-CUDA-thread state, valid inside a launch.
struct ThreadContext {
  uint3 thread_idx;
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
  unsigned linear_tid;  // x + y*bx + z*bx*by
  unsigned lane;        // linear_tid % 32
  unsigned warp;        // linear_tid / 32
  unsigned char* dynamic_smem;  // this block's dynamic shared memory, NaN-filled at block start
  size_t dynamic_smem_bytes;
  std::vector<std::vector<AsyncCopy>> async_groups;  // committed groups, oldest first
  std::vector<AsyncCopy> async_open;                 // issued, not yet committed
  // wgmma.mma_async operations of this thread's warpgroup (primitives_hopper.cuh): issued and not
  // yet committed, and committed groups, oldest first. The ops are shared by the warpgroup's 128
  // threads; the engine only clears these at block start and reports a thread that exits with any.
  std::vector<std::shared_ptr<void>> wgmma_open;
  std::vector<std::vector<std::shared_ptr<void>>> wgmma_groups;
  // Retired by a wait whose results have not yet been written back (wgmma_fence_operands).
  std::vector<std::shared_ptr<void>> wgmma_retired;
  // Whether a wgmma.fence came after this thread's last wgmma.wait_group (or its start): a wgmma
  // issued otherwise is not ordered after the code that touched its registers since (the ISA's
  // fence rule; a wait is taken as that code's start, since results are read after one).
  bool wgmma_fenced = false;
};
ThreadContext& current_thread();

void syncthreads();
// __syncthreads_count: a barrier that also returns how many of the block's threads passed a
// non-zero predicate (__syncthreads_and / _or derive from it).
int syncthreads_count(int predicate);
void syncwarp(unsigned mask);
// The lanes of the calling thread's warp that exist and have not exited (the sim's __activemask:
// it cannot see branch divergence, only absent and finished threads).
unsigned warp_live_mask();

// Sim code compiled into kernel objects that acts for a whole warp (a collective's combine, which
// the last lane to arrive runs over every lane's data): the racecheck's instrumentation skips it,
// so its memory accesses are not charged to the lane that happens to run it. Primitives that touch
// shared memory for other lanes (ldmatrix) report each lane's access themselves.
#define SELFATTN_SIM_UNCHECKED __attribute__((no_sanitize("thread")))

// Warp-synchronous collective. Every lane named in `mask` calls it (with the same mask); when the
// last one arrives, `combine` runs once as combine(ins, outs), where ins[lane] / outs[lane] point at
// each participating lane's `in` / `out` (nullptr for lanes outside the mask); then all continue.
// A lane of the mask that exits or waits elsewhere is reported as divergence.
using CollectiveFn = void (*)(const void* const* ins, void* const* outs, void* combine);
void warp_collective_erased(unsigned mask, const void* in, void* out, CollectiveFn fn, void* combine);

template <class In, class Out, class Combine>
void warp_collective(unsigned mask, const In& in, Out& out, Combine&& combine) {
  using C = std::remove_reference_t<Combine>;
  warp_collective_erased(
      mask, &in, &out,
      [](const void* const* ins, void* const* outs, void* fn) SELFATTN_SIM_UNCHECKED {
        (*static_cast<C*>(fn))(reinterpret_cast<const In* const*>(ins), reinterpret_cast<Out* const*>(outs));
      },
      const_cast<void*>(static_cast<const void*>(&combine)));
}

// The racecheck's view of what compiler instrumentation cannot see, reported by the primitives' sim
// twins in the calling thread's name: one lane's ldmatrix row (a read of 16 bytes), a cp.async issued
// (a write in flight from now) and landed (at the cp.async.wait_group that retires it). `site` is a
// code address in the kernel for the report: the twin's __builtin_return_address(0), the twin being
// noinline. No-ops outside a launch, with the racecheck off, or for addresses outside dynamic shared
// memory.
enum class SharedAccess { ldmatrix_row, cp_async_issue };
void racecheck_shared(const void* address, size_t bytes, SharedAccess what, const void* site);
void racecheck_async_landed(const void* address, size_t bytes);

// The checks of single accesses (sim/README.md: out of bounds, misaligned) for an access the
// compiler's instrumentation does not see as the GPU makes it: a twin's own read of device memory
// (a cp.async source, a TMA box's elements), or a vector load or store, which the host compiler
// splits into 4-byte pieces. By the calling thread, from kernel code address `site`; `natural`:
// the address must be a multiple of `bytes`. Reported like a hazard (the launch fails with the
// kernel, block, thread and site). No-op outside a launch or with the racecheck off.
void check_access(const void* address, size_t bytes, bool write, bool natural, const void* site);

// ---- Hopper (sm_90a): mbarriers, the asynchronous proxy, warpgroups --------------------------
// Contract for kernels/common/primitives_hopper.cuh's sim twins (sim/README.md, "Hopper").
//
// mbarrier: an 8-byte object in dynamic shared memory (8-byte aligned). The sim keeps each live
// barrier's state beside the memory (keyed by its offset in the block's shared memory): arrival
// count, pending arrivals, transaction count (may go negative, as the ISA allows), phase number.
// The current phase completes when its pending arrivals reach 0 and its tx-count is 0; the next
// phase then starts with the full arrival count. Every call below throws sim::Error (naming the
// kernel, block, thread and barrier offset) on misuse: an address that is not an 8-aligned offset
// of dynamic shared memory; init with count 0 or above 2^20 - 1; init of a live barrier whose
// current phase has arrivals or transactions outstanding ("re-arming"); any other operation on an
// address that holds no initialised barrier; more arrivals than the phase has pending; a wait by a
// thread on a parity when the barrier has moved two or more phases past the last phase that
// thread observed (the parity no longer says which phase it means); the block ending with a TMA
// write still in flight.
// Ordering (the racecheck): an arrive releases the arriving thread's history into the phase; a
// wait that sees the phase complete acquires it (every access before any arrival of that phase,
// and every TMA write the phase counted, happens before what the waiter does next).
void mbarrier_init(void* bar, unsigned arrival_count);
// fence.mbarrier_init by the calling thread: the barriers it initialised so far become visible to
// the async proxy. A TMA write (tma_write) counted by a barrier whose initialising thread has not
// fenced since the init is reported: the PTX ISA asks for the fence before the TMA unit uses it.
void fence_mbarrier_init();
void mbarrier_arrive(void* bar, unsigned count = 1);
void mbarrier_expect_tx(void* bar, unsigned tx_bytes);
void mbarrier_arrive_expect_tx(void* bar, unsigned tx_bytes);  // expect-tx, then one arrival
// Whether the phase with this parity has completed (mbarrier.test_wait.parity: true when the
// current phase's parity differs). A true result acquires, as a wait does.
bool mbarrier_test_parity(void* bar, unsigned parity);
// mbarrier.try_wait.parity in a loop: the fiber gives way until the phase with this parity completes
// (a thread that can never be woken is reported with the block's other waiters, never hung).
void mbarrier_wait_parity(void* bar, unsigned parity);

// A TMA load (cp.async.bulk.tensor ... mbarrier::complete_tx::bytes): `image` is the final content
// of the contiguous shared-memory bytes [dst, dst + image.size()) (the twin has applied the box,
// the out-of-bounds fill and the swizzle). The write is in flight from now: any access to those
// bytes before it lands is a hazard. It lands at a point the sim chooses between now and the
// completion of `bar`'s current phase (the latest one: when a thread tests or waits on `bar` and
// only transactions are outstanding, or when no thread of the block can run), then performs
// complete-tx(image.size()) on `bar`. The issuing thread's history at the issue is released into
// that phase. `site` is the kernel's code address of the issue, for reports.
void tma_write(void* bar, void* dst, std::vector<unsigned char> image, const void* site);

// fence.proxy.async.shared::cta by the calling thread: its generic-proxy writes to shared memory so
// far become visible to the asynchronous proxy. An asynchronous-proxy read (wgmma) of bytes whose
// last write was a generic write not followed by such a fence of its writer is reported (as is one
// not ordered after that write at all).
void fence_proxy_async();

// Asynchronous-proxy reads (wgmma's shared-memory operands), charged to thread `thread` of the
// block (the twin passes its warpgroup's first thread). In flight from begin to end: a write to
// those bytes meanwhile (generic, cp.async or TMA) is a hazard. At end they become reads by that
// thread at that moment, ordered for later writers by the usual rules (barriers, mbarriers).
void racecheck_async_read_begin(unsigned thread, const void* address, size_t bytes, const void* site);
void racecheck_async_read_end(unsigned thread, const void* address, size_t bytes);

// setmaxnreg.{inc,dec} by the calling thread's warpgroup (one call per warpgroup, after the twin has
// checked that its 128 threads agree), against the block's register pool: what the launch gave it,
// taken as the most a block of its size can get (65536 / threads per thread, a multiple of 8, at most
// 256: what ptxas allocates under __launch_bounds__(threads, 1)). Each warpgroup holds what the
// launch gave it until its first setmaxnreg. A dec gives registers back at once; an inc waits (the
// calling thread blocks) until the pool has room for it, as on the GPU (PTX ISA: setmaxnreg.inc
// blocks until the pool has enough), and a block in which it never will is reported as a deadlock
// naming the wait. An inc below or a dec above the warpgroup's current count is reported at once.
// Registers of warpgroups that exited are not given back (the PTX ISA does not promise it).
void setmaxnreg(unsigned count, bool increase);

// Warpgroup collective: the 128 threads 128g .. 128g + 127 of the block (g = the caller's
// linear_tid / 128; the block must have whole warpgroups) all call it; the last to arrive runs
// combine(ins, outs) with ins[i] / outs[i] the pointers of thread 128g + i; then all continue.
// Lanes waiting at other collectives or barriers are a divergence, reported as for warps.
using GroupCollectiveFn = void (*)(const void* const* ins, void* const* outs, void* combine);
void warpgroup_collective_erased(const void* in, void* out, GroupCollectiveFn fn, void* combine);

template <class In, class Out, class Combine>
void warpgroup_collective(const In& in, Out& out, Combine&& combine) {
  using C = std::remove_reference_t<Combine>;
  warpgroup_collective_erased(
      &in, &out,
      [](const void* const* ins, void* const* outs, void* fn) SELFATTN_SIM_UNCHECKED {
        (*static_cast<C*>(fn))(reinterpret_cast<const In* const*>(ins), reinterpret_cast<Out* const*>(outs));
      },
      const_cast<void*>(static_cast<const void*>(&combine)));
}

// Device memory. Each allocation has guard zones before and after it, checked after every launch
// (and on free); a violation names the allocation's label and the offset. Large allocations are
// reserved lazily (mmap, no commit), so offsets past 2^31 elements can be tested cheaply.
void* device_alloc(size_t bytes, const char* label);
void device_free(void* ptr);
void check_guards(const char* after_what);

}  // namespace selfattn::sim

#include "selfattn_sim/profile.h"  // the profiler's API, which the twins call too
