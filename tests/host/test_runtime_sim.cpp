// The runtime on the sim: the fill kernel launched through Device::launch end to end
// (registry -> KernelRef -> sim::launch), and launch errors reported as the library's errors.
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "context_state.h"
#include "registry.h"
#include "selfattn/selfattn.h"

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
