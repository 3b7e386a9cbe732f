// Checks of single accesses, on the racecheck's instrumentation (racecheck.h, on_access): what a GPU
// faults on and an x86 CPU lets pass.
//   - Out of bounds: a read or write that leaves its device buffer for the guard zones around it
//     (compute-sanitizer memcheck's "Invalid __global__ read/write"), or the block's dynamic shared
//     memory for the guard after it. Farther strays hit the mappings' no-access pages and fault
//     (crash_report.cpp names them).
//   - Misaligned: an N-byte load or store (N = 2, 4, 8, 16) of an N-byte type at an address that is
//     not a multiple of N ("misaligned address" on the GPU). The compiler calls the aligned hooks
//     only where the type promises that alignment, which is when nvcc too emits one N-byte
//     instruction; accesses it knows may be unaligned, and aggregate copies, are not checked.
// The first such access of a block fails the launch, like a race, naming the kernel, block, thread
// and source line.
#include <algorithm>
#include <cstdint>
#include <string>

#include "racecheck.h"

namespace selfattn::sim::detail::race {

const DeviceRange* range_of(ThreadState& t, uintptr_t address) {
  const DeviceRange* range = t.last_range;
  if (range != nullptr && address - range->mapped_begin < range->mapped_end - range->mapped_begin) return range;
  const std::vector<DeviceRange>& ranges = t.block->launch->ranges;
  auto it = std::upper_bound(ranges.begin(), ranges.end(), address,
                             [](uintptr_t a, const DeviceRange& r) { return a < r.mapped_begin; });
  if (it == ranges.begin()) return nullptr;
  --it;
  if (address >= it->mapped_end) return nullptr;  // between mappings: host memory
  t.last_range = &*it;
  return &*it;
}

namespace {

void found(ThreadState& t, Hazard::Space space, const DeviceRange* range, int64_t offset, size_t bytes, bool write,
           uintptr_t pc) {
  Hazard& h = t.block->hazard;
  if (h.space != Hazard::Space::none) return;  // the block's first report stands
  h.space = space;
  h.buffer = range ? range->label : nullptr;
  h.buffer_bytes = range ? range->end - range->begin : t.smem_bytes;
  h.offset = uint64_t(offset);
  h.bytes = bytes;
  h.write = write;
  h.later = t.stamp;
  h.later_site = uint64_t(pc);
}

std::string bytes_text(uint64_t n) { return std::to_string(n) + (n == 1 ? " byte" : " bytes"); }

std::string triple(unsigned x, unsigned y, unsigned z) {
  return "(" + std::to_string(x) + "," + std::to_string(y) + "," + std::to_string(z) + ")";
}

// The device buffer an access lies in, after reporting it out of bounds (then null) or misaligned.
const DeviceRange* checked_device_access(ThreadState& t, uintptr_t address, size_t bytes, bool write, uintptr_t pc,
                                         bool natural) {
  const DeviceRange* range = range_of(t, address);
  if (range == nullptr) return nullptr;
  const int64_t offset = int64_t(address - range->begin);
  if (address < range->begin || address + bytes > range->end) {
    found(t, Hazard::Space::out_of_bounds, range, offset, bytes, write, pc);
    return nullptr;
  }
  if (natural && (address & (bytes - 1)) != 0) found(t, Hazard::Space::misaligned, range, offset, bytes, write, pc);
  return range;
}

}  // namespace

void device_access(ThreadState& t, uintptr_t address, size_t bytes, bool write, uintptr_t pc, bool natural) {
  const DeviceRange* range = checked_device_access(t, address, bytes, write, pc, natural);
  if (range != nullptr && write) global_write(t, *range, address, bytes, pc);
}

void shared_fault(ThreadState& t, size_t offset, size_t bytes, bool write, uintptr_t pc) {
  const bool outside = offset + bytes > t.smem_bytes;
  found(t, outside ? Hazard::Space::out_of_bounds : Hazard::Space::misaligned, nullptr, int64_t(offset), bytes, write,
        pc);
}

std::string access_report(const BlockState& b) {
  const Hazard& h = b.hazard;
  const int64_t offset = int64_t(h.offset);
  const unsigned thread = thread_of(h.later);
  const dim3 shape = b.block_dim;
  const std::string where =
      "in kernel '" + std::string(b.launch->config->kernel_name) + "', block " +
      triple(b.index.x, b.index.y, b.index.z) +
      ", thread " + triple(thread % shape.x, thread / shape.x % shape.y, thread / (shape.x * shape.y)) + " at " +
      code_location(uintptr_t(h.later_site)) + ": ";
  const std::string access = bytes_text(h.bytes) + " " + (h.write ? "written" : "read");
  const std::string space = h.buffer ? "buffer '" + std::string(h.buffer) + "' (" + std::to_string(h.buffer_bytes) +
                                           " bytes)"
                                     : "the block's dynamic shared memory (" + std::to_string(h.buffer_bytes) +
                                           " bytes)";
  if (h.space == Hazard::Space::misaligned) {
    return "sim: misaligned address " + where + access + " at offset " + std::to_string(offset) + " of " + space +
           ", not a multiple of " + std::to_string(h.bytes) + " (a GPU faults: cudaErrorMisalignedAddress)";
  }
  std::string past;
  if (offset < 0) {
    past = bytes_text(uint64_t(-offset)) + " before its start";
  } else {
    past = bytes_text(uint64_t(offset) + h.bytes - h.buffer_bytes) + " past its end";
  }
  return "sim: out-of-bounds " + std::string(h.write ? "write" : "read") + " " + where + access + " at offset " +
         std::to_string(offset) + " of " + space + ", reaching " + past + " (a GPU faults: cudaErrorIllegalAddress)";
}

}  // namespace selfattn::sim::detail::race

void selfattn::sim::check_access(const void* address, size_t bytes, bool write, bool natural, const void* site) {
  using namespace detail::race;
  ThreadState* t = t_thread;
  if (t == nullptr || bytes == 0 || !t->checks) return;
  const uintptr_t p = reinterpret_cast<uintptr_t>(address), pc = reinterpret_cast<uintptr_t>(site);
  const uintptr_t offset = p - t->smem_begin;
  if (offset < t->smem_bytes + kSharedGuardBytes) {
    if (offset + bytes > t->smem_bytes || (natural && (p & (bytes - 1)) != 0)) {
      shared_fault(*t, offset, bytes, write, pc);
    }
  } else if (p - t->device_lowest < t->device_span) {
    checked_device_access(*t, p, bytes, write, pc, natural);
  }
}
