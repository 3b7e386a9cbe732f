#pragma once
// What the access-pattern tests (forward/, backward/, kv_cache/ test_*_access_pattern.cpp) share:
// run library calls with the sim's profiler on (sim/README.md, "The profiler") and hold a launch's
// counts to the ideal a kernel's hot loop is designed for (issue 35 item 4):
//   - no bank conflicts at a kernel's ldmatrix and staged-store sites (wavefronts == ideal);
//   - global reads of a buffer fully used by every request: sectors x 32 == bytes asked for, i.e. a
//     warp's 128 bytes in 4 sectors (ncu's sectors per request at efficiency 1).
// Sites are picked by kind and file name, never by line, so edits of a kernel do not move them.
// SELFATTN_TEST_PROFILE=1 prints every profile the tests take; a failing check prints its own.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <selfattn_sim/profile.h>
#include <selfattn_sim/sim.h>

namespace selfattn::testing {

inline bool print_profiles() {
  const char* flag = std::getenv("SELFATTN_TEST_PROFILE");
  return flag != nullptr && std::string(flag) == "1";
}

// The launches `call` makes, profiled (the sim's other options as they are).
template <class Call>
std::vector<sim::LaunchProfile> profile_launches(Call&& call) {
  (void)sim::take_profiles();  // whatever an earlier call left
  const sim::Options saved = sim::options();
  sim::Options profiling = saved;
  profiling.profile = true;
  sim::set_options(profiling);
  try {
    call();
  } catch (...) {
    sim::set_options(saved);
    throw;
  }
  sim::set_options(saved);
  std::vector<sim::LaunchProfile> profiles = sim::take_profiles();
  if (print_profiles())
    for (const sim::LaunchProfile& p : profiles) std::printf("%s\n", sim::format_profile(p).c_str());
  return profiles;
}

// The launches of kernel `name` among `profiles`.
inline std::vector<const sim::LaunchProfile*> launches_of(const std::vector<sim::LaunchProfile>& profiles,
                                                          const std::string& name) {
  std::vector<const sim::LaunchProfile*> found;
  for (const sim::LaunchProfile& p : profiles)
    if (p.kernel == name) found.push_back(&p);
  return found;
}

inline std::string kernel_names(const std::vector<sim::LaunchProfile>& profiles) {
  std::string names;
  for (const sim::LaunchProfile& p : profiles) names += (names.empty() ? "" : ", ") + p.kernel;
  return names;
}

// The traffic of buffer `label` (zeros when the launch never touched it).
inline sim::BufferTraffic traffic_of(const sim::LaunchProfile& p, const std::string& label) {
  for (const sim::BufferTraffic& b : p.global)
    if (b.label == label) return b;
  sim::BufferTraffic none;
  none.label = label;
  return none;
}

// Whether the site's instruction is in file `file` (a path's last component, "flash_fwd.cuh") or
// inlined into code there: its location is "file:line", then " in file:line" for each caller the
// racecheck names (flash_load_tile's cp.async in flash_fwd.cuh, called by a backward kernel, is
// "flash_fwd.cuh:80 in flash_bwd_dkdv.cuh:133").
inline bool site_in_file(const sim::SharedSite& s, const std::string& file) {
  size_t start = 0;
  while (start < s.location.size()) {
    size_t end = s.location.find(' ', start);
    if (end == std::string::npos) end = s.location.size();
    const std::string code = s.location.substr(start, end - start);
    const std::string path = code.substr(0, code.rfind(':'));
    if (path.size() >= file.size() && path.compare(path.size() - file.size(), file.size(), file) == 0 &&
        (path.size() == file.size() || path[path.size() - file.size() - 1] == '/'))
      return true;
    start = s.location.find(" in ", end);
    start = start == std::string::npos ? s.location.size() : start + 4;
  }
  return false;
}

// The sites of kind `op` whose code is in `file`.
inline std::vector<sim::SharedSite> sites_of(const sim::LaunchProfile& p, sim::SharedOp op, const std::string& file) {
  std::vector<sim::SharedSite> found;
  for (const sim::SharedSite& s : p.shared)
    if (s.op == op && site_in_file(s, file)) found.push_back(s);
  return found;
}

inline uint64_t conflicts_of(const std::vector<sim::SharedSite>& sites) {
  uint64_t conflicts = 0;
  for (const sim::SharedSite& s : sites) conflicts += s.bank_conflicts();
  return conflicts;
}

// Every site of kind `op` in `file` takes its ideal wavefronts, and there is at least one (a test
// that finds no site checks nothing: the kernel moved, or its instruction lost its twin).
inline ::testing::AssertionResult no_bank_conflicts(const sim::LaunchProfile& p, sim::SharedOp op,
                                                    const std::string& file) {
  const std::vector<sim::SharedSite> sites = sites_of(p, op, file);
  if (sites.empty())
    return ::testing::AssertionFailure() << p.kernel << ": no " << sim::shared_op_name(op) << " site in " << file
                                         << "\n" << sim::format_profile(p);
  std::string bad;
  for (const sim::SharedSite& s : sites)
    if (s.bank_conflicts() != 0)
      bad += "  " + s.location + ": " + std::to_string(s.wavefronts) + " wavefronts, ideal " +
             std::to_string(s.ideal_wavefronts) + " (" + std::to_string(s.instructions) + " instructions)\n";
  if (!bad.empty())
    return ::testing::AssertionFailure() << p.kernel << ": bank conflicts at " << sim::shared_op_name(op) << " sites of "
                                         << file << ":\n" << bad << sim::format_profile(p);
  return ::testing::AssertionSuccess();
}

// Reads of `label` move no byte they did not ask for: sectors x 32 == bytes requested (a warp's
// 128 bytes in 4 sectors, 16-byte lanes' 512 in 16), and the launch read it at all.
inline ::testing::AssertionResult reads_fully_used(const sim::LaunchProfile& p, const std::string& label) {
  const sim::GlobalTraffic r = traffic_of(p, label).read;
  if (r.requests == 0)
    return ::testing::AssertionFailure() << p.kernel << " read nothing of '" << label << "'\n" << sim::format_profile(p);
  if (r.sectors * 32 != r.bytes_requested)
    return ::testing::AssertionFailure()
           << p.kernel << " reads of '" << label << "': " << r.requests << " requests of " << r.bytes_requested
           << " bytes in " << r.sectors << " sectors (" << r.sectors_per_request() << " per request, "
           << double(r.bytes_requested) / double(r.requests) / 32.0 << " ideal; efficiency " << r.efficiency()
           << ")\n" << sim::format_profile(p);
  return ::testing::AssertionSuccess();
}

}  // namespace selfattn::testing
