// The runtime on the sim: the fill kernel launched through Device::launch end to end
// (registry -> KernelRef -> sim::launch), and launch errors reported as the library's errors.
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/context_state.h"
#include "registry.h"
#include "selfattn/selfattn.h"
#include "selfattn_sim/sim.h"

namespace selfattn {
namespace {

TEST(SimRuntime, FillKernelWritesEveryElement) {
  Context ctx(Backend::sim);
  const kernels::KernelRef fill = kernels::sim_target::fill_kernel_ref();
  ASSERT_TRUE(fill);
  ASSERT_NE(fill.sim_entry, nullptr);
  // Odd counts with grids smaller and larger than the count (the kernel is grid-stride).
  for (int64_t count : {1, 7, 113, 1000}) {
    for (unsigned grid : {1u, 3u, 40u}) {
      DeviceBuffer<float> buffer(ctx, size_t(count));
      buffer.copy_from_host(std::vector<float>(size_t(count), NAN));
      const kernels::FillParams params{buffer.data(), count, 0.5f};
      ctx.state().device->launch(fill, kernels::LaunchShape{dim3(grid), dim3(32), 0}, &params);
      ctx.synchronize();
      const std::vector<float> host = buffer.to_host();
      for (int64_t i = 0; i < count; ++i) ASSERT_EQ(host[size_t(i)], 0.5f + float(i)) << count << " " << grid << " " << i;
    }
  }
}

// The sim checks each launch against what ptxas gave the kernel (sim/README.md, "Launch resources"):
// that holds only if the sim build of every shipped kernel finds the record of its cuda build. One
// kernel of each family and kind of instance (templated on element, on traits, on a head dim).
TEST(SimRuntime, ShippedKernelsFindWhatPtxasGaveTheirCudaBuild) {
  namespace k = kernels::sim_target;
  using kernels::Element;
  std::vector<std::pair<const char*, kernels::KernelRef>> refs = {
      {"fill", k::fill_kernel_ref()},
      {"lse_without_keys", k::lse_without_keys_kernel_ref()},
      {"gemm_key_repair", k::gemm_key_repair_kernel_ref()},
      {"running_max_offsets", k::running_max_offsets_kernel_ref()},
      {"qk_tiled bf16 64", k::qk_tiled_instance(Element::bf16, 64).kernel},
      {"pv_tiled f32 7", k::pv_tiled_instance(Element::f32, 7).kernel},
      {"softmax_rows f32", k::softmax_rows_instance(Element::f32, 1000).kernel},
      {"flash_fwd bf16 128", k::flash_fwd_instance<Element::bf16, 128>().kernel},
      {"flash_fwd f16 32", k::flash_fwd_instance<Element::f16, 32>().kernel},
      {"flash_fwd_simt f32 113", k::flash_fwd_simt_instance(Element::f32, 113).kernel},
      {"kv_append bf16", k::kv_append_instance(Element::bf16).kernel},
      {"decode_split_kv f16 128", k::decode_split_kv_instance(Element::f16, 128, 128).kernel},
      {"decode_split_kv_mma bf16 64", k::decode_split_kv_mma_instance(Element::bf16, 64).kernel},
      {"decode_combine f32", k::decode_combine_instance(Element::f32).kernel},
      {"merge_states bf16", k::merge_states_instance(Element::bf16).kernel},
      {"backward_dot f16", k::backward_dot_instance(Element::f16).kernel},
      {"sink_gradient", k::sink_gradient_instance().kernel},
  };
  if (SELFATTN_TEST_HOPPER_KERNELS) {
    refs.push_back({"flash_fwd_hopper bf16 128", k::flash_fwd_hopper_instance<Element::bf16, 128, 128>().kernel});
  }
  for (const auto& [what, ref] : refs) {
    ASSERT_TRUE(ref) << what;
    ASSERT_NE(ref.compiled_key, nullptr) << what;
    const std::string archs = sim::compiled_kernel_architectures(ref.compiled_key);
    if (SELFATTN_TEST_CUDA_KERNELS) {
      EXPECT_FALSE(archs.empty()) << what << " (" << sim::compiled_kernel_name(ref.compiled_key)
                                  << ") has no ptxas record: its launches are not checked";
      // The kernels declared without __launch_bounds__ (1024 threads: the hardware's own bound).
      const std::string name = what;
      const bool unbounded = name == "fill" || name == "lse_without_keys" || name == "gemm_key_repair" ||
                             name == "running_max_offsets";
      const unsigned max_threads = sim::compiled_kernel_max_threads(ref.compiled_key);
      if (unbounded) {
        EXPECT_EQ(max_threads, 0u) << what;
      } else {
        EXPECT_GE(max_threads, 32u) << what << ": its __launch_bounds__ was not read from the PTX";
        EXPECT_LE(max_threads, 1024u) << what;
      }
    } else {
      EXPECT_EQ(archs, "") << what << ": a build without nvcc records nothing";
    }
  }
}

TEST(SimRuntime, KernelWithoutSimBuildIsNotAvailable) {
  Context ctx(Backend::sim);
  kernels::KernelRef device_only = kernels::sim_target::fill_kernel_ref();
  device_only.sim_entry = nullptr;
  const kernels::FillParams params{nullptr, 0, 0};
  EXPECT_THROW(ctx.state().device->launch(device_only, kernels::LaunchShape{dim3(1), dim3(1), 0}, &params), NotAvailable);
}

TEST(SimRuntime, SimFailuresBecomeBackendErrors) {
  // Writing past the end of an allocation lands in its guard zone; the sim reports it after the launch.
  Context ctx(Backend::sim);
  DeviceBuffer<float> buffer(ctx, 4, "guarded");
  const kernels::FillParams params{buffer.data(), 5, 0};
  try {
    ctx.state().device->launch(kernels::sim_target::fill_kernel_ref(), kernels::LaunchShape{dim3(1), dim3(8), 0}, &params);
    FAIL() << "a write past the end was not reported";
  } catch (const BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("fill_kernel"), std::string::npos) << e.what();
  }
}

TEST(SimRuntime, HostSideOverrunsAreBlamedOnTheirCall) {
  // Copies and fills write device memory outside any launch; an overrun is reported by that call,
  // naming the buffer, not by whichever launch happens to come next.
  Context ctx(Backend::sim);
  DeviceBuffer<float> buffer(ctx, 4, "short");
  const std::vector<float> five(5, 1.0f);
  detail::Device& device = *ctx.state().device;
  for (const char* call : {"copy", "fill"}) {
    try {
      if (std::string(call) == "copy") {
        device.copy(buffer.data(), five.data(), five.size() * sizeof(float), false);
      } else {
        device.fill(buffer.data(), 0, five.size() * sizeof(float));
      }
      FAIL() << call << ": a write past the end was not reported";
    } catch (const BackendError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(call), std::string::npos) << message;
      EXPECT_NE(message.find("short"), std::string::npos) << message;
    }
  }
}

}  // namespace
}  // namespace selfattn
