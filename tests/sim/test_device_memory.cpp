// The sim's device memory: guard zones name the buffer and the offset of a stray write, after a
// launch or on free; big buffers are reserved lazily.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "common/compat.h"
#include "sim_test_launch.h"

namespace sim = selfattn::sim;
using sim::testing::launch;

namespace {

struct StoreParams {
  float* data;
  int64_t index;  // may be negative or past the end: the bug under test
  float value;
};

__global__ void store_one(const StoreParams p) {
  if (threadIdx.x == 0 && blockIdx.x == 0) p.data[p.index] = p.value;
}

// The guard zones are what catches a stray write when the racecheck's instrumentation is off (or
// the write comes from code without it); with it on, the write is reported at the access first
// (test_access_checks.cpp). These tests are about the zones: the racecheck is off for them.
std::string launch_store(float* data, int64_t index) {
  sim::testing::ScopedOptions unchecked(sim::testing::without_racecheck());
  try {
    launch<StoreParams, store_one>("store_one", dim3(2), dim3(32), {data, index, 1.0f});
  } catch (const sim::Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(SimDeviceMemory, WritePastTheEndIsReportedWithLabelAndOffset) {
  float* keys = static_cast<float*>(sim::device_alloc(113 * sizeof(float), "keys"));
  float* values = static_cast<float*>(sim::device_alloc(7 * sizeof(float), "values"));
  EXPECT_EQ(launch_store(values, 6), "");  // the last element is in bounds
  const std::string message = launch_store(values, 7);
  EXPECT_TRUE(contains(message, "after launch of kernel 'store_one'")) << message;
  EXPECT_TRUE(contains(message, "buffer 'values' (28 bytes)")) << message;
  EXPECT_TRUE(contains(message, "offset 28 (0 bytes past its end)")) << message;
  EXPECT_FALSE(contains(message, "'keys'")) << message;
  // Reported once: the zones are restored, so the next launch is clean.
  EXPECT_EQ(launch_store(keys, 0), "");
  EXPECT_NO_THROW(sim::device_free(keys));
  EXPECT_NO_THROW(sim::device_free(values));
}

TEST(SimDeviceMemory, WriteBeforeTheStartIsReported) {
  float* data = static_cast<float*>(sim::device_alloc(64, "scores"));
  const std::string message = launch_store(data, -2);
  EXPECT_TRUE(contains(message, "buffer 'scores' (64 bytes) was written out of bounds at offset -8 (8 bytes before its start)"))
      << message;
  sim::device_free(data);
}

TEST(SimDeviceMemory, DamageFoundOnFree) {
  unsigned char* data = static_cast<unsigned char*>(sim::device_alloc(1000, "workspace"));
  data[1000 + 100] = 0;  // a host-side stray write: no launch to catch it
  try {
    sim::device_free(data);
    FAIL() << "not reported";
  } catch (const sim::Error& e) {
    EXPECT_TRUE(contains(e.what(), "on free")) << e.what();
    EXPECT_TRUE(contains(e.what(), "'workspace' (1000 bytes)")) << e.what();
    EXPECT_TRUE(contains(e.what(), "offset 1100 (100 bytes past its end)")) << e.what();
  }
  EXPECT_NO_THROW(sim::check_guards("the free above"));  // the buffer is gone all the same
}

TEST(SimDeviceMemory, FreshBuffersAreAlignedAndNaN) {
  for (size_t bytes : {size_t(0), size_t(1), size_t(7), size_t(4096), size_t(100000)}) {
    void* p = sim::device_alloc(bytes, "fresh");
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
    const unsigned char* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(b[i], 0xFF) << "byte " << i << " of " << bytes;
    if (bytes >= 4) {
      float f;
      std::memcpy(&f, p, 4);
      EXPECT_TRUE(std::isnan(f));
    }
    sim::device_free(p);
  }
  EXPECT_NO_THROW(sim::device_free(nullptr));
  int not_ours = 0;
  EXPECT_THROW(sim::device_free(&not_ours), sim::Error);
}

// 2^33 bytes (2^31 floats) reserved, and only its last page touched: indices past 2^31 work.
struct FarParams {
  float* data;
  int64_t count;
};

__global__ void write_far_end(const FarParams p) {
  const int64_t i = p.count - 1 - int64_t(blockIdx.x) * blockDim.x - threadIdx.x;
  p.data[i] = float(i % 1000);
}

TEST(SimDeviceMemory, LazyHugeAllocationWrittenAtItsFarEnd) {
  const int64_t count = int64_t(1) << 31;
  float* data = static_cast<float*>(sim::device_alloc(size_t(count) * sizeof(float), "huge"));
  ASSERT_NE(data, nullptr);
  launch<FarParams, write_far_end>("write_far_end", dim3(3), dim3(64), {data, count});
  for (int64_t i = count - 192; i < count; ++i) ASSERT_EQ(data[i], float(i % 1000)) << i;
  EXPECT_EQ(data[0], 0.0f);  // untouched, lazily reserved: zero rather than poisoned
  EXPECT_EQ(launch_store(data, count), std::string("sim: after launch of kernel 'store_one': buffer 'huge' (8589934592 "
                                                   "bytes) was written out of bounds at offset 8589934592 (0 bytes "
                                                   "past its end)"));
  sim::device_free(data);
}

}  // namespace
