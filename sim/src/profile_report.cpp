// What a LaunchProfile says (selfattn_sim/profile.h): the names of its kinds, its totals over
// buffers and sites, and its text report. The counting itself is profile.cpp's.
#include <cstdarg>
#include <cstdio>
#include <string>

#include "selfattn_sim/profile.h"

namespace selfattn::sim {

GlobalTraffic& GlobalTraffic::operator+=(const GlobalTraffic& o) {
  requests += o.requests;
  bytes_requested += o.bytes_requested;
  sectors += o.sectors;
  distinct_sectors += o.distinct_sectors;
  return *this;
}

const char* shared_op_name(SharedOp op) {
  static const char* const names[kSharedOps] = {"load", "store", "ldmatrix", "stmatrix", "cp.async dst"};
  return names[size_t(op)];
}

const char* mufu_name(Mufu kind) {
  static const char* const names[kMufuKinds] = {"ex2", "lg2", "rcp", "rsqrt", "sin", "cos", "tanh"};
  return names[size_t(kind)];
}

GlobalTraffic LaunchProfile::reads() const {
  GlobalTraffic t;
  for (const BufferTraffic& b : global) t += b.read;
  return t;
}
GlobalTraffic LaunchProfile::writes() const {
  GlobalTraffic t;
  for (const BufferTraffic& b : global) t += b.write;
  return t;
}
uint64_t LaunchProfile::dram_bytes_lower_bound() const {
  return 32 * (reads().distinct_sectors + writes().distinct_sectors);
}
uint64_t LaunchProfile::shared_wavefronts() const {
  uint64_t n = 0;
  for (const SharedSite& s : shared) n += s.wavefronts;
  return n;
}
uint64_t LaunchProfile::shared_ideal_wavefronts() const {
  uint64_t n = 0;
  for (const SharedSite& s : shared) n += s.ideal_wavefronts;
  return n;
}
uint64_t LaunchProfile::tensor_flops() const {
  uint64_t n = 0;
  for (const TensorOps& t : tensor) n += t.flops;
  return n;
}
uint64_t LaunchProfile::mufu_ops() const {
  uint64_t n = 0;
  for (uint64_t c : mufu) n += c;
  return n;
}

}  // namespace selfattn::sim

// ---- the text report ------------------------------------------------------------------------------

namespace selfattn::sim {

namespace {

std::string printed(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string printed(const char* format, ...) {
  char buffer[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buffer, sizeof buffer, format, args);
  va_end(args);
  return buffer;
}

std::string global_row(const char* kind, const std::string& label, const GlobalTraffic& g) {
  return printed("  %-5s %-20s %10llu %14llu %12llu %9.2f %7.1f%% %14llu\n", kind, ("'" + label + "'").c_str(),
                 static_cast<unsigned long long>(g.requests), static_cast<unsigned long long>(g.bytes_requested),
                 static_cast<unsigned long long>(g.sectors), g.sectors_per_request(), 100.0 * g.efficiency(),
                 static_cast<unsigned long long>(g.distinct_sectors));
}

}  // namespace

std::string format_profile(const LaunchProfile& p) {
  using ull = unsigned long long;
  std::string out = printed("kernel '%s': grid (%u,%u,%u), block (%u,%u,%u), %llu blocks, %llu bytes of dynamic shared memory\n",
                            p.kernel.c_str(), p.grid.x, p.grid.y, p.grid.z, p.block.x, p.block.y, p.block.z,
                            ull(p.blocks), ull(p.dynamic_smem_bytes));
  out += printed("global memory %22s %10s %14s %12s %9s %8s %14s\n", "", "requests", "bytes", "sectors", "sect/req",
                 "effic.", "distinct sect.");
  for (const BufferTraffic& b : p.global) {
    if (b.read.requests) out += global_row("read", b.label, b.read);
    if (b.write.requests) out += global_row("write", b.label, b.write);
  }
  out += printed("  DRAM lower bound: %llu bytes (distinct sectors read + written, x 32)\n", ull(p.dram_bytes_lower_bound()));
  out += printed("shared memory %-32s %12s %12s %12s %10s %10s %8s\n", "", "instructions", "bytes", "wavefronts",
                 "ideal", "conflicts", "wf/inst");
  for (const SharedSite& s : p.shared) {
    out += printed("  %-12s %-32s %12llu %12llu %12llu %10llu %10llu %8.2f\n", shared_op_name(s.op), s.location.c_str(),
                   ull(s.instructions), ull(s.bytes), ull(s.wavefronts), ull(s.ideal_wavefronts),
                   ull(s.bank_conflicts()), s.wavefronts_per_instruction());
  }
  for (const TensorOps& t : p.tensor) {
    out += printed("tensor cores: %s %s: %llu instructions, %llu FLOPs\n", t.shape.c_str(), t.dtype.c_str(),
                   ull(t.instructions), ull(t.flops));
  }
  std::string mufu;
  for (size_t k = 0; k < kMufuKinds; ++k) {
    if (p.mufu[k]) mufu += printed(" %s %llu", mufu_name(Mufu(k)), ull(p.mufu[k]));
  }
  if (!mufu.empty()) out += "MUFU (thread operations):" + mufu + "\n";
  out += printed("synchronisation (whole grid): %llu __syncthreads, %llu __syncwarp, %llu warp collectives, "
                 "%llu warpgroup collectives\n",
                 ull(p.barriers), ull(p.warp_syncs), ull(p.warp_collectives), ull(p.warpgroup_collectives));
  return out;
}

}  // namespace selfattn::sim
