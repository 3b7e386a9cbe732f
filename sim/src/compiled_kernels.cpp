// What ptxas gave each compiled kernel (sim.h, CompiledKernel), and the launch checks a GPU makes
// with it: a launch the GPU would refuse ("too many resources requested for launch") is refused
// here, with the kernel's name and the numbers, though the sim itself needs no registers.
//
// The table is keyed by the kernel's demangled name with the target namespace left out, the one
// name both builds of a kernel template share: ptxas reports the cuda_target build's mangled name;
// a sim launch carries a type name whose demangling holds the sim_target function (launch.h).
#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "compiled_kernels.h"
#include "selfattn_sim/sim.h"

namespace selfattn::sim {

namespace {

struct Record {
  std::string arch;
  unsigned registers, static_smem, stack_frame, max_threads;
};

std::mutex& table_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, std::vector<Record>>& table() {
  static std::map<std::string, std::vector<Record>> records;
  return records;
}
// compiled_kernel_name of each LaunchConfig::kernel_key seen (static type names: stable addresses).
std::map<const char*, std::string>& names_of_keys() {
  static std::map<const char*, std::string> names;
  return names;
}

void erase_all(std::string& text, const std::string& part) {
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at)) text.erase(at, part.size());
}

// The most registers one block may hold (every architecture since compute capability 5.0), and the
// unit a warp's registers are allocated in (CUDA C Programming Guide, "Technical Specifications
// per Compute Capability": register allocation unit size 256, warp granularity).
constexpr uint64_t kRegistersPerSm = 65536;
constexpr uint64_t kRegisterUnit = 256;

// Shared memory a block may have (static + dynamic, with the opt-in), per compute capability (CUDA
// C++ Programming Guide, "Technical Specifications per Compute Capability").
struct SharedMemoryPerBlock {
  int compute_capability;
  uint64_t bytes;
};
constexpr SharedMemoryPerBlock kSharedMemoryPerBlock[] = {
    {75, 64 * 1024},                                                           // Turing
    {80, 163 * 1024}, {86, 99 * 1024}, {87, 163 * 1024}, {89, 99 * 1024},     // A100; RTX 30, A10; Orin; RTX 40, L4, L40S
    {90, 227 * 1024},                                                          // H100, H200
    {100, 227 * 1024}, {103, 227 * 1024}, {120, 99 * 1024}, {121, 99 * 1024},  // B200, B300; RTX 50, DGX Spark
};

// The limit code built for `arch` must keep: the smallest among the GPUs that run it. A cubin for
// sm_XY runs on every X.Z with Z >= Y, so the default build's sm_80 code, which an A100 runs with
// 163 KB, runs on an RTX 4090 or L40S (8.9) with 99 KB too.
uint64_t shared_memory_limit(const std::string& arch) {
  const int built_for = std::atoi(arch.substr(arch.find('_') + 1).c_str());  // "sm_90a" -> 90
  uint64_t limit = 0;
  for (const SharedMemoryPerBlock& gpu : kSharedMemoryPerBlock) {
    const bool runs_it = gpu.compute_capability / 10 == built_for / 10 && gpu.compute_capability >= built_for;
    if (runs_it) limit = limit == 0 ? gpu.bytes : std::min(limit, gpu.bytes);
  }
  return limit != 0 ? limit : 227 * 1024;  // an architecture newer than the table
}

std::string name_of_key(const char* key) {
  std::lock_guard<std::mutex> lock(table_mutex());
  auto it = names_of_keys().find(key);
  if (it == names_of_keys().end()) it = names_of_keys().emplace(key, compiled_kernel_name(key)).first;
  return it->second;
}

std::vector<Record> records_of(const char* key) {
  if (key == nullptr) return {};
  const std::string name = name_of_key(key);
  std::lock_guard<std::mutex> lock(table_mutex());
  auto it = table().find(name);
  return it == table().end() ? std::vector<Record>{} : it->second;
}

}  // namespace

std::string compiled_kernel_name(const char* mangled) {
  if (mangled == nullptr) return "";
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  if (demangled == nullptr) return "";
  std::string name = demangled;
  std::free(demangled);
  // A launch's key demangles to "std::integral_constant<void (*)(P), &(void f<...>(P))>" (a
  // template) or "std::integral_constant<void (*)(P), &f>"; ptxas's name to "void f<...>(P)" or
  // "f(P)". What they share: the qualified name with its template arguments.
  if (name.rfind("std::integral_constant<", 0) == 0) {
    const size_t function = name.find(", &");
    if (function == std::string::npos || name.back() != '>') return "";
    name = name.substr(function + 3, name.size() - function - 4);
    if (name.size() >= 2 && name.front() == '(' && name.back() == ')') name = name.substr(1, name.size() - 2);
  }
  if (name.rfind("void ", 0) == 0) name.erase(0, 5);  // a template's return type
  if (!name.empty() && name.back() == ')') {  // its parameter list: from the '(' that matches the last ')'
    int depth = 0;
    for (size_t i = name.size(); i-- > 0;) {
      depth += name[i] == ')' ? 1 : name[i] == '(' ? -1 : 0;
      if (depth == 0) {
        name.resize(i);
        break;
      }
    }
  }
  erase_all(name, "sim_target::");
  erase_all(name, "cuda_target::");
  return name;
}

void register_compiled_kernels(const CompiledKernel* kernels, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    const CompiledKernel& k = kernels[i];
    const std::string name = compiled_kernel_name(k.mangled_name);
    if (name.empty() || k.arch == nullptr) continue;
    std::lock_guard<std::mutex> lock(table_mutex());
    std::vector<Record>& records = table()[name];
    Record record{k.arch, k.registers, k.static_smem, k.stack_frame, k.max_threads};
    bool replaced = false;
    for (Record& r : records) {
      if (r.arch == record.arch) r = record, replaced = true;
    }
    if (!replaced) records.push_back(record);
  }
}

std::string compiled_kernel_architectures(const char* kernel_key) {
  std::string archs;
  for (const Record& r : records_of(kernel_key)) archs += (archs.empty() ? "" : " ") + r.arch;
  return archs;
}

unsigned compiled_kernel_max_threads(const char* kernel_key) {
  unsigned max_threads = 0;
  for (const Record& r : records_of(kernel_key)) max_threads = std::max(max_threads, r.max_threads);
  return max_threads;
}

std::string launch_refusal(const CompiledKernel& k, dim3 block, size_t dynamic_smem_bytes) {
  const std::string arch = k.arch ? k.arch : "?";
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;
  // ptxas fits the code to __launch_bounds__'s thread count (its registers among them); the
  // hardware refuses a larger block.
  if (k.max_threads != 0 && threads > k.max_threads) {
    return std::to_string(threads) + " threads per block, more than the " + std::to_string(k.max_threads) +
           " of its __launch_bounds__";
  }
  const uint64_t warps = (threads + 31) / 32;
  const uint64_t per_warp = (uint64_t(k.registers) * 32 + kRegisterUnit - 1) / kRegisterUnit * kRegisterUnit;
  if (per_warp * warps > kRegistersPerSm) {
    return std::to_string(k.registers) + " registers per thread (" + std::to_string(per_warp) +
           " per warp, allocated in units of " + std::to_string(kRegisterUnit) + ") x " + std::to_string(warps) +
           " warps = " + std::to_string(per_warp * warps) + " registers, more than the " +
           std::to_string(kRegistersPerSm) + " of an SM";
  }
  if (uint64_t(k.static_smem) + dynamic_smem_bytes > shared_memory_limit(arch)) {
    return std::to_string(k.static_smem) + " bytes of static and " + std::to_string(dynamic_smem_bytes) +
           " of dynamic shared memory, more than the " + std::to_string(shared_memory_limit(arch)) +
           " a block may have on " + arch;
  }
  return "";
}

namespace detail {

void check_compiled_resources(const LaunchConfig& c) {
  for (const Record& r : records_of(c.kernel_key)) {
    const CompiledKernel kernel{nullptr, r.arch.c_str(), r.registers, r.static_smem, r.stack_frame, r.max_threads};
    const std::string refusal = launch_refusal(kernel, c.block, c.dynamic_smem_bytes);
    if (!refusal.empty()) {
      throw Error("sim: too many resources requested for launch of kernel '" + std::string(c.kernel_name) + "' (" +
                  r.arch + ", as ptxas built it): " + refusal);
    }
  }
}

unsigned compiled_registers(const char* key) {
  unsigned registers = 0;
  for (const Record& r : records_of(key)) registers = std::max(registers, r.registers);
  return registers;
}

}  // namespace detail

}  // namespace selfattn::sim
