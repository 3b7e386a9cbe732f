#pragma once
// The runtime interface: everything the library does to a device goes through one Device.
// Two implementations: cuda (device_cuda.cu: cudaMalloc, cuBLAS, real launches) and sim
// (device_sim.cpp: host memory with guard zones, the sim's SIMT engine, a CPU batched GEMM).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "selfattn/types.h"
#include "kernels/common/tma_descriptor.h"
#include "kernels/launch.h"

namespace selfattn::detail {

// One strided-batched GEMM with cuBLAS's exact conventions: column-major, C = alpha op(A) op(B) + beta C
// for each of batch_count problems, op(X) = X or X^T, fp32 compute. The sim implements the same
// conventions so the cublas path's argument logic runs on the CPU.
struct GemmBatch {
  bool trans_a = false, trans_b = false;
  int m = 0, n = 0, k = 0;
  float alpha = 1, beta = 0;
  const void* a = nullptr; DType a_type = DType::f32; int64_t lda = 0; int64_t stride_a = 0;
  const void* b = nullptr; DType b_type = DType::f32; int64_t ldb = 0; int64_t stride_b = 0;
  void* c = nullptr;       DType c_type = DType::f32; int64_t ldc = 0; int64_t stride_c = 0;
  int batch_count = 1;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual Backend backend() const = 0;
  virtual std::string name() const = 0;
  virtual void* stream() const = 0;
  // Streaming multiprocessors the device has (cuda: cudaDevAttrMultiProcessorCount, read once when
  // the Device is made, so asking never touches the driver; sim: kSimMultiprocessors). Heuristics
  // that size a grid to fill the GPU (the split-KV decode's split count) ask here.
  virtual int multiprocessor_count() const = 0;

  // major * 10 + minor (cuda: read once when the Device is made; sim: 90, the H200's, so the sim
  // runs the kernels the library would pick on the GPU it is tuned for).
  virtual int compute_capability() const = 0;
  // A TMA tensor map for `spec` (cuda: cuTensorMapEncodeTiled through the runtime's driver entry
  // point; sim: kernels::sim_encode_tma_tiled). Returns "" or why it cannot be made; writes `out`
  // only on success.
  virtual std::string encode_tma_tiled(kernels::TmaDescriptor* out, const kernels::TmaTiledSpec& spec) = 0;

  virtual void* allocate(size_t bytes, const char* label) = 0;  // throws BackendError
  virtual void deallocate(void* ptr) noexcept = 0;
  // Any direction (host<->device, device<->device); async queues on the stream.
  virtual void copy(void* dst, const void* src, size_t bytes, bool async) = 0;
  virtual void fill(void* dst, unsigned char byte, size_t bytes) = 0;  // async on the stream
  virtual void synchronize() = 0;

  virtual void launch(const kernels::KernelRef& kernel, const kernels::LaunchShape& shape, const void* params) = 0;
  virtual void gemm_strided_batched(const GemmBatch& gemm) = 0;
  // out[i] = in[0] + ... + in[i] for i < count, on the stream (cuda: CUB's DeviceScan; sim: a CPU
  // loop). scan_scratch_bytes(count) bytes of device scratch must be passed as `scratch`.
  virtual size_t scan_scratch_bytes(int count) = 0;
  virtual void inclusive_sum_int32(const int32_t* in, int32_t* out, int count, void* scratch, size_t scratch_bytes) = 0;
};

// What the sim reports as its multiprocessor count: the H200's 132, so that a heuristic plans on
// the sim as it does on the GPU the library is tuned for (the sim's own parallelism is its worker
// threads and is not what the heuristics should fill).
constexpr int kSimMultiprocessors = 132;
constexpr int kSimComputeCapability = 90;

std::shared_ptr<Device> make_sim_device();
// For tests: the names of the kernels sim devices launched on the calling OS thread, oldest first
// (the caller clears it). How a test tells which of two kernels a call ran.
std::vector<std::string>& sim_launch_log();
// The sim's GEMM (gemm_sim.cpp), used by the sim Device.
void sim_gemm_strided_batched(const GemmBatch& gemm);
// Throws NotAvailable with the reason (no CUDA in this build, no device, driver too old...).
std::shared_ptr<Device> make_cuda_device(int ordinal, void* stream);
// Whether device `ordinal` is a working GPU that this build has no kernel image for (always false
// in a build without nvcc). Context's automatic choice refuses such a GPU instead of passing it
// over for the sim.
bool cuda_device_lacks_kernel_image(int ordinal);

}  // namespace selfattn::detail
