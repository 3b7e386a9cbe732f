// GPU-vs-sim agreement for the faults the sim reports instead of the GPU (sim/README.md): the
// planted violations of tests/sim/test_launch_resources.cpp and test_access_checks.cpp, run on the
// hardware where that is safe, so a lent GPU confirms the sim refuses what it refuses.
//   - registers: a kernel ptxas gives more than 64 registers, launched with block sizes across the
//     point where its warps no longer fit 65536: the GPU's verdict (cudaErrorLaunchOutOfResources
//     or a launch) must be sim::launch_refusal's for the registers the GPU reports;
//   - launch bounds: a kernel declared __launch_bounds__(256), launched with 256 and 288 threads:
//     the GPU refuses what sim::launch_refusal refuses for the bound;
//   - shared memory: the device's per-block opt-in limit is the one the sim holds for its
//     architecture;
//   - alignment: a misaligned 8-byte vector load faults (cudaErrorMisalignedAddress), in a child
//     process, since the fault ends the CUDA context.
// Skips without a usable GPU. bench/device-check.sh runs it with the other gpu tests.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "selfattn_sim/sim.h"

namespace {

constexpr int kAccumulators = 96;  // live across the loop: ptxas keeps them in registers

__global__ void many_registers(float* data, int rounds) {
  float acc[kAccumulators];
#pragma unroll
  for (int i = 0; i < kAccumulators; ++i) acc[i] = data[i * blockDim.x + threadIdx.x];
  for (int r = 0; r < rounds; ++r) {
#pragma unroll
    for (int i = 0; i < kAccumulators; ++i) acc[i] = fmaf(acc[i], acc[(i + 1) % kAccumulators], 1.0f);
  }
#pragma unroll
  for (int i = 0; i < kAccumulators; ++i) data[i * blockDim.x + threadIdx.x] = acc[i];
}

__global__ void __launch_bounds__(256) bounded_to_256(float* out) { out[threadIdx.x] = 1.0f; }

__global__ void load_float2(const float* data, int offset, float* out) {
  const float2 v = *reinterpret_cast<const float2*>(data + offset);
  out[threadIdx.x] = v.x + v.y;
}

std::string gpu_unusable() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) return "no usable CUDA device";
  return "";
}

std::string architecture() {
  cudaDeviceProp props{};
  cudaGetDeviceProperties(&props, 0);
  return "sm_" + std::to_string(props.major * 10 + props.minor);
}

TEST(FaultAgreementGpu, RegistersPerBlock) {
  if (const std::string why = gpu_unusable(); !why.empty()) GTEST_SKIP() << why;
  cudaFuncAttributes attributes{};
  ASSERT_EQ(cudaFuncGetAttributes(&attributes, many_registers), cudaSuccess);
  ASSERT_GT(attributes.numRegs, 64) << "the kernel must need more than 1024 threads' share of 65536";
  const std::string arch = architecture();
  float* data = nullptr;
  ASSERT_EQ(cudaMalloc(&data, size_t(kAccumulators) * 1024 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemset(data, 0, size_t(kAccumulators) * 1024 * sizeof(float)), cudaSuccess);
  int refused = 0;
  for (unsigned threads = 512; threads <= 1024; threads += 32) {
    const selfattn::sim::CompiledKernel kernel{nullptr, arch.c_str(), unsigned(attributes.numRegs),
                                               unsigned(attributes.sharedSizeBytes), 0};
    const std::string sim_refusal = selfattn::sim::launch_refusal(kernel, dim3(threads), 0);
    many_registers<<<1, threads>>>(data, 2);
    const cudaError_t launched = cudaGetLastError();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(launched == cudaErrorLaunchOutOfResources, !sim_refusal.empty())
        << threads << " threads of " << attributes.numRegs << " registers: the GPU says "
        << cudaGetErrorString(launched) << ", the sim '" << sim_refusal << "'";
    refused += !sim_refusal.empty();
  }
  EXPECT_GT(refused, 0) << "no block size crossed the register limit: the comparison tested nothing";
  cudaFree(data);
}

TEST(FaultAgreementGpu, ThreadsWithinTheLaunchBounds) {
  if (const std::string why = gpu_unusable(); !why.empty()) GTEST_SKIP() << why;
  cudaFuncAttributes attributes{};
  ASSERT_EQ(cudaFuncGetAttributes(&attributes, bounded_to_256), cudaSuccess);
  EXPECT_EQ(attributes.maxThreadsPerBlock, 256);
  const std::string arch = architecture();
  float* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, 1024 * sizeof(float)), cudaSuccess);
  for (unsigned threads : {256u, 288u}) {
    const selfattn::sim::CompiledKernel kernel{nullptr, arch.c_str(), unsigned(attributes.numRegs),
                                               unsigned(attributes.sharedSizeBytes), 0, 256};
    const std::string sim_refusal = selfattn::sim::launch_refusal(kernel, dim3(threads), 0);
    bounded_to_256<<<1, threads>>>(out);
    const cudaError_t launched = cudaGetLastError();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(launched != cudaSuccess, !sim_refusal.empty())
        << threads << " threads: the GPU says " << cudaGetErrorString(launched) << ", the sim '" << sim_refusal << "'";
  }
  cudaFree(out);
}

TEST(FaultAgreementGpu, SharedMemoryLimitPerBlock) {
  if (const std::string why = gpu_unusable(); !why.empty()) GTEST_SKIP() << why;
  cudaDeviceProp props{};
  ASSERT_EQ(cudaGetDeviceProperties(&props, 0), cudaSuccess);
  const std::string arch = architecture();
  const selfattn::sim::CompiledKernel kernel{nullptr, arch.c_str(), 32, 0, 0};
  // Code for this architecture runs on later minor versions too (sm_80 code on 8.6 and 8.9), so the
  // sim may hold it to less than this GPU's opt-in; never to more. On the GPUs whose code no other
  // part runs (8.9, 9.0) the two agree.
  EXPECT_NE(selfattn::sim::launch_refusal(kernel, dim3(128), props.sharedMemPerBlockOptin + 1), "")
      << arch << ": the sim allows more shared memory per block than the GPU's opt-in "
      << props.sharedMemPerBlockOptin;
  if (arch == "sm_89" || arch == "sm_90") {
    EXPECT_EQ(selfattn::sim::launch_refusal(kernel, dim3(128), props.sharedMemPerBlockOptin), "") << arch;
  }
}

TEST(FaultAgreementGpuDeathTest, MisalignedVectorLoadFaults) {
  if (const std::string why = gpu_unusable(); !why.empty()) GTEST_SKIP() << why;
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process: the fault ends its CUDA context
  const auto load_at = [](int offset) {
    float *data = nullptr, *out = nullptr;
    cudaMalloc(&data, 64 * sizeof(float));
    cudaMalloc(&out, 32 * sizeof(float));
    load_float2<<<1, 32>>>(data, offset, out);
    std::exit(cudaDeviceSynchronize() == cudaErrorMisalignedAddress ? 3 : 0);
  };
  EXPECT_EXIT(load_at(2), ::testing::ExitedWithCode(0), "");  // 8-byte aligned: runs
  EXPECT_EXIT(load_at(1), ::testing::ExitedWithCode(3), "");  // 4 bytes off: the GPU faults, as the sim reports
}

}  // namespace
