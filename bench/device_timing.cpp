// Timing and ceilings. On cuda: CUDA events recorded on the context's stream around each call, so
// the times are the GPU's, not the host's; ceilings from a large cuBLAS bf16 GEMM and a
// device-to-device copy run in the same process. On the sim: wall clock around call + synchronize.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench.h"

#if SELFATTN_BENCH_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>
#endif

namespace selfattn_bench {

#if SELFATTN_BENCH_HAVE_CUDA
namespace {
void cuda_ok(cudaError_t status, const char* call) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(call) + ": " + cudaGetErrorString(status));
}
void cublas_ok(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string(call) + ": cuBLAS status " + std::to_string(int(status)));
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}
}  // namespace
#endif

struct CallTimer::Impl {
  selfattn::Context* ctx = nullptr;
  // sim: wall-clock marks
  std::vector<double> wall_ms;
  std::chrono::steady_clock::time_point started;
#if SELFATTN_BENCH_HAVE_CUDA
  // cuda: one event pair per call since the last collect; pairs are reused across collects
  std::vector<cudaEvent_t> starts, stops;
  size_t pending = 0;
#endif
};

CallTimer::CallTimer(selfattn::Context& ctx) : impl_(new Impl) { impl_->ctx = &ctx; }

CallTimer::~CallTimer() {
#if SELFATTN_BENCH_HAVE_CUDA
  for (cudaEvent_t e : impl_->starts) cudaEventDestroy(e);
  for (cudaEvent_t e : impl_->stops) cudaEventDestroy(e);
#endif
  delete impl_;
}

void CallTimer::begin() {
#if SELFATTN_BENCH_HAVE_CUDA
  if (impl_->ctx->backend() == Backend::cuda) {
    if (impl_->pending == impl_->starts.size()) {
      cudaEvent_t start, stop;
      cuda_ok(cudaEventCreate(&start), "cudaEventCreate");
      cuda_ok(cudaEventCreate(&stop), "cudaEventCreate");
      impl_->starts.push_back(start);
      impl_->stops.push_back(stop);
    }
    cuda_ok(cudaEventRecord(impl_->starts[impl_->pending], static_cast<cudaStream_t>(impl_->ctx->stream())),
            "cudaEventRecord");
    return;
  }
#endif
  impl_->started = std::chrono::steady_clock::now();
}

void CallTimer::end() {
#if SELFATTN_BENCH_HAVE_CUDA
  if (impl_->ctx->backend() == Backend::cuda) {
    cuda_ok(cudaEventRecord(impl_->stops[impl_->pending], static_cast<cudaStream_t>(impl_->ctx->stream())),
            "cudaEventRecord");
    ++impl_->pending;
    return;
  }
#endif
  impl_->ctx->synchronize();
  impl_->wall_ms.push_back(
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - impl_->started).count());
}

std::vector<double> CallTimer::collect_ms() {
  impl_->ctx->synchronize();
  std::vector<double> ms;
#if SELFATTN_BENCH_HAVE_CUDA
  if (impl_->ctx->backend() == Backend::cuda) {
    for (size_t i = 0; i < impl_->pending; ++i) {
      float elapsed = 0;
      cuda_ok(cudaEventElapsedTime(&elapsed, impl_->starts[i], impl_->stops[i]), "cudaEventElapsedTime");
      ms.push_back(elapsed);
    }
    impl_->pending = 0;
    return ms;
  }
#endif
  ms.swap(impl_->wall_ms);
  return ms;
}

size_t device_l2_bytes(selfattn::Context& ctx) {
#if SELFATTN_BENCH_HAVE_CUDA
  if (ctx.backend() == Backend::cuda) {
    int device = 0, l2 = 0;
    cuda_ok(cudaGetDevice(&device), "cudaGetDevice");
    cuda_ok(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device), "cudaDeviceGetAttribute(L2)");
    return size_t(l2);
  }
#endif
  return 0;
}

Ceilings measure_ceilings(selfattn::Context& ctx) {
  Ceilings ceilings;
#if SELFATTN_BENCH_HAVE_CUDA
  if (ctx.backend() != Backend::cuda) return ceilings;
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream());
  CallTimer timer(ctx);

  // GEMM: 8192^3 bf16 with fp32 accumulate, the shape at which cuBLAS reaches its plateau on
  // Hopper; random operands (zeros run measurably faster and would flatter the ceiling).
  constexpr int n = 8192;
  const size_t elems = size_t(n) * n;
  std::vector<uint16_t> host(elems);
  uint32_t state = 12345;
  for (uint16_t& x : host) {
    state = state * 1664525u + 1013904223u;
    // bf16 in [-1, 1): sign, exponent 126 or 125 and random mantissa bits
    x = uint16_t(((state >> 16) & 0x8000u) | (((state >> 8) & 1u) ? 0x3F00u : 0x3E80u) | ((state >> 9) & 0x7Fu));
  }
  void *a = nullptr, *b = nullptr, *c = nullptr;
  cuda_ok(cudaMalloc(&a, elems * 2), "cudaMalloc(gemm A)");
  cuda_ok(cudaMalloc(&b, elems * 2), "cudaMalloc(gemm B)");
  cuda_ok(cudaMalloc(&c, elems * 2), "cudaMalloc(gemm C)");
  cuda_ok(cudaMemcpy(a, host.data(), elems * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
  cuda_ok(cudaMemcpy(b, host.data(), elems * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
  cublasHandle_t handle = nullptr;
  cublas_ok(cublasCreate(&handle), "cublasCreate");
  cublas_ok(cublasSetStream(handle, stream), "cublasSetStream");
  const float alpha = 1, beta = 0;
  auto gemm = [&] {
    cublas_ok(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a, CUDA_R_16BF, n, b, CUDA_R_16BF, n,
                           &beta, c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              "cublasGemmEx");
  };
  for (int i = 0; i < 5; ++i) gemm();
  for (int i = 0; i < 20; ++i) {
    timer.begin();
    gemm();
    timer.end();
  }
  ceilings.gemm_tflops = 2.0 * n * n * double(n) / (median(timer.collect_ms()) * 1e-3) / 1e12;
  ceilings.gemm_shape = "8192x8192x8192 bf16, fp32 accumulate";
  cublasDestroy(handle);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);

  // Copy: 1 GiB, far past L2, so it measures HBM; counted as bytes read plus bytes written.
  const size_t bytes = size_t(1) << 30;
  void *src = nullptr, *dst = nullptr;
  cuda_ok(cudaMalloc(&src, bytes), "cudaMalloc(copy src)");
  cuda_ok(cudaMalloc(&dst, bytes), "cudaMalloc(copy dst)");
  cuda_ok(cudaMemsetAsync(src, 0x3c, bytes, stream), "cudaMemsetAsync");
  auto copy = [&] { cuda_ok(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync"); };
  for (int i = 0; i < 3; ++i) copy();
  for (int i = 0; i < 10; ++i) {
    timer.begin();
    copy();
    timer.end();
  }
  ceilings.copy_gbps = 2.0 * double(bytes) / (median(timer.collect_ms()) * 1e-3) / 1e9;
  ceilings.copy_bytes = "1 GiB device-to-device, read + write counted";
  cudaFree(src);
  cudaFree(dst);
#else
  (void)ctx;
#endif
  return ceilings;
}

}  // namespace selfattn_bench
