// Context (backend choice, environment override, moves), buffers and the workspace, on the sim
// backend's memory. No kernel runs here.
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/context_state.h"
#include "selfattn/selfattn.h"
#include "test_helpers.h"

namespace selfattn {
namespace {

using host_test::ScopedBackendVariable;
using host_test::throws_with;

bool gpu_usable() {
  try {
    Context cuda(Backend::cuda);
    return true;
  } catch (const NotAvailable&) {
    return false;
  }
}

std::vector<float> random_floats(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-1, 1);
  std::vector<float> values(n);
  for (float& x : values) x = uniform(rng);
  return values;
}

// ---- Context ----

TEST(Context, SimOnRequest) {
  Context ctx(Backend::sim);
  EXPECT_EQ(ctx.backend(), Backend::sim);
  EXPECT_NE(ctx.device_name().find("sim (CPU, "), std::string::npos) << ctx.device_name();
  EXPECT_EQ(ctx.stream(), nullptr);
  ctx.synchronize();
}

TEST(Context, DefaultIsCudaWhenUsableElseSim) {
  ScopedBackendVariable unset(nullptr);
  Context ctx;
  EXPECT_EQ(ctx.backend(), gpu_usable() ? Backend::cuda : Backend::sim);
}

TEST(Context, EnvironmentVariableChoosesTheBackend) {
  ScopedBackendVariable sim("sim");
  EXPECT_EQ(Context().backend(), Backend::sim);
}

TEST(Context, OptionsOverrideTheEnvironment) {
  ScopedBackendVariable cuda("cuda");
  ContextOptions options;
  options.backend = Backend::sim;
  EXPECT_EQ(Context(options).backend(), Backend::sim);
}

TEST(Context, BadEnvironmentValueIsNamed) {
  ScopedBackendVariable bad("tpu");
  EXPECT_TRUE(throws_with<InvalidArgument>([] { Context ctx; }, {"SELFATTN_BACKEND", "tpu", "cuda", "sim"}));
}

TEST(Context, CudaWithoutGpuSaysWhy) {
  if (gpu_usable()) GTEST_SKIP() << "a GPU is usable here; this test is for machines without one";
  // The reason: no CUDA in this build, or cudaGetDeviceCount's error, or no device.
  EXPECT_TRUE(throws_with<NotAvailable>([] { Context ctx(Backend::cuda); }, {"cuda backend"}));
  ScopedBackendVariable cuda("cuda");
  EXPECT_TRUE(throws_with<NotAvailable>([] { Context ctx; }, {"cuda backend"}));
}

TEST(Context, MovesKeepTheRuntime) {
  Context a(Backend::sim);
  DeviceBuffer<float> buffer(a, 7);
  Context b(std::move(a));
  EXPECT_EQ(b.backend(), Backend::sim);
  EXPECT_THROW(a.backend(), InvalidArgument);  // NOLINT(bugprone-use-after-move): moved-from is documented
  Context c(Backend::sim);
  c = std::move(b);
  EXPECT_EQ(c.backend(), Backend::sim);
  buffer.copy_from_host(std::vector<float>(7, 1.5f));
  EXPECT_EQ(buffer.to_host(), std::vector<float>(7, 1.5f));
}

// ---- Buffers ----

TEST(Buffers, RoundTripOddSizes) {
  Context ctx(Backend::sim);
  for (size_t n : {1, 7, 113, 4096}) {
    const std::vector<float> values = random_floats(n, unsigned(n));
    DeviceBuffer<float> buffer(ctx, n);
    ASSERT_EQ(buffer.size(), n);
    ASSERT_EQ(buffer.bytes(), n * sizeof(float));
    buffer.copy_from_host(values);
    EXPECT_EQ(buffer.to_host(), values) << n;
  }
}

TEST(Buffers, PartialCopiesAtOffsets) {
  Context ctx(Backend::sim);
  DeviceBuffer<int32_t> buffer(ctx, 10);
  std::vector<int32_t> zeros(10, 0), three{7, 8, 9}, got(3);
  buffer.copy_from_host(zeros);
  buffer.copy_from_host(three.data(), 3, 5);
  buffer.copy_to_host(got.data(), 3, 4);
  EXPECT_EQ(got, (std::vector<int32_t>{0, 7, 8}));
  EXPECT_EQ(buffer.to_host(), (std::vector<int32_t>{0, 0, 0, 0, 0, 7, 8, 9, 0, 0}));
}

TEST(Buffers, AsyncCopiesCompleteBySynchronize) {
  Context ctx(Backend::sim);
  const std::vector<float> values = random_floats(113, 3);
  std::vector<float> back(113, NAN);
  DeviceBuffer<float> buffer(ctx, 113);
  buffer.copy_from_host_async(values.data(), values.size());
  buffer.copy_to_host_async(back.data(), back.size());
  ctx.synchronize();
  EXPECT_EQ(back, values);
}

TEST(Buffers, OutOfRangeCopiesThrowAndNameTheSize) {
  Context ctx(Backend::sim);
  DeviceBuffer<float> buffer(ctx, 8);
  std::vector<float> host(16, 0);
  EXPECT_TRUE(throws_with<InvalidArgument>([&] { buffer.copy_from_host(host.data(), 9); }, {"8 elements"}));
  EXPECT_TRUE(throws_with<InvalidArgument>([&] { buffer.copy_to_host(host.data(), 1, 8); }, {"8 elements"}));
  EXPECT_TRUE(throws_with<InvalidArgument>([&] { buffer.copy_from_host_async(host.data(), 2, 7); }, {"8 elements"}));
  EXPECT_TRUE(throws_with<InvalidArgument>([&] { buffer.copy_to_host(host.data(), size_t(-1), 2); }, {"8 elements"}));
  buffer.copy_to_host(host.data(), 0, 8);  // an empty copy at the end is fine
}

TEST(Buffers, MovesTransferOwnership) {
  Context ctx(Backend::sim);
  DeviceBuffer<float> a(ctx, 5);
  a.copy_from_host(std::vector<float>{1, 2, 3, 4, 5});
  float* data = a.data();
  DeviceBuffer<float> b(std::move(a));
  EXPECT_EQ(b.data(), data);
  EXPECT_EQ(b.size(), 5u);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move)
  DeviceBuffer<float> c(ctx, 3);
  c = std::move(b);
  EXPECT_EQ(c.data(), data);
  EXPECT_EQ(c.to_host(), (std::vector<float>{1, 2, 3, 4, 5}));
}

TEST(Buffers, FillBytesAndEmptyBuffers) {
  Context ctx(Backend::sim);
  DeviceBuffer<uint16_t> buffer(ctx, 9);
  buffer.fill_bytes(0x3C);
  EXPECT_EQ(buffer.to_host(), std::vector<uint16_t>(9, 0x3C3C));
  DeviceBuffer<float> empty(ctx, 0);
  EXPECT_TRUE(empty.empty());
  EXPECT_TRUE(empty.to_host().empty());
  empty.fill_bytes(0);
  DeviceBuffer<float> unset;
  EXPECT_EQ(unset.data(), nullptr);
}

TEST(Buffers, OutliveTheirContext) {
  DeviceBuffer<float> buffer;
  {
    Context ctx(Backend::sim);
    buffer = DeviceBuffer<float>(ctx, 4);
  }
  buffer.copy_from_host(std::vector<float>{4, 3, 2, 1});
  EXPECT_EQ(buffer.to_host(), (std::vector<float>{4, 3, 2, 1}));
}

// ---- Workspace ----

TEST(Workspace, GrowsThenStaysPut) {
  ContextOptions options;
  options.backend = Backend::sim;
  options.workspace_limit = 1 << 20;
  Context ctx(options);
  detail::Workspace& workspace = ctx.state().workspace;
  EXPECT_EQ(ctx.workspace_limit(), size_t(1) << 20);
  EXPECT_EQ(ctx.workspace_bytes(), 0u);
  void* first = workspace.reserve(1000, "test");
  ASSERT_NE(first, nullptr);
  EXPECT_GE(ctx.workspace_bytes(), 1000u);
  const size_t held = ctx.workspace_bytes();
  // Once warm, the same or a smaller request reuses the allocation.
  for (size_t bytes : {1000, 10, 1000}) {
    EXPECT_EQ(workspace.reserve(bytes, "test"), first);
    EXPECT_EQ(ctx.workspace_bytes(), held);
  }
  workspace.reserve(5000, "test");
  EXPECT_GE(ctx.workspace_bytes(), 5000u);
  EXPECT_LE(ctx.workspace_bytes(), size_t(1) << 20);
}

TEST(Workspace, LimitIsEnforcedAndNamed) {
  ContextOptions options;
  options.backend = Backend::sim;
  options.workspace_limit = 4096;
  Context ctx(options);
  detail::Workspace& workspace = ctx.state().workspace;
  EXPECT_TRUE(throws_with<WorkspaceTooSmall>([&] { workspace.reserve(5000, "S and P"); }, {"S and P", "4096"}));
  workspace.reserve(4096, "test");
  EXPECT_EQ(ctx.workspace_bytes(), 4096u);
  ctx.set_workspace_limit(1024);  // below what is held: released
  EXPECT_EQ(ctx.workspace_bytes(), 0u);
  EXPECT_EQ(ctx.workspace_limit(), 1024u);
  EXPECT_THROW(workspace.reserve(2048, "test"), WorkspaceTooSmall);
}

// The limit counts exactly the bytes asked for (no rounding), and growth stops at the limit: a
// request up to the limit always succeeds and the allocation never exceeds it.
TEST(Workspace, CountsExactBytesAndGrowsUpToTheLimit) {
  ContextOptions options;
  options.backend = Backend::sim;
  options.workspace_limit = 5001;
  Context ctx(options);
  detail::Workspace& workspace = ctx.state().workspace;
  workspace.reserve(3000, "test");
  EXPECT_EQ(ctx.workspace_bytes(), 3000u);
  workspace.reserve(3001, "test");  // doubling would give 6000: capped at the limit
  EXPECT_EQ(ctx.workspace_bytes(), 5001u);
  EXPECT_NE(workspace.reserve(5001, "test"), nullptr);
  EXPECT_EQ(ctx.workspace_bytes(), 5001u);
  EXPECT_TRUE(throws_with<WorkspaceTooSmall>([&] { workspace.reserve(5002, "test: scores"); },
                                             {"test: scores: 5002 bytes needed", "limit is 5001 bytes"}));
}

}  // namespace
}  // namespace selfattn
