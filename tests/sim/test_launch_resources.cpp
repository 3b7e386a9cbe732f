// Launches a GPU would refuse for what ptxas gave the kernel (sim.h, CompiledKernel): each test
// records a ptxas report for its kernel, as the build does for the library's (kernels/CMakeLists.txt),
// and launches it once within and once beyond the limits.
#include <gtest/gtest.h>

#include <string>
#include <type_traits>
#include <typeinfo>

#include "common/compat.h"
#include "sim_test_hopper.h"
#include "sim_test_launch.h"

namespace sim = selfattn::sim;
using sim::testing::error_of;
using sim::testing::launch;

namespace {

struct Params {
  int* out;  // host memory
};

template <int Variant>  // one kernel per test: each records its own ptxas report
__global__ void recorded_kernel(const Params p) {
  if (threadIdx.x == 0 && blockIdx.x == 0) p.out[0] = Variant;
}

template <int Variant>
const char* key_of() {
  return typeid(std::integral_constant<void (*)(Params), recorded_kernel<Variant>>).name();
}

template <int Variant>
void record(const char* arch, unsigned registers, unsigned static_smem, unsigned max_threads = 0) {
  const sim::CompiledKernel kernel{key_of<Variant>(), arch, registers, static_smem, 0, max_threads};
  sim::register_compiled_kernels(&kernel, 1);
}

template <int Variant>
std::string run(unsigned threads, size_t dynamic_smem = 0) {
  int out = 0;
  return error_of([&] {
    launch<Params, recorded_kernel<Variant>>("recorded_kernel", dim3(2), dim3(threads), {&out}, dynamic_smem);
  });
}

TEST(SimLaunchResources, TheKernelNameBothBuildsShare) {
  // The cuda build's mangled name (as ptxas reports it) and a sim launch's key name one kernel.
  EXPECT_EQ(sim::compiled_kernel_name(
                "_ZN8selfattn7kernels11cuda_target19merge_states_kernelI6__halfEEvNS0_17MergeStatesParamsE"),
            "selfattn::kernels::merge_states_kernel<__half>");
  EXPECT_EQ(sim::compiled_kernel_name("_ZN8selfattn7kernels11cuda_target11fill_kernelENS0_10FillParamsE"),
            "selfattn::kernels::fill_kernel");  // not a template
  EXPECT_EQ(sim::compiled_kernel_name(key_of<0>()), "(anonymous namespace)::recorded_kernel<0>");
  EXPECT_EQ(sim::compiled_kernel_name("not a mangled name"), "");
}

TEST(SimLaunchResources, RegistersAreAllocatedPerWarpInUnitsOf256) {
  record<1>("sm_90a", 66, 0);
  // A warp takes 66 x 32 = 2112 registers, allocated as 2304: 28 warps fit in 65536, 29 do not,
  // though 66 x 928 threads = 61248 would.
  EXPECT_EQ(run<1>(896), "");
  const std::string e = run<1>(928);
  EXPECT_CONTAINS(e, "sim: too many resources requested for launch of kernel 'recorded_kernel' (sm_90a, as ptxas "
                     "built it): 66 registers per thread (2304 per warp, allocated in units of 256) x 29 warps = 66816 "
                     "registers, more than the 65536 of an SM");
}

TEST(SimLaunchResources, SharedMemoryPerArchitecture) {
  record<2>("sm_90a", 32, 48 * 1024);
  EXPECT_EQ(run<2>(128, 179 * 1024), "");  // 227 KB in all on sm_90
  EXPECT_CONTAINS(run<2>(128, 180 * 1024), "49152 bytes of static and 184320 of dynamic shared memory, more than the "
                                           "232448 a block may have on sm_90a");
  // The same kernel built as sm_80 code too, which an A100 runs with 163 KB and the 8.6 and 8.9
  // GPUs (RTX 30/40, L40S) with 99 KB: the smaller bound holds.
  record<3>("sm_80", 32, 0);
  record<3>("sm_90", 32, 0);
  EXPECT_EQ(run<3>(128, 99 * 1024), "");
  EXPECT_CONTAINS(run<3>(128, 100 * 1024), "(sm_80, as ptxas built it): 0 bytes of static and 102400 of dynamic "
                                           "shared memory, more than the 101376 a block may have on sm_80");
  record<7>("sm_120", 32, 0);  // the consumer Blackwell parts
  EXPECT_CONTAINS(run<7>(128, 100 * 1024), "more than the 101376 a block may have on sm_120");
}

TEST(SimLaunchResources, ThreadsWithinTheLaunchBounds) {
  // ptxas fitted the kernel to __launch_bounds__(256); a larger block is refused though its
  // registers would fit.
  record<5>("sm_90a", 32, 0, 256);
  EXPECT_EQ(run<5>(256), "");
  EXPECT_EQ(sim::compiled_kernel_max_threads(key_of<5>()), 256u);
  EXPECT_CONTAINS(run<5>(288), "(sm_90a, as ptxas built it): 288 threads per block, more than the 256 of its "
                               "__launch_bounds__");
  record<6>("sm_90a", 32, 0);  // no bound: the hardware's 1024
  EXPECT_EQ(run<6>(1024), "");
}

TEST(SimLaunchResources, AnUnrecordedKernelIsNotChecked) {
  EXPECT_EQ(run<4>(1024), "");  // the sim engine's own tests, or a build without nvcc
}

// ---- the register pool setmaxnreg moves within is what ptxas gave the kernel ----------------------

template <unsigned Producer, unsigned Consumer>
__global__ void split_registers(const Params) {
  const unsigned t = threadIdx.x;
  if (t % 128 != 0) return;
  if (t == 0) {
    sim::setmaxnreg(Producer, /*increase=*/false);
  } else {
    sim::setmaxnreg(Consumer, /*increase=*/true);
  }
}

TEST(SimLaunchResources, SetmaxnregMovesWhatPtxasGaveTheLaunch) {
  // 384 threads of 160 registers: a pool of 61440, which 24 + 2 x 240 (64512) exceeds; without
  // the record the sim assumes the most such a block can get, 168, and the split fits.
  using Split = std::integral_constant<void (*)(Params), split_registers<24, 240>>;
  int out = 0;
  auto run_split = [&] { launch<Params, Split::value>("split_registers", dim3(1), dim3(384), {&out}, 0); };
  EXPECT_EQ(error_of(run_split), "");
  const sim::CompiledKernel kernel{typeid(Split).name(), "sm_90a", 160, 0, 0};
  sim::register_compiled_kernels(&kernel, 1);
  const std::string e = error_of(run_split);
  EXPECT_CONTAINS(e, "wait at setmaxnreg.inc 240");
  EXPECT_CONTAINS(e, "the block's pool of 61440 (160 x 384 threads at launch)");
}

}  // namespace
