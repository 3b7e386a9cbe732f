// The cuda runtime on a real GPU: buffers, the fill kernel through cudaLaunchKernel (also with the
// dynamic shared memory opt-in above 48 KB), cuBLAS GEMMs, the user's stream. Skips, saying why,
// where no GPU is usable (support/test_main.cpp).
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/context_state.h"
#include "registry.h"
#include "selfattn/selfattn.h"

#if SELFATTN_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace selfattn {
namespace {

TEST(CudaRuntime, ContextAndBuffers) {
  Context ctx(Backend::cuda);
  EXPECT_EQ(ctx.backend(), Backend::cuda);
  EXPECT_NE(ctx.stream(), nullptr);
  std::vector<float> values(113);
  for (size_t i = 0; i < values.size(); ++i) values[i] = float(i) * 0.25f - 3;
  DeviceBuffer<float> buffer(ctx, values.size());
  buffer.copy_from_host(values);
  EXPECT_EQ(buffer.to_host(), values);
  std::vector<float> back(values.size());
  buffer.copy_from_host_async(values.data(), values.size());
  buffer.copy_to_host_async(back.data(), back.size());
  ctx.synchronize();
  EXPECT_EQ(back, values);
  EXPECT_THROW(buffer.copy_from_host(values.data(), values.size() + 1), InvalidArgument);
}

#if SELFATTN_HAVE_CUDA
// A Context refuses a GPU this build has no kernel image for (device_cuda.cu asks the runtime for
// the fill kernel's attributes). One was made above, so the build has code this GPU runs: the
// configure found it (the visible GPUs) or the architecture list covers it. The same query here, and
// what it ran: SASS for this GPU's major version (binaryVersion), or PTX the driver compiled for it.
TEST(CudaRuntime, TheBuildHasAKernelImageForThisGpu) {
  Context ctx(Backend::cuda);
  cudaFuncAttributes attributes{};
  ASSERT_EQ(cudaFuncGetAttributes(&attributes, kernels::cuda_target::fill_kernel_ref().device_entry), cudaSuccess);
  int device = 0, major = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), cudaSuccess);
  EXPECT_EQ(attributes.binaryVersion / 10, major) << "binaryVersion " << attributes.binaryVersion;
}

TEST(CudaRuntime, FillKernelThroughTheRuntime) {
  Context ctx(Backend::cuda);
  const kernels::KernelRef fill = kernels::cuda_target::fill_kernel_ref();
  ASSERT_NE(fill.device_entry, nullptr);
  for (size_t smem : {size_t(0), size_t(64 * 1024)}) {  // 64 KB needs the opt-in attribute
    DeviceBuffer<float> buffer(ctx, 1000);
    buffer.fill_bytes(0xFF);
    const kernels::FillParams params{buffer.data(), 1000, 2.0f};
    ctx.state().device->launch(fill, kernels::LaunchShape{dim3(3), dim3(128), smem}, &params);
    const std::vector<float> host = buffer.to_host();
    for (size_t i = 0; i < host.size(); ++i) ASSERT_EQ(host[i], 2.0f + float(i)) << smem << " " << i;
  }
}

TEST(CudaRuntime, LaunchErrorsNameTheCall) {
  Context ctx(Backend::cuda);
  const kernels::FillParams params{nullptr, 0, 0};
  try {
    ctx.state().device->launch(kernels::cuda_target::fill_kernel_ref(), kernels::LaunchShape{dim3(1), dim3(4096), 0}, &params);
    FAIL() << "a 4096-thread block launched";
  } catch (const BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("cudaLaunchKernel(fill_kernel)"), std::string::npos) << e.what();
  }
}

TEST(CudaRuntime, GemmStridedBatchedMatchesTheHost) {
  Context ctx(Backend::cuda);
  // Column-major C (m x n) = A^T (m x k) B (k x n), two batches.
  const int m = 7, n = 5, k = 3, batches = 2;
  std::vector<float> a(size_t(k * m * batches)), b(size_t(k * n * batches));
  for (size_t i = 0; i < a.size(); ++i) a[i] = float(int(i % 7) - 3) * 0.5f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = float(int(i % 5) - 2) * 0.25f;
  DeviceBuffer<float> da(ctx, a.size()), db(ctx, b.size()), dc(ctx, size_t(m * n * batches));
  da.copy_from_host(a);
  db.copy_from_host(b);
  detail::GemmBatch g;
  g.trans_a = true;
  g.m = m, g.n = n, g.k = k;
  g.a = da.data(), g.lda = k, g.stride_a = k * m;
  g.b = db.data(), g.ldb = k, g.stride_b = k * n;
  g.c = dc.data(), g.ldc = m, g.stride_c = m * n;
  g.batch_count = batches;
  ctx.state().device->gemm_strided_batched(g);
  const std::vector<float> c = dc.to_host();
  for (int batch = 0; batch < batches; ++batch)
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) {
        double expected = 0;
        for (int p = 0; p < k; ++p) expected += double(a[size_t(batch * k * m + i * k + p)]) * b[size_t(batch * k * n + j * k + p)];
        EXPECT_NEAR(c[size_t(batch * m * n + j * m + i)], expected, 1e-5);
      }
}

TEST(CudaRuntime, RunsOnTheUsersStream) {
  Context ctx(Backend::cuda);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  {
    ContextOptions options;
    options.backend = Backend::cuda;
    options.stream = stream;
    Context user(options);
    EXPECT_EQ(user.stream(), stream);
    DeviceBuffer<int> buffer(user, 3);
    buffer.copy_from_host(std::vector<int>{1, 2, 3});
    EXPECT_EQ(buffer.to_host(), (std::vector<int>{1, 2, 3}));
  }
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);  // the context did not destroy it
}
#endif

}  // namespace
}  // namespace selfattn
