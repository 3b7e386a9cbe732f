// The sim backend's runtime: device memory is host memory with guard zones (sim::device_alloc),
// launches run the kernel's sim build on the SIMT engine, GEMMs run on the CPU. Everything is
// synchronous, so "async" work is already done when the call returns.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <thread>

#include <selfattn_sim/sim.h>

#include "runtime/device.h"
#include "runtime/sim_capture_scope.h"
#include "selfattn/error.h"

namespace selfattn::detail {

namespace {
std::atomic<int> capture_scopes{0};

// Throws when a SimCaptureScope is open: `what` could not be part of a captured CUDA graph.
void refuse_during_capture(const char* what) {
  if (capture_scopes.load() > 0) {
    throw BackendError(std::string("sim: ") + what + " inside a SimCaptureScope (not allowed in CUDA graph capture)");
  }
}
}  // namespace

SimCaptureScope::SimCaptureScope() { ++capture_scopes; }
SimCaptureScope::~SimCaptureScope() { --capture_scopes; }

namespace {

class SimDevice final : public Device {
 public:
  Backend backend() const override { return Backend::sim; }
  int multiprocessor_count() const override { return kSimMultiprocessors; }
  int compute_capability() const override { return kSimComputeCapability; }
  std::string encode_tma_tiled(kernels::TmaDescriptor* out, const kernels::TmaTiledSpec& spec) override {
    return kernels::sim_encode_tma_tiled(out, spec);
  }

  std::string name() const override {
    int workers = sim::options().worker_threads;
    if (workers <= 0) workers = int(std::max(1u, std::thread::hardware_concurrency()));
    return "sim (CPU, " + std::to_string(workers) + " worker threads)";
  }

  void* stream() const override { return nullptr; }

  void* allocate(size_t bytes, const char* label) override {
    refuse_during_capture("allocate");
    if (bytes == 0) return nullptr;
    try {
      return sim::device_alloc(bytes, label);
    } catch (const std::exception& e) {
      throw BackendError(std::string("sim::device_alloc(") + std::to_string(bytes) + " bytes, '" + label +
                         "'): " + e.what());
    }
  }

  void deallocate(void* ptr) noexcept override {
    // Not refused in a SimCaptureScope (noexcept): the library frees only when the workspace grows,
    // and growing allocates, which is refused.
    if (ptr == nullptr) return;
    try {
      sim::device_free(ptr);
    } catch (...) {
      // A guard-zone violation found at free time was already reported by the launch that caused it.
    }
  }

  // Copies, fills and GEMMs write device memory from the host, outside any launch: check the guard
  // zones right after them too, so an overrun is blamed on the call that made it.
  void copy(void* dst, const void* src, size_t bytes, bool async) override {
    if (!async) refuse_during_capture("synchronous copy");
    if (bytes > 0) std::memmove(dst, src, bytes);
    check_guards_after("copy");
  }

  void fill(void* dst, unsigned char byte, size_t bytes) override {
    if (bytes > 0) std::memset(dst, byte, bytes);
    check_guards_after("fill");
  }

  void synchronize() override { refuse_during_capture("synchronize"); }

  void launch(const kernels::KernelRef& kernel, const kernels::LaunchShape& shape, const void* params) override {
    if (kernel.sim_entry == nullptr) {
      throw NotAvailable(std::string("sim launch: kernel '") + (kernel.name ? kernel.name : "?") +
                         "' has no sim build (a cuda_target KernelRef given to the sim backend?)");
    }
    const sim::LaunchConfig config{kernel.name ? kernel.name : "kernel", shape.grid, shape.block,
                                   shape.dynamic_smem_bytes, kernel.compiled_key};
    std::vector<std::string>& log = sim_launch_log();
    if (log.size() >= 256) log.erase(log.begin(), log.begin() + 128);  // bounded: tests look at the last few
    log.push_back(config.kernel_name);
    try {
      sim::launch(config, kernel.sim_entry, params);
    } catch (const sim::Error& e) {
      throw BackendError(std::string("sim::launch(") + config.kernel_name + "): " + e.what());
    }
  }

  void gemm_strided_batched(const GemmBatch& gemm) override {
    sim_gemm_strided_batched(gemm);
    check_guards_after("gemm_strided_batched");
  }

  size_t scan_scratch_bytes(int) override { return 0; }

  // Sums in int64 and stores the low 32 bits, as a 32-bit device scan wraps.
  void inclusive_sum_int32(const int32_t* in, int32_t* out, int count, void*, size_t) override {
    int64_t sum = 0;
    for (int i = 0; i < count; ++i) {
      sum += in[i];
      out[i] = int32_t(uint32_t(uint64_t(sum)));
    }
    check_guards_after("inclusive_sum_int32");
  }

 private:
  static void check_guards_after(const char* what) {
    try {
      sim::check_guards(what);
    } catch (const sim::Error& e) {
      throw BackendError(std::string("sim ") + what + ": " + e.what());
    }
  }
};

}  // namespace

std::shared_ptr<Device> make_sim_device() { return std::make_shared<SimDevice>(); }

std::vector<std::string>& sim_launch_log() {
  thread_local std::vector<std::string> log;
  return log;
}

}  // namespace selfattn::detail
