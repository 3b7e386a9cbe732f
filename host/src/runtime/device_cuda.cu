// The cuda backend's runtime: one device, one stream (the context's own or the user's), stream-
// ordered allocation where the device supports it, launches through cudaLaunchKernel and GEMMs
// through a lazily created cuBLAS handle bound to the stream. Every failure becomes a BackendError
// naming the call.
#include <cub/device/device_scan.cuh>
#include <cublas_v2.h>
#include <cuda.h>  // CUtensorMap and cuTensorMapEncodeTiled's types (the entry point comes from the runtime)
#include <cuda_runtime.h>

#include <cstring>
#include <mutex>
#include <map>
#include <string>

#include "kernels/registry.h"
#include "runtime/device.h"
#include "selfattn/error.h"

#ifndef SELFATTN_CUDA_BUILT_FOR
#error "host/CMakeLists.txt passes SELFATTN_CUDA_BUILT_FOR: the architectures the kernels were built for, in words"
#endif

namespace selfattn::detail {
namespace {

void check(cudaError_t status, const std::string& call) {
  if (status != cudaSuccess) {
    throw BackendError(call + ": " + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")");
  }
}

void check(cublasStatus_t status, const std::string& call) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw BackendError(call + ": " + cublasGetStatusName(status) + " (" + cublasGetStatusString(status) + ")");
  }
}

cudaDataType_t cuda_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return CUDA_R_32F;
    case DType::f16: return CUDA_R_16F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::b8: break;  // never a GEMM operand
  }
  throw InvalidArgument("gemm dtype: expected f32, f16 or bf16");
}

// Makes `ordinal` the calling thread's current device for one call and restores the caller's
// afterwards, so the library never changes which device the application's own CUDA code uses.
class CurrentDevice {
 public:
  explicit CurrentDevice(int ordinal) {
    int current = 0;
    check(cudaGetDevice(&current), "cudaGetDevice");
    if (current == ordinal) return;
    check(cudaSetDevice(ordinal), "cudaSetDevice(" + std::to_string(ordinal) + ")");
    previous_ = current;
  }
  ~CurrentDevice() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  int previous_ = -1;  // -1: nothing to restore
};

// The largest dynamic shared memory a kernel may ask for without opting in.
constexpr size_t kDefaultDynamicSmemLimit = 48 * 1024;

class CudaDevice final : public Device {
 public:
  CudaDevice(int ordinal, cudaStream_t user_stream) : ordinal_(ordinal) {
    const CurrentDevice current(ordinal_);
    cudaDeviceProp properties{};
    check(cudaGetDeviceProperties(&properties, ordinal_), "cudaGetDeviceProperties");
    name_ = properties.name;
    int pools = 0;
    check(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, ordinal_),
          "cudaDeviceGetAttribute(cudaDevAttrMemoryPoolsSupported)");
    stream_ordered_allocation_ = pools != 0;
    check(cudaDeviceGetAttribute(&multiprocessors_, cudaDevAttrMultiProcessorCount, ordinal_),
          "cudaDeviceGetAttribute(cudaDevAttrMultiProcessorCount)");
    compute_capability_ = properties.major * 10 + properties.minor;
    if (user_stream) {
      stream_ = user_stream;
    } else {
      check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
      owns_stream_ = true;
    }
  }

  ~CudaDevice() override {
    int previous = -1;
    cudaGetDevice(&previous);
    cudaSetDevice(ordinal_);
    cudaStreamSynchronize(stream_);
    if (cublas_) cublasDestroy(cublas_);
    if (owns_stream_) cudaStreamDestroy(stream_);
    if (previous >= 0) cudaSetDevice(previous);
  }

  Backend backend() const override { return Backend::cuda; }
  int multiprocessor_count() const override { return multiprocessors_; }
  int compute_capability() const override { return compute_capability_; }

  std::string encode_tma_tiled(kernels::TmaDescriptor* out, const kernels::TmaTiledSpec& spec) override {
    static_assert(sizeof(CUtensorMap) == sizeof(kernels::TmaDescriptor), "CUtensorMap is 128 bytes");
    const std::string problem = kernels::tma_spec_problem(spec);
    if (!problem.empty()) return problem;
    using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                     const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                     CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
    static EncodeTiled encode = [] {
      void* entry = nullptr;
      cudaDriverEntryPointQueryResult found{};
      // Versioned lookup: the signature of CUDA 12.0's cuTensorMapEncodeTiled, whatever the driver.
      if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &entry, 12000, cudaEnableDefault, &found) !=
              cudaSuccess ||
          found != cudaDriverEntryPointSuccess) {
        cudaGetLastError();
        entry = nullptr;
      }
      return reinterpret_cast<EncodeTiled>(entry);
    }();
    if (encode == nullptr) return "the driver has no cuTensorMapEncodeTiled";
    const CUtensorMapDataType type = spec.element_bytes == 1   ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                     : spec.element_bytes == 2 ? CU_TENSOR_MAP_DATA_TYPE_UINT16
                                     : spec.element_bytes == 4 ? CU_TENSOR_MAP_DATA_TYPE_UINT32
                                                               : CU_TENSOR_MAP_DATA_TYPE_UINT64;
    const CUtensorMapSwizzle swizzle = spec.swizzle == kernels::TmaSwizzle::b128  ? CU_TENSOR_MAP_SWIZZLE_128B
                                       : spec.swizzle == kernels::TmaSwizzle::b64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                       : spec.swizzle == kernels::TmaSwizzle::b32 ? CU_TENSOR_MAP_SWIZZLE_32B
                                                                                  : CU_TENSOR_MAP_SWIZZLE_NONE;
    cuuint64_t dims[5], strides[4];
    cuuint32_t box[5], element_strides[5];
    for (int i = 0; i < spec.rank; ++i) {
      dims[i] = spec.dims[i];
      box[i] = spec.box[i];
      element_strides[i] = 1;
      if (i > 0) strides[i - 1] = spec.strides_bytes[i];
    }
    CUtensorMap map;
    const CUresult status = encode(&map, type, cuuint32_t(spec.rank), const_cast<void*>(spec.base), dims, strides, box,
                                   element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                                   CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (status != CUDA_SUCCESS) return "cuTensorMapEncodeTiled failed (CUresult " + std::to_string(int(status)) + ")";
    std::memcpy(out->bytes, &map, sizeof map);
    return "";
  }
  std::string name() const override { return name_; }
  void* stream() const override { return stream_; }

  void* allocate(size_t bytes, const char* label) override {
    if (bytes == 0) return nullptr;
    const CurrentDevice current(ordinal_);
    void* ptr = nullptr;
    const std::string what = std::string("(") + std::to_string(bytes) + " bytes for '" + label + "')";
    if (stream_ordered_allocation_) {
      check(cudaMallocAsync(&ptr, bytes, stream_), "cudaMallocAsync" + what);
    } else {
      check(cudaMalloc(&ptr, bytes), "cudaMalloc" + what);
    }
    return ptr;
  }

  void deallocate(void* ptr) noexcept override {
    if (ptr == nullptr) return;
    int previous = -1;
    cudaGetDevice(&previous);
    if (previous != ordinal_) cudaSetDevice(ordinal_);
    if (stream_ordered_allocation_) {
      cudaFreeAsync(ptr, stream_);
    } else {
      cudaFree(ptr);
    }
    if (previous >= 0 && previous != ordinal_) cudaSetDevice(previous);
  }

  void copy(void* dst, const void* src, size_t bytes, bool async) override {
    if (bytes == 0) return;
    const CurrentDevice current(ordinal_);
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_), "cudaMemcpyAsync");
    if (!async) check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (after cudaMemcpyAsync)");
  }

  void fill(void* dst, unsigned char byte, size_t bytes) override {
    if (bytes == 0) return;
    const CurrentDevice current(ordinal_);
    check(cudaMemsetAsync(dst, byte, bytes, stream_), "cudaMemsetAsync");
  }

  void synchronize() override {
    const CurrentDevice current(ordinal_);
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  void launch(const kernels::KernelRef& kernel, const kernels::LaunchShape& shape, const void* params) override {
    const std::string name = kernel.name ? kernel.name : "kernel";
    if (kernel.device_entry == nullptr) {
      throw NotAvailable("cuda launch: kernel '" + name + "' has no device build (a sim_target KernelRef given to the cuda backend?)");
    }
    const CurrentDevice current(ordinal_);
    if (shape.dynamic_smem_bytes > kDefaultDynamicSmemLimit) opt_in_shared_memory(kernel, shape.dynamic_smem_bytes);
    void* args[] = {const_cast<void*>(params)};
    check(cudaLaunchKernel(kernel.device_entry, shape.grid, shape.block, args, shape.dynamic_smem_bytes, stream_),
          "cudaLaunchKernel(" + name + ")");
  }

  size_t scan_scratch_bytes(int count) override {
    size_t bytes = 0;
    check(cub::DeviceScan::InclusiveSum(nullptr, bytes, static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
                                        count, stream_),
          "cub::DeviceScan::InclusiveSum (scratch size)");
    return bytes;
  }

  void inclusive_sum_int32(const int32_t* in, int32_t* out, int count, void* scratch, size_t scratch_bytes) override {
    if (count == 0) return;
    const CurrentDevice current(ordinal_);
    check(cub::DeviceScan::InclusiveSum(scratch, scratch_bytes, in, out, count, stream_), "cub::DeviceScan::InclusiveSum");
  }

  void gemm_strided_batched(const GemmBatch& g) override {
    const CurrentDevice current(ordinal_);
    cublasHandle_t handle = cublas();
    // Tensor cores for f16/bf16 inputs; fp32 inputs stay true fp32 (no TF32 rounding).
    check(cublasGemmStridedBatchedEx(handle, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                     g.m, g.n, g.k, &g.alpha, g.a, cuda_type(g.a_type), int(g.lda), g.stride_a, g.b,
                                     cuda_type(g.b_type), int(g.ldb), g.stride_b, &g.beta, g.c, cuda_type(g.c_type),
                                     int(g.ldc), g.stride_c, g.batch_count, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmStridedBatchedEx");
  }

 private:
  cublasHandle_t cublas() {
    if (!cublas_) {
      check(cublasCreate(&cublas_), "cublasCreate");
      check(cublasSetStream(cublas_, stream_), "cublasSetStream");
      check(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
    }
    return cublas_;
  }

  void opt_in_shared_memory(const kernels::KernelRef& kernel, size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    // The attribute is per kernel and sticky: set it once per kernel, raising it when a launch needs more.
    size_t& opted_in = smem_opted_in_[kernel.device_entry];
    if (opted_in >= bytes) return;
    check(cudaFuncSetAttribute(kernel.device_entry, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)),
          std::string("cudaFuncSetAttribute(") + (kernel.name ? kernel.name : "kernel") +
              ", MaxDynamicSharedMemorySize, " + std::to_string(bytes) + ")");
    opted_in = bytes;
  }

  int ordinal_ = 0;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  bool owns_stream_ = false;
  bool stream_ordered_allocation_ = false;
  int compute_capability_ = 0;  // major * 10 + minor
  int multiprocessors_ = 1;  // cudaDevAttrMultiProcessorCount
  cublasHandle_t cublas_ = nullptr;
  std::mutex mutex_;
  std::map<const void*, size_t> smem_opted_in_;  // kernel entry -> dynamic shared memory bytes allowed
};

// Why this build cannot run on device `ordinal`, or "" when it can. A GPU of a compute capability
// the kernels were not built for (no sm_XY code it can run, no PTX it can compile) would fail every
// launch; asking the runtime for the attributes of one of the library's own kernels finds that out
// without launching anything. Every instance besides the Hopper ones (which the host picks only on
// 9.0, and which exist whenever sm_90 code does) is built for the same architectures.
std::string missing_kernel_image(int ordinal) {
  const CurrentDevice current(ordinal);
  cudaFuncAttributes attributes{};
  const cudaError_t status = cudaFuncGetAttributes(&attributes, kernels::cuda_target::fill_kernel_ref().device_entry);
  if (status == cudaSuccess) return "";
  cudaGetLastError();  // not sticky: clear it so a later cudaGetLastError() does not report it again
  if (status != cudaErrorNoKernelImageForDevice && status != cudaErrorInvalidDeviceFunction &&
      status != cudaErrorUnsupportedPtxVersion) {
    check(status, "cudaFuncGetAttributes(fill_kernel)");  // another failure: BackendError, named
  }
  cudaDeviceProp properties{};
  check(cudaGetDeviceProperties(&properties, ordinal), "cudaGetDeviceProperties");
  const int gpu = properties.major * 10 + properties.minor;
  std::string reason = "cuda backend: device " + std::to_string(ordinal) + " (" + properties.name +
                       ") has compute capability " + std::to_string(properties.major) + "." +
                       std::to_string(properties.minor) + ", and this build of selfattn has no kernel image it can run: "
                       "its kernels were built for " SELFATTN_CUDA_BUILT_FOR " (cudaFuncGetAttributes(fill_kernel): " +
                       cudaGetErrorName(status) + "). ";
  if (gpu < 80) {
    reason += "The kernels need compute capability 8.0 or newer (mma.sync on bf16); the sim backend runs anywhere";
  } else if (status == cudaErrorUnsupportedPtxVersion) {
    reason += "The driver is older than the toolkit that made the PTX: update the driver, or rebuild with "
              "-DCMAKE_CUDA_ARCHITECTURES=" + std::to_string(gpu);
  } else {
    reason += "Rebuild with -DCMAKE_CUDA_ARCHITECTURES=" + std::to_string(gpu) +
              " (or configure where this GPU is visible: the build is then made for it)";
  }
  return reason;
}

}  // namespace

// For Context's automatic choice (context.cpp): such a GPU is refused rather than passed over for the sim.
bool cuda_device_lacks_kernel_image(int ordinal) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  if (ordinal < 0 || ordinal >= count) return false;
  try {
    return !missing_kernel_image(ordinal).empty();
  } catch (const BackendError&) {
    return false;  // a device that cannot be asked is unusable for other reasons
  }
}

std::shared_ptr<Device> make_cuda_device(int ordinal, void* stream) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();  // so a later cudaGetLastError() does not report this failure again
    throw NotAvailable(std::string("cuda backend: no usable GPU: cudaGetDeviceCount failed: ") +
                       cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")");
  }
  if (count == 0) throw NotAvailable("cuda backend: no usable GPU: cudaGetDeviceCount found 0 devices");
  if (ordinal < 0 || ordinal >= count) {
    throw NotAvailable("cuda backend: ContextOptions::device expected in [0, " + std::to_string(count) + "), got " +
                       std::to_string(ordinal));
  }
  try {
    const std::string missing = missing_kernel_image(ordinal);
    if (!missing.empty()) throw NotAvailable(missing);
    return std::make_shared<CudaDevice>(ordinal, static_cast<cudaStream_t>(stream));
  } catch (const BackendError& e) {
    // A device that exists but cannot be set up (prohibited compute mode, out of memory...) is not usable.
    throw NotAvailable("cuda backend: device " + std::to_string(ordinal) + " is not usable: " + e.what());
  }
}

}  // namespace selfattn::detail
