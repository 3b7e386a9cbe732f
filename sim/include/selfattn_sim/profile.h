#pragma once
// The sim as a profiler (sim/README.md, "The profiler"): per launch, the counts that follow from a
// kernel's access pattern alone, the way Nsight Compute reports them on a GPU, and a speed-of-light
// lower bound on its time for a named GPU computed from them.
//
// The counts are exact for the accesses the sim sees (the racecheck's compiler instrumentation and
// the primitives' twins) under the model described in the README; nothing here is a time measured on
// the sim, whose timing means nothing. The speed-of-light estimate is a lower bound: no GPU runs the
// launch faster than its slowest resource at that resource's ceiling, and a real one runs slower.
//
// Off by default: Options::profile (env SELFATTN_SIM_PROFILE=1) turns it on. A launch with it off
// pays one flag test per primitive twin and math call, and one predictable branch per instrumented
// shared- or device-memory access when the racecheck is on (sim/README.md measures it).
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <vector_types.h>

namespace selfattn::sim {

// ---- the counters of one launch -------------------------------------------------------------------

// Global-memory traffic of one kind (reads or writes) to one buffer label. A request is one
// warp-level instruction (the lanes of a warp at the same code address and the same dynamic
// occurrence, see the README), or one TMA box; a sector is an aligned 32-byte segment.
struct GlobalTraffic {
  uint64_t requests = 0;
  uint64_t bytes_requested = 0;   // the bytes the lanes asked for, summed over requests
  uint64_t sectors = 0;           // distinct sectors of each request, summed over requests
  uint64_t distinct_sectors = 0;  // sectors touched at least once by the whole grid (the DRAM floor)
  // ncu's l1tex__t_sectors_per_request: 4 for a coalesced warp of 4-byte accesses, 32 for one with
  // every lane in its own sector.
  double sectors_per_request() const { return requests ? double(sectors) / double(requests) : 0.0; }
  // Bytes asked for over bytes moved in sectors (1 for a coalesced pattern).
  double efficiency() const { return sectors ? double(bytes_requested) / (32.0 * double(sectors)) : 0.0; }
  GlobalTraffic& operator+=(const GlobalTraffic& o);
};

struct BufferTraffic {
  std::string label;  // the device_alloc label (buffers that share a label are summed)
  GlobalTraffic read, write;
};

// What a shared-memory instruction is. stmatrix has no twin yet: no primitive issues it.
enum class SharedOp : uint8_t { load, store, ldmatrix, stmatrix, cp_async_dst };
constexpr size_t kSharedOps = 5;
const char* shared_op_name(SharedOp op);

// One shared-memory instruction site. Wavefronts: the passes the shared-memory pipeline makes for
// the requests (32 banks of 4 bytes); ideal: the fewest any pattern of the same bytes could take.
struct SharedSite {
  std::string location;  // "file:line in file:line", as the racecheck's reports name code
  SharedOp op = SharedOp::load;
  uint64_t instructions = 0;  // warp-level
  uint64_t bytes = 0;         // requested by the lanes
  uint64_t wavefronts = 0;
  uint64_t ideal_wavefronts = 0;
  uint64_t bank_conflicts() const { return wavefronts - ideal_wavefronts; }  // ncu's: the excess
  double wavefronts_per_instruction() const { return instructions ? double(wavefronts) / double(instructions) : 0.0; }
};

// Tensor-core instructions of one shape: mma.sync per warp, wgmma per warpgroup.
struct TensorOps {
  std::string shape;  // "m16n8k16", "m64n128k16"
  std::string dtype;  // operand type: "f16", "bf16"
  uint64_t instructions = 0;
  uint64_t flops = 0;  // 2 m n k per instruction
};

// The special-function unit's (MUFU) operations, counted per thread (one per lane and call).
enum class Mufu : uint8_t { ex2, lg2, rcp, rsqrt, sin, cos, tanh };
constexpr size_t kMufuKinds = 7;
const char* mufu_name(Mufu kind);

struct LaunchProfile {
  std::string kernel;
  dim3 grid, block;
  size_t dynamic_smem_bytes = 0;
  uint64_t blocks = 0;
  std::vector<BufferTraffic> global;  // per label, in label order
  std::vector<SharedSite> shared;     // per (location, op), in location order
  std::vector<TensorOps> tensor;      // per (shape, dtype)
  std::array<uint64_t, kMufuKinds> mufu{};  // indexed by Mufu
  // Summed over the grid's blocks (divide by `blocks` for per-block counts).
  uint64_t barriers = 0;               // __syncthreads (and _count/_and/_or) completed
  uint64_t warp_syncs = 0;             // __syncwarp completed, per warp
  uint64_t warp_collectives = 0;       // other warp meetings, per warp: shuffles, reductions, votes and
                                       // the twins built on them (mma.sync, ldmatrix)
  uint64_t warpgroup_collectives = 0;  // per warpgroup: wgmma issue and wait, setmaxnreg

  GlobalTraffic reads() const;   // over all buffers
  GlobalTraffic writes() const;
  // The DRAM traffic no schedule or cache can avoid: every distinct sector read once and every
  // distinct sector written once, (distinct read + distinct written sectors) x 32 bytes.
  uint64_t dram_bytes_lower_bound() const;
  uint64_t shared_wavefronts() const;
  uint64_t shared_ideal_wavefronts() const;
  uint64_t tensor_flops() const;
  uint64_t mufu_ops() const;
};

// The profiles of the launches that completed with Options::profile on since the last call, in
// launch order; clears them. Thread-safe. A launch that throws records nothing.
std::vector<LaunchProfile> take_profiles();

// A plain-text report of one profile (kernel, per-buffer global traffic, shared sites, tensor,
// MUFU and synchronisation counts), for people.
std::string format_profile(const LaunchProfile& profile);

// ---- speed of light -------------------------------------------------------------------------------

// A GPU's ceilings for the resources the profile counts. Each number's source is in profile.cpp.
struct GpuCeilings {
  const char* name;
  unsigned sms;
  double clock_hz;                      // the boost clock the per-SM rates are counted at
  double dram_bytes_per_s;              // device-memory copy bandwidth (read + write bytes per second)
  double tensor_flops_per_s;            // dense f16 / bf16 tensor-core FLOPs with f32 accumulation
  double smem_wavefronts_per_sm_clock;  // 1: 32 banks x 4 bytes per SM per clock
  double mufu_ops_per_sm_clock;         // 16: 4 per SM sub-partition
  // Global-memory bytes one SM can take in (or send out) per clock: the L1TEX data path every load's
  // data returns through, 128 bytes per clock. A grid of fewer blocks than SMs reaches at most that
  // many SMs' worth of it, whatever DRAM could give.
  double global_bytes_per_sm_clock = 128.0;
};
const GpuCeilings& gpu_h200();
const GpuCeilings& gpu_a100_sxm_80gb();
// By name ("H200", "A100"; case-insensitive), or null.
const GpuCeilings* gpu_ceilings(const std::string& name);

struct ResourceTime {
  std::string resource;  // "dram", "sm_global", "tensor", "shared", "mufu"
  double seconds = 0.0;
};
// A lower bound on the launch's time, not a measurement and not a prediction: each resource's
// work at its ceiling, and the largest of those.
struct SpeedOfLight {
  std::vector<ResourceTime> resources;
  double lower_bound_seconds = 0.0;
  std::string limiter;  // the resource whose time is the bound ("" when the profile counted nothing)
};
SpeedOfLight estimate(const LaunchProfile& profile, const GpuCeilings& gpu);

// ---- what the primitives' sim twins call ----------------------------------------------------------
// Each is a no-op outside a launch with profiling on; the twins test profiling() first, which
// is all they pay otherwise. `site` is the kernel's code address of the instruction (the noinline
// twin's __builtin_return_address(0)): it names the instruction, and groups the lanes' calls into
// warp-level requests with the same dynamic occurrence.
namespace detail {
extern std::atomic<bool> profiling_launch;  // a launch with profiling on is running
}
inline bool profiling() { return detail::profiling_launch.load(std::memory_order_relaxed); }

// One lane's part of a shared-memory instruction the compiler's instrumentation cannot see (an
// ldmatrix row, a cp.async destination). Addresses outside dynamic shared memory are ignored.
void profile_shared_access(const void* address, size_t bytes, SharedOp op, const void* site);
// One lane's part of a global-memory instruction the instrumentation cannot see (a cp.async
// source). Addresses outside device_alloc buffers are ignored.
void profile_global_access(const void* address, size_t bytes, bool write, const void* site);
// One lane's vector load or store (load_vector / store_vector), global or shared; the host
// compiler's pieces of the same copy, until profile_vector_done(), are not counted again.
void profile_vector_access(const void* address, size_t bytes, bool write, const void* site);
void profile_vector_done();
// A bulk copy's (TMA box's) device-memory reads, element by element, then closed as one request.
void profile_bulk_read(const void* address, size_t bytes);
void profile_bulk_done();
// One tensor-core instruction (called once per warp for mma.sync, once per warpgroup for wgmma).
void profile_tensor_op(unsigned m, unsigned n, unsigned k, const char* dtype);
// One thread's MUFU operation.
void profile_mufu(Mufu kind);

}  // namespace selfattn::sim
