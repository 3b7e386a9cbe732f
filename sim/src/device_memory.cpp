// The sim's device memory: each allocation is its own mapping,
//
//   [no-access page][front guard zone][data ... ][back guard zone, to the page end + one page][no-access page]
//
// Guard zones hold a pattern that is checked after every launch and on free; the no-access pages
// turn a far stray access into a fault at the access. Mappings are reserved with MAP_NORESERVE and
// committed by the kernel page by page, so a 2^33-byte buffer written only at its end costs a page.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "crash_report.h"
#include "racecheck.h"
#include "selfattn_sim/sim.h"

namespace selfattn::sim {

namespace {

constexpr unsigned char kGuardByte = 0xDB;
constexpr size_t kGuardBytes = 4096;
// Smaller buffers start as 0xFF bytes (NaN as float and half), like stale device memory would be;
// larger ones stay lazily reserved zeros, so that reserving them costs nothing.
constexpr size_t kPoisonLimit = size_t(64) << 20;

struct Allocation {
  unsigned char* mapping;
  size_t mapping_bytes;
  size_t bytes;
  std::string label;
  std::unique_ptr<detail::race::GlobalShadow> shadow;  // the racecheck's last writer of each byte
  size_t back_guard_bytes() const { return mapping_bytes - 2 * page() - kGuardBytes - bytes; }
  static size_t page() {
    static const size_t p = size_t(sysconf(_SC_PAGESIZE));
    return p;
  }
  unsigned char* data() const { return mapping + page() + kGuardBytes; }
  unsigned char* front_guard() const { return mapping + page(); }
  unsigned char* back_guard() const { return data() + bytes; }
};

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

std::map<const void*, Allocation>& registry() {
  static std::map<const void*, Allocation> allocations;
  return allocations;
}

// Returns a description of the first damaged guard byte and restores the zones, or "" if intact.
std::string check_and_repair(const Allocation& a) {
  std::string damage;
  const unsigned char* front = a.front_guard();
  for (size_t i = 0; i < kGuardBytes; ++i) {
    if (front[i] != kGuardByte) {
      damage = "offset -" + std::to_string(kGuardBytes - i) + " (" + std::to_string(kGuardBytes - i) +
               " bytes before its start)";
      break;
    }
  }
  if (damage.empty()) {
    const unsigned char* back = a.back_guard();
    const size_t n = a.back_guard_bytes();
    for (size_t i = 0; i < n; ++i) {
      if (back[i] != kGuardByte) {
        damage = "offset " + std::to_string(a.bytes + i) + " (" + std::to_string(i) + " bytes past its end)";
        break;
      }
    }
  }
  if (!damage.empty()) {
    std::memset(a.front_guard(), kGuardByte, kGuardBytes);
    std::memset(a.back_guard(), kGuardByte, a.back_guard_bytes());
    damage = "buffer '" + a.label + "' (" + std::to_string(a.bytes) + " bytes) was written out of bounds at " + damage;
  }
  return damage;
}

}  // namespace

namespace detail {

bool describe_device_address(const void* address, char* text, size_t text_bytes) {
  std::unique_lock<std::mutex> lock(registry_mutex(), std::try_to_lock);
  if (!lock.owns_lock()) return false;
  const auto* p = static_cast<const unsigned char*>(address);
  for (const auto& [data, a] : registry()) {
    if (p < a.mapping || p >= a.mapping + a.mapping_bytes) continue;
    const unsigned char* start = a.data();
    if (p < start) {
      std::snprintf(text, text_bytes, "%zu bytes before the start of buffer '%s' (%zu bytes)", size_t(start - p),
                    a.label.c_str(), a.bytes);
    } else {
      std::snprintf(text, text_bytes, "offset %zu of buffer '%s' (%zu bytes): %zu bytes past its end",
                    size_t(p - start), a.label.c_str(), a.bytes, size_t(p - start) - a.bytes);
    }
    return true;
  }
  return false;
}

void race::device_ranges(std::vector<race::DeviceRange>& out) {
  out.clear();
  std::lock_guard<std::mutex> lock(registry_mutex());
  for (const auto& [data, a] : registry()) {  // the map is ordered by address
    const auto begin = reinterpret_cast<uintptr_t>(data);
    const auto front_guard = reinterpret_cast<uintptr_t>(a.front_guard());
    out.push_back(race::DeviceRange{begin, begin + a.bytes, front_guard,
                                    reinterpret_cast<uintptr_t>(a.back_guard()) + a.back_guard_bytes(), a.shadow.get(),
                                    a.label.c_str()});
  }
}

}  // namespace detail

void* device_alloc(size_t bytes, const char* label) {
  const size_t page = Allocation::page();
  const size_t data_and_back = (bytes + kGuardBytes + page - 1) / page * page + page;
  const size_t mapping_bytes = page + kGuardBytes + data_and_back;
  void* p = mmap(nullptr, mapping_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    throw Error("sim: cannot reserve " + std::to_string(bytes) + " bytes for '" + (label ? label : "") + "'");
  }
  Allocation a{static_cast<unsigned char*>(p), mapping_bytes, bytes, label ? label : "(unlabelled)",
               std::make_unique<detail::race::GlobalShadow>(bytes)};
  // kGuardBytes is a whole number of pages, so the data and the no-access pages are page aligned.
  mprotect(a.mapping, page, PROT_NONE);
  mprotect(a.mapping + mapping_bytes - page, page, PROT_NONE);
  std::memset(a.front_guard(), kGuardByte, kGuardBytes);
  std::memset(a.back_guard(), kGuardByte, a.back_guard_bytes());
  if (bytes <= kPoisonLimit) std::memset(a.data(), 0xFF, bytes);
  void* data = a.data();
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry().emplace(data, std::move(a));
  return data;
}

void device_free(void* ptr) {
  if (!ptr) return;
  Allocation a;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    auto it = registry().find(ptr);
    if (it == registry().end()) throw Error("sim: device_free of a pointer device_alloc did not return");
    a = std::move(it->second);
    registry().erase(it);
  }
  const std::string damage = check_and_repair(a);
  munmap(a.mapping, a.mapping_bytes);
  if (!damage.empty()) throw Error("sim: on free: " + damage);
}

void check_guards(const char* after_what) {
  std::string report;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    for (const auto& [ptr, a] : registry()) {
      const std::string damage = check_and_repair(a);
      if (!damage.empty()) report += (report.empty() ? "" : "; ") + damage;
    }
  }
  if (!report.empty()) throw Error(std::string("sim: after ") + (after_what ? after_what : "?") + ": " + report);
}

}  // namespace selfattn::sim
