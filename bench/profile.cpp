// --profile (sim backend only): one call of a case's timed operation under the sim's profiler
// (sim/README.md, "The profiler"). Per launch: the counters Nsight Compute would report (global
// sectors per request, DRAM lower-bound bytes, shared-memory wavefronts and bank conflicts, tensor
// FLOPs, MUFU operations) and the speed-of-light lower bound on a named GPU with its limiter; per
// case their sum, and the case's TFLOPS and GB/s at that bound by the bench's own FLOP and byte
// counts. Nothing here is a time measured on the sim. The JSON fields are documented in bench/README.md.
#include <algorithm>
#include <cstdio>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <selfattn_sim/sim.h>

#include "bench.h"

namespace selfattn_bench {

namespace sim = selfattn::sim;

struct CaseProfile {
  std::string gpu;                          // the ceilings' name, e.g. "H200"
  std::vector<sim::LaunchProfile> launches;  // in launch order
  std::vector<sim::SpeedOfLight> bounds;     // one per launch
};

namespace {

// Turns the profiler on for its lifetime and restores the options as they were (also when the call throws).
class ProfilingOn {
 public:
  ProfilingOn() : before_(sim::options()) {
    sim::Options on = before_;
    on.profile = true;
    sim::set_options(on);
  }
  ~ProfilingOn() { sim::set_options(before_); }
  ProfilingOn(const ProfilingOn&) = delete;
  ProfilingOn& operator=(const ProfilingOn&) = delete;

 private:
  sim::Options before_;
};

double seconds_of(const sim::SpeedOfLight& bound, const char* resource) {
  for (const sim::ResourceTime& r : bound.resources)
    if (r.resource == resource) return r.seconds;
  return 0.0;
}

// ncu's "shared bank conflicts" as a share of the wavefronts: the excess passes over all passes.
double conflict_percent(uint64_t wavefronts, uint64_t ideal) {
  return wavefronts ? 100.0 * double(wavefronts - ideal) / double(wavefronts) : 0.0;
}

uint64_t distinct_bytes(const sim::GlobalTraffic& t) { return 32 * t.distinct_sectors; }

double sum_bounds(const CaseProfile& p) {
  double total = 0;
  for (const sim::SpeedOfLight& b : p.bounds) total += b.lower_bound_seconds;
  return total;
}

// The case's limiter: the resource that limits the launches holding most of the summed bound.
std::string case_limiter(const CaseProfile& p) {
  std::map<std::string, double> by_limiter;
  for (const sim::SpeedOfLight& b : p.bounds)
    if (!b.limiter.empty()) by_limiter[b.limiter] += b.lower_bound_seconds;
  std::string limiter;
  double most = -1;
  for (const auto& [name, seconds] : by_limiter)
    if (seconds > most) most = seconds, limiter = name;
  return limiter;
}

// "flash_fwd_hopper_kernel<bf16, 128>" cut to the table's column, its start kept.
std::string short_name(const std::string& kernel, size_t width) {
  return kernel.size() <= width ? kernel : kernel.substr(0, width - 3) + "...";
}

nlohmann::json traffic_json(const sim::GlobalTraffic& t) {
  return {{"requests", t.requests},
          {"sectors", t.sectors},
          {"bytes_requested", t.bytes_requested},
          {"distinct_sectors", t.distinct_sectors},
          {"sectors_per_request", t.sectors_per_request()},
          {"efficiency", t.efficiency()}};
}

}  // namespace

bool known_profile_gpu(const std::string& name) { return sim::gpu_ceilings(name) != nullptr; }

std::shared_ptr<const CaseProfile> profile_call(const std::function<void()>& call, const std::string& gpu) {
  const sim::GpuCeilings* ceilings = sim::gpu_ceilings(gpu);
  if (ceilings == nullptr) throw std::invalid_argument("no GPU ceilings named '" + gpu + "'");
  (void)sim::take_profiles();  // launches before this call (profiling on from SELFATTN_SIM_PROFILE=1) are not its own
  auto profile = std::make_shared<CaseProfile>();
  profile->gpu = ceilings->name;
  {
    ProfilingOn on;
    call();
  }
  profile->launches = sim::take_profiles();
  for (const sim::LaunchProfile& launch : profile->launches) profile->bounds.push_back(sim::estimate(launch, *ceilings));
  return profile;
}

void print_profile(const CaseResult& result) {
  if (!result.profile) return;
  const CaseProfile& p = *result.profile;
  std::printf("\nprofile: %s: one call, speed of light on %s (lower bounds from the sim's counts, not times)\n",
              describe(result.c).c_str(), p.gpu.c_str());
  if (p.launches.empty()) {
    // The cublas path's GEMMs run on the host on the sim: they are not kernel launches.
    std::printf("  no kernel launches were profiled (the sim's GEMMs are not launches)\n");
    return;
  }
  std::printf("  %-34s %-11s %9s %7s %6s %7s %10s %10s %6s %10s %9s %9s %9s %9s %9s %9s %s\n", "kernel", "grid",
              "DRAM_MB", "rd_s/rq", "rd_eff", "wr_s/rq", "smem_wf", "ideal_wf", "confl%", "tensor_GF", "MUFU_M",
              "dram_us", "tensor_us", "smem_us", "mufu_us", "bound_us", "limiter");
  for (size_t i = 0; i < p.launches.size(); ++i) {
    const sim::LaunchProfile& l = p.launches[i];
    const sim::SpeedOfLight& b = p.bounds[i];
    const sim::GlobalTraffic reads = l.reads(), writes = l.writes();
    const std::string grid = std::to_string(l.grid.x) + "x" + std::to_string(l.grid.y) + "x" + std::to_string(l.grid.z);
    std::printf("  %-34s %-11s %9.3f %7.2f %5.0f%% %7.2f %10llu %10llu %6.1f %10.4f %9.4f %9.3f %9.3f %9.3f %9.3f %9.3f %s\n",
                short_name(l.kernel, 34).c_str(), grid.c_str(), double(l.dram_bytes_lower_bound()) / 1e6,
                reads.sectors_per_request(), 100.0 * reads.efficiency(), writes.sectors_per_request(),
                (unsigned long long)l.shared_wavefronts(), (unsigned long long)l.shared_ideal_wavefronts(),
                conflict_percent(l.shared_wavefronts(), l.shared_ideal_wavefronts()), double(l.tensor_flops()) / 1e9,
                double(l.mufu_ops()) / 1e6, 1e6 * seconds_of(b, "dram"), 1e6 * seconds_of(b, "tensor"),
                1e6 * seconds_of(b, "shared"), 1e6 * seconds_of(b, "mufu"), 1e6 * b.lower_bound_seconds,
                b.limiter.empty() ? "-" : b.limiter.c_str());
  }
  uint64_t dram = 0;
  for (const sim::LaunchProfile& l : p.launches) dram += l.dram_bytes_lower_bound();
  const double bound = sum_bounds(p);
  const double flops = attention_flops(result.c), bytes = attention_bytes(result.c);
  std::printf("  total: %zu launch%s, bound %.3f us (%s)", p.launches.size(), p.launches.size() == 1 ? "" : "es",
              1e6 * bound, case_limiter(p).c_str());
  if (bound > 0) std::printf(": %.1f TFLOPS, %.0f GB/s at the bound", flops / bound / 1e12, bytes / bound / 1e9);
  std::printf("; DRAM %.3f MB vs the bench's bytes %.3f MB (%.2fx)\n", double(dram) / 1e6, bytes / 1e6,
              bytes > 0 ? double(dram) / bytes : 0.0);
}

nlohmann::json profile_json(const CaseResult& result) {
  using nlohmann::json;
  if (!result.profile) return nullptr;
  const CaseProfile& p = *result.profile;
  json launches = json::array();
  uint64_t dram = 0, tensor = 0, mufu = 0, wavefronts = 0, ideal = 0;
  for (size_t i = 0; i < p.launches.size(); ++i) {
    const sim::LaunchProfile& l = p.launches[i];
    const sim::SpeedOfLight& b = p.bounds[i];
    dram += l.dram_bytes_lower_bound();
    tensor += l.tensor_flops();
    mufu += l.mufu_ops();
    wavefronts += l.shared_wavefronts();
    ideal += l.shared_ideal_wavefronts();
    json buffers = json::array();
    for (const sim::BufferTraffic& t : l.global)
      buffers.push_back({{"label", t.label}, {"read", traffic_json(t.read)}, {"write", traffic_json(t.write)}});
    json sites = json::array();
    for (const sim::SharedSite& s : l.shared)
      sites.push_back({{"location", s.location},
                       {"op", sim::shared_op_name(s.op)},
                       {"instructions", s.instructions},
                       {"bytes", s.bytes},
                       {"wavefronts", s.wavefronts},
                       {"ideal_wavefronts", s.ideal_wavefronts},
                       {"bank_conflicts", s.bank_conflicts()}});
    json tensor_ops = json::array();
    for (const sim::TensorOps& t : l.tensor)
      tensor_ops.push_back({{"shape", t.shape}, {"dtype", t.dtype}, {"instructions", t.instructions}, {"flops", t.flops}});
    json mufu_kinds = json::object();
    for (size_t k = 0; k < sim::kMufuKinds; ++k)
      if (l.mufu[k]) mufu_kinds[sim::mufu_name(sim::Mufu(k))] = l.mufu[k];
    json seconds = json::object();
    for (const sim::ResourceTime& r : b.resources) seconds[r.resource] = r.seconds;
    launches.push_back({
        {"kernel", l.kernel},
        {"grid", {l.grid.x, l.grid.y, l.grid.z}},
        {"block", {l.block.x, l.block.y, l.block.z}},
        {"dynamic_smem_bytes", l.dynamic_smem_bytes},
        {"dram_bytes", l.dram_bytes_lower_bound()},
        {"dram_read_bytes", distinct_bytes(l.reads())},
        {"dram_write_bytes", distinct_bytes(l.writes())},
        {"global_read", traffic_json(l.reads())},
        {"global_write", traffic_json(l.writes())},
        {"buffers", buffers},
        {"shared_wavefronts", l.shared_wavefronts()},
        {"shared_ideal_wavefronts", l.shared_ideal_wavefronts()},
        {"bank_conflicts", l.shared_wavefronts() - l.shared_ideal_wavefronts()},
        {"conflict_pct", conflict_percent(l.shared_wavefronts(), l.shared_ideal_wavefronts())},
        {"shared_sites", sites},
        {"tensor_flops", l.tensor_flops()},
        {"tensor", tensor_ops},
        {"mufu_ops", l.mufu_ops()},
        {"mufu", mufu_kinds},
        {"barriers", l.barriers},
        {"seconds", seconds},
        {"bound_seconds", b.lower_bound_seconds},
        {"limiter", b.limiter.empty() ? json(nullptr) : json(b.limiter)},
    });
  }
  const double bound = sum_bounds(p);
  const double flops = attention_flops(result.c), bytes = attention_bytes(result.c);
  const std::string limiter = case_limiter(p);
  return {{"gpu", p.gpu},
          {"launches", launches},
          {"totals",
           {{"launches", p.launches.size()},
            {"dram_bytes", dram},
            {"bytes", bytes},
            {"dram_over_bytes", bytes > 0 ? json(double(dram) / bytes) : json(nullptr)},
            {"tensor_flops", tensor},
            {"flops", flops},
            {"mufu_ops", mufu},
            {"shared_wavefronts", wavefronts},
            {"shared_ideal_wavefronts", ideal},
            {"conflict_pct", conflict_percent(wavefronts, ideal)},
            {"bound_seconds", bound},
            {"tflops_at_bound", bound > 0 ? json(flops / bound / 1e12) : json(nullptr)},
            {"gbps_at_bound", bound > 0 ? json(bytes / bound / 1e9) : json(nullptr)},
            {"limiter", limiter.empty() ? json(nullptr) : json(limiter)}}}};
}

}  // namespace selfattn_bench
