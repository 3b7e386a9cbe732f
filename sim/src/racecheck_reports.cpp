// The racecheck's reports (see racecheck.h: Hazard, describe, code_location): the sim::Error text of
// a block's shared-memory hazard or device-memory write conflict, naming the kernel, the block, both
// accesses' threads and their source lines (addr2line on the line tables). Out-of-bounds and
// misaligned accesses are reported by access_checks.cpp.
#include "racecheck_internal.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

namespace selfattn::sim::detail::race {

namespace {

// ---- reports ------------------------------------------------------------------------------------

std::string hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string base_name(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// "file:line" of the code at `pc`, with the chain of functions it is inlined into ("a.cuh:12 in
// b.cuh:30 in kernel.cuh:77"), from the line tables (-g1) by addr2line; frames inside the sim's
// own headers (compat.h, primitives*.cuh) are dropped from the front, so an ldmatrix row names the
// kernel line that loads it. Without line tables: the module and offset.
std::string code_location_of(uintptr_t pc) {
  if (pc == 0) return "?";
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(pc), &info) == 0 || info.dli_fname == nullptr || info.dli_fbase == nullptr) {
    return hex(pc);
  }
  const auto* header = static_cast<const ElfW(Ehdr)*>(info.dli_fbase);
  // pc is a return address: -1 lands inside the call instruction, on the access's own line.
  const uintptr_t address = (header->e_type == ET_DYN ? pc - reinterpret_cast<uintptr_t>(info.dli_fbase) : pc) - 1;
  std::string module = info.dli_fname;
  if (module.empty() || access(module.c_str(), R_OK) != 0) module = "/proc/self/exe";
  const std::string fallback = base_name(module) + "+" + hex(address) +
                               (info.dli_sname ? std::string(" (") + info.dli_sname + ")" : std::string());

  const std::string command = "addr2line -f -i -C -e " + shell_quote(module) + " " + hex(address) + " 2>/dev/null";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return fallback;
  std::vector<std::string> lines;
  char buffer[4096];
  while (std::fgets(buffer, sizeof buffer, pipe)) {
    std::string line = buffer;
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
    lines.push_back(line);
  }
  pclose(pipe);
  std::vector<std::string> frames;  // innermost first; lines alternate function, file:line
  for (size_t i = 1; i < lines.size(); i += 2) {
    std::string where = lines[i];
    const size_t space = where.find(' ');  // " (discriminator N)"
    if (space != std::string::npos) where.resize(space);
    if (where.empty() || where[0] == '?') continue;
    frames.push_back(base_name(where));
  }
  auto internal = [](const std::string& f) { return f.rfind("compat.h:", 0) == 0 || f.rfind("primitives", 0) == 0; };
  size_t first = 0;
  while (first + 1 < frames.size() && internal(frames[first])) ++first;
  if (first == frames.size()) return fallback;
  std::string text = frames[first];
  for (size_t i = first + 1, shown = 1; i < frames.size() && shown < 3; ++i) {
    if (frames[i] == frames[i - 1]) continue;
    text += " in " + frames[i];
    ++shown;
  }
  return text;
}

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::read: return "read";
    case Kind::write: return "write";
    case Kind::ldmatrix_read: return "ldmatrix read";
    case Kind::cp_async_write: return "cp.async write";
    case Kind::tma_write: return "TMA write";
    case Kind::wgmma_read: return "wgmma read";
  }
  return "?";
}
uintptr_t pc_of(uint64_t site) { return uintptr_t(site & ((uint64_t(1) << 56) - 1)); }

std::string dim_text(unsigned linear, dim3 shape) {
  return "(" + std::to_string(linear % shape.x) + "," + std::to_string(linear / shape.x % shape.y) + "," +
         std::to_string(linear / (shape.x * shape.y)) + ")";
}

std::string index_text(uint3 i) {
  return "(" + std::to_string(i.x) + "," + std::to_string(i.y) + "," + std::to_string(i.z) + ")";
}

std::string shared_report(const BlockState& b) {
  const Hazard& h = b.hazard;
  const Kind earlier = kind_of(h.earlier_site), later = kind_of(h.later_site);
  const bool in_flight = (h.earlier & kInFlight) != 0;
  const char* what = h.missing_proxy_fence                     ? "missing fence.proxy.async"
                     : in_flight && earlier == Kind::wgmma_read ? "wgmma read in flight"
                     : in_flight && earlier == Kind::tma_write  ? "TMA write in flight"
                     : in_flight                                ? "cp.async in flight"
                     : writes(earlier) && writes(later)         ? "write after write"
                     : writes(earlier)                          ? "read after write"
                                                                : "write after read";
  const unsigned block_threads = unsigned(b.threads.size());
  auto access = [&](Stamp s, uint64_t site) {
    const unsigned thread = thread_of(s);
    const std::string epoch = " (epoch " + std::to_string(epoch_of(s) - b.first_epoch) + ")";
    if (thread >= block_threads) {  // a landed TMA write: its agent stands for the barrier
      const size_t agent = thread - block_threads;
      const std::string barrier =
          agent < b.agent_barrier.size() ? std::to_string(b.agent_barrier[agent]) : std::string("?");
      return std::string(kind_name(kind_of(site))) + " (landed, counted by the mbarrier at shared offset " + barrier +
             ") issued at " + code_location_of(pc_of(site)) + epoch;
    }
    return std::string(kind_name(kind_of(site))) + " by thread " + dim_text(thread, b.block_dim) + " at " +
           code_location_of(pc_of(site)) + epoch;
  };
  std::string text = "sim: shared-memory hazard (" + std::string(what) + ") in kernel '" +
                     b.launch->config->kernel_name + "', block " + index_text(b.index) + ", at shared byte offset " +
                     std::to_string(h.offset) + ": ";
  if (h.missing_proxy_fence) {
    return text + "generic-proxy " + access(h.earlier, h.earlier_site) + " is read by wgmma (async proxy): " +
           access(h.later, h.later_site) + ", without fence.proxy.async by the writer between its write and "
           "what orders the read after it";
  }
  text += access(h.later, h.later_site);
  if (in_flight && earlier == Kind::wgmma_read) {
    text += " touches bytes that a " + access(h.earlier, h.earlier_site) +
            " still reads (issued, not yet performed by the warpgroup's wgmma.wait_group)";
  } else if (in_flight && earlier == Kind::tma_write) {
    text += " touches bytes of a " + access(h.earlier, h.earlier_site) +
            " still in flight (issued, not yet landed: no wait on its mbarrier has seen its phase complete)";
  } else if (in_flight) {
    text += " touches bytes of a " + access(h.earlier, h.earlier_site) +
            " still in flight (issued, not yet retired by that thread's cp.async.wait_group)";
  } else if (b.vector_clocks) {
    text += " is unordered with the earlier " + access(h.earlier, h.earlier_site) +
            ": no __syncthreads, __syncwarp or mbarrier arrive -> wait orders them";
  } else {
    text += " is unordered with the earlier " + access(h.earlier, h.earlier_site) +
            ": no __syncthreads (or, within a warp, __syncwarp) lies between them";
  }
  return text;
}

std::string global_report(const BlockState& b) {
  const Hazard& h = b.hazard;
  const unsigned later_thread = unsigned(h.later >> 22) & 1023u, earlier_thread = unsigned(h.earlier >> 22) & 1023u;
  const dim3 grid = b.launch->config->grid;
  auto writer = [&](unsigned block, unsigned thread, uint64_t stamp, uint64_t site) {
    return "block " + dim_text(block, grid) + " thread " + dim_text(thread, b.block_dim) + " at " +
           code_location_of(pc_of(site)) + " (epoch " + std::to_string(stamp & 0x3FFFFFu) + ")";
  };
  return "sim: global-memory write conflict in kernel '" + std::string(b.launch->config->kernel_name) +
         "': byte " + std::to_string(h.offset) + " of buffer '" + h.buffer + "' is written by " +
         writer(unsigned(b.linear), later_thread, h.later, h.later_site) + " and by " +
         writer(h.earlier_block, earlier_thread, h.earlier, h.earlier_site) +
         " in one launch" + (h.earlier_block == b.linear ? ", with no __syncthreads between them" : "");
}

}  // namespace

std::string code_location(uintptr_t pc) { return code_location_of(pc); }

std::string describe(const BlockState& b) {
  switch (b.hazard.space) {
    case Hazard::Space::none: return "";
    case Hazard::Space::shared: return shared_report(b);
    case Hazard::Space::global: return global_report(b);
    case Hazard::Space::out_of_bounds:
    case Hazard::Space::misaligned: return access_report(b);
  }
  return "";
}

}  // namespace selfattn::sim::detail::race
