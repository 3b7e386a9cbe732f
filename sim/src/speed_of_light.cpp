// The speed-of-light estimate (selfattn_sim/profile.h): a launch's counted work, each resource at its
// ceiling on a named GPU. A LOWER BOUND on the launch's time, never a measurement or a prediction:
// a GPU cannot do the counted DRAM traffic, tensor FLOPs, shared-memory wavefronts or MUFU
// operations faster than these rates, and does the other work (latency, occupancy, issue,
// synchronisation, caches) on top; the sim's own timing plays no part.
#include <algorithm>
#include <cctype>
#include <string>

#include "selfattn_sim/profile.h"

namespace selfattn::sim {

namespace {

// Per-SM rates common to the GPUs below (Ampere and Hopper):
// - Shared memory: 32 banks of 4 bytes, one wavefront (128 bytes) per SM per clock (CUDA C++ Best
//   Practices Guide, "Shared Memory and Memory Banks": successive 32-bit words map to successive
//   banks, each bank serves 32 bits per clock; Nsight Compute's wavefront is one such pass).
// - MUFU: 16 results per SM per clock for the 32-bit reciprocal, reciprocal square root, base-2
//   logarithm and exponential, sine and cosine (CUDA C++ Programming Guide, "Arithmetic
//   Instructions" throughput table, compute capability 8.0 and 9.0: 4 per SM sub-partition).
// - Global memory into (or out of) one SM: 128 bytes per clock, the return bandwidth of the unified
//   L1 / shared-memory data path that every global load's data (an L1 hit, an L2 or DRAM sector, a
//   cp.async source) passes through (NVIDIA's answer on the developer forum, "Unexpected shared
//   memory bank conflict", forums.developer.nvidia.com/t/77228: "The return bandwidth of L1 and
//   shared memory is 128 bytes/cycle", compute capability 7.x; the same 32 banks x 4 bytes as the
//   shared-memory ceiling above, on the same SRAM since Volta). What an SM can draw from L2 is
//   less (the A100 whitepaper gives the whole L2 5120 bytes per clock of read bandwidth, ~47 per
//   SM with all 108 busy; no published per-SM L2-to-SM figure for Hopper was found), so this is an
//   upper limit on the rate and the time it gives stays a lower bound. It shows a grid of too few
//   blocks, whose SMs cannot take the bytes in as fast as DRAM sends them: on the H200, fewer
//   than 4.3e12 / (128 x 1.98e9) ~ 17 busy SMs for a kernel that reads each byte once.
constexpr double kSmemWavefrontsPerSmClock = 1.0;
constexpr double kMufuPerSmClock = 16.0;
constexpr double kGlobalBytesPerSmClock = 128.0;

}  // namespace

const GpuCeilings& gpu_h200() {
  static const GpuCeilings h200{
      "H200",
      // GH100 as in the H100 SXM5: 132 SMs (NVIDIA H100 Tensor Core GPU Architecture whitepaper;
      // the H200 datasheet keeps the H100 SXM's compute).
      132,
      // The H100 SXM5's maximum boost clock, 1980 MHz (whitepaper): the per-SM rates are counted at it.
      1.98e9,
      // Copy bandwidth, read + write bytes: ~4.3 TB/s, the figure bench/NOTES.md gives for the bench's
      // copy ceiling on an H200 (the datasheet's HBM3e peak is 4.8 TB/s; no copy reaches it).
      4.3e12,
      // Dense bf16 tensor FLOPs with f32 accumulation: ~790 TFLOPS, the bench's cuBLAS GEMM ceiling
      // on an H200 (bench/NOTES.md: ~780-800); the datasheet's dense peak is 989 TFLOPS (1979 with
      // sparsity).
      790e12,
      kSmemWavefrontsPerSmClock,
      kMufuPerSmClock,
      kGlobalBytesPerSmClock,
  };
  return h200;
}

const GpuCeilings& gpu_a100_sxm_80gb() {
  static const GpuCeilings a100{
      "A100-SXM4-80GB",
      // 108 SMs, boost clock 1410 MHz (NVIDIA A100 Tensor Core GPU Architecture whitepaper).
      108,
      1.41e9,
      // HBM2e peak 2039 GB/s (A100 datasheet, 80 GB SXM). This project has no A100 measurement;
      // others report copies at ~1.7-1.8 TB/s, so the bound here is looser than the H200's.
      2.039e12,
      // Dense bf16 / f16 tensor FLOPs: 312 TFLOPS (datasheet; 624 with sparsity).
      312e12,
      kSmemWavefrontsPerSmClock,
      kMufuPerSmClock,
      kGlobalBytesPerSmClock,
  };
  return a100;
}

const GpuCeilings* gpu_ceilings(const std::string& name) {
  std::string lower;
  for (char c : name) lower += char(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "h200") return &gpu_h200();
  if (lower == "a100" || lower == "a100-sxm4-80gb") return &gpu_a100_sxm_80gb();
  return nullptr;
}

SpeedOfLight estimate(const LaunchProfile& p, const GpuCeilings& gpu) {
  // A block runs on one SM, so a grid of fewer blocks than SMs has at most that many SMs' shared
  // memory, MUFUs, tensor cores and global-memory paths: the per-SM resources are shared by
  // min(blocks, SMs) SMs (the busiest SM has at least the average of those). DRAM is the device's.
  const double sms = double(p.blocks == 0 ? gpu.sms : std::min<uint64_t>(p.blocks, gpu.sms));
  const double sm_share = sms / double(gpu.sms);
  // sm_global: the sectors every request moves (a block re-reading a sector moves it again, an L1
  // hit included), reads and writes each at the per-SM rate; the larger of the two, as the paths
  // in and out are not known to share it.
  const GlobalTraffic reads = p.reads(), writes = p.writes();
  const double sm_global_bytes = 32.0 * double(std::max(reads.sectors, writes.sectors));
  SpeedOfLight s;
  s.resources = {
      {"dram", double(p.dram_bytes_lower_bound()) / gpu.dram_bytes_per_s},
      {"sm_global", sm_global_bytes / (gpu.global_bytes_per_sm_clock * sms * gpu.clock_hz)},
      {"tensor", double(p.tensor_flops()) / (gpu.tensor_flops_per_s * sm_share)},
      {"shared", double(p.shared_wavefronts()) / (gpu.smem_wavefronts_per_sm_clock * sms * gpu.clock_hz)},
      {"mufu", double(p.mufu_ops()) / (gpu.mufu_ops_per_sm_clock * sms * gpu.clock_hz)},
  };
  for (const ResourceTime& r : s.resources) {
    if (r.seconds > s.lower_bound_seconds) {
      s.lower_bound_seconds = r.seconds;
      s.limiter = r.resource;
    }
  }
  return s;
}

}  // namespace selfattn::sim
