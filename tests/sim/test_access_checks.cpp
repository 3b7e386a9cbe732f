// Single accesses a GPU faults on and a CPU lets pass (sim/src/access_checks.cpp): one small kernel
// per planted violation, beside its correct twin that must run clean, and what the report names.
//   - out of bounds: a read or write just past or before a device buffer, past the block's dynamic
//     shared memory (compute-sanitizer memcheck's "Invalid __global__ read", which the guard zones
//     alone could not see for reads);
//   - misaligned: a 4-byte scalar, or an 8- or 16-byte vector (load_vector / store_vector), at an
//     address that is not a multiple of its size ("misaligned address"); a field of a packed
//     struct, which the compiler reads piecewise on the GPU too, is not such an access and passes.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "common/primitives.cuh"
#include "sim_test_launch.h"

namespace sim = selfattn::sim;
using sim::testing::error_of;
using sim::testing::launch;

namespace {

// A device buffer of `count` floats, freed at scope end.
struct DeviceFloats {
  DeviceFloats(size_t count, const char* label)
      : data(static_cast<float*>(sim::device_alloc(count * sizeof(float), label))) {}
  ~DeviceFloats() { sim::device_free(data); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  float* data;
};

struct IndexParams {
  float* buffer;
  int64_t index;  // the element thread 5 of block 1 reads or writes (may be out of bounds)
  float* sink;    // host memory: where a read value goes
};

constexpr int kReadLine = __LINE__ + 2;
__global__ void read_one(const IndexParams p) {
  if (blockIdx.x == 1 && threadIdx.x == 5) p.sink[0] = p.buffer[p.index];
}

__global__ void write_one(const IndexParams p) {
  if (blockIdx.x == 1 && threadIdx.x == 5) p.buffer[p.index] = 1.0f;
}

template <void (*Kernel)(IndexParams)>
std::string run_index(const char* name, float* buffer, int64_t index) {
  float sink = 0.0f;
  return error_of([&] { launch<IndexParams, Kernel>(name, dim3(2), dim3(32), {buffer, index, &sink}); });
}

TEST(SimAccessChecks, ReadPastTheEndOfADeviceBuffer) {
  SKIP_UNLESS_RACECHECKED();
  DeviceFloats keys(113, "keys");
  EXPECT_EQ(run_index<read_one>("read_one", keys.data, 112), "");  // the last element
  const std::string report = run_index<read_one>("read_one", keys.data, 113);
  EXPECT_CONTAINS(report, "sim: out-of-bounds read in kernel 'read_one', block (1,0,0), thread (5,0,0) at "
                          "test_access_checks.cpp:" + std::to_string(kReadLine));
  EXPECT_CONTAINS(report, "4 bytes read at offset 452 of buffer 'keys' (452 bytes), reaching 4 bytes past its end");
}

TEST(SimAccessChecks, ReadBeforeTheStartOfADeviceBuffer) {
  SKIP_UNLESS_RACECHECKED();
  DeviceFloats values(7, "values");
  const std::string report = run_index<read_one>("read_one", values.data, -3);
  EXPECT_CONTAINS(report, "out-of-bounds read");
  EXPECT_CONTAINS(report, "at offset -12 of buffer 'values' (28 bytes), reaching 12 bytes before its start");
}

TEST(SimAccessChecks, WritePastTheEndIsReportedAtTheAccess) {
  SKIP_UNLESS_RACECHECKED();
  DeviceFloats out(7, "out");
  EXPECT_EQ(run_index<write_one>("write_one", out.data, 6), "");
  const std::string report = run_index<write_one>("write_one", out.data, 7);
  EXPECT_CONTAINS(report, "out-of-bounds write in kernel 'write_one', block (1,0,0), thread (5,0,0)");
  EXPECT_CONTAINS(report, "4 bytes written at offset 28 of buffer 'out' (28 bytes)");
  // The guard zone the write damaged is restored with the report: the next launch is not blamed.
  EXPECT_EQ(run_index<write_one>("write_one", out.data, 0), "");
}

// cp.async reads its source when the copy lands, out of the instrumentation's sight: the twin checks
// the bytes it will read at the issue (none when src_bytes is 0, the zero-fill pad of a tile edge).
struct CopyParams {
  const float* src;
  int offset;           // in floats
  unsigned src_bytes;   // of the 16-byte copy
};

constexpr int kCopyLine = __LINE__ + 4;
__global__ void copy_into_shared(const CopyParams p) {
  float* smem = selfattn::kernels::dynamic_smem<float>();
  if (threadIdx.x == 0) {
    selfattn::kernels::cp_async_ca<16>(smem, p.src + p.offset, p.src_bytes);
  }
  selfattn::kernels::cp_async_commit();
  selfattn::kernels::cp_async_wait_all();
}

std::string run_copy(const float* src, int offset, unsigned src_bytes) {
  return error_of([&] {
    launch<CopyParams, copy_into_shared>("copy_into_shared", dim3(1), dim3(32), {src, offset, src_bytes}, 64);
  });
}

TEST(SimAccessChecks, CpAsyncSourcePastTheEnd) {
  SKIP_UNLESS_RACECHECKED();
  DeviceFloats v(10, "v");
  EXPECT_EQ(run_copy(v.data, 4, 16), "");  // floats 4..7
  EXPECT_EQ(run_copy(v.data, 8, 8), "");   // floats 8, 9 and 8 bytes of zeros: the tile edge done right
  const std::string report = run_copy(v.data, 8, 16);
  EXPECT_CONTAINS(report, "out-of-bounds read in kernel 'copy_into_shared', block (0,0,0), thread (0,0,0) at "
                          "test_access_checks.cpp:" + std::to_string(kCopyLine));
  EXPECT_CONTAINS(report, "16 bytes read at offset 32 of buffer 'v' (40 bytes), reaching 8 bytes past its end");
}

// ---- misaligned ----------------------------------------------------------------------------------

struct VectorParams {
  float* buffer;  // device memory, 16-byte aligned
  int offset;     // in floats: where thread 0 loads its float2 / float4
  float* sink;
};

__global__ void load_float2(const VectorParams p) {
  if (threadIdx.x == 0) {
    const float2 v = selfattn::kernels::load_vector(reinterpret_cast<const float2*>(p.buffer + p.offset));
    p.sink[0] = v.x + v.y;
  }
}

__global__ void store_float4(const VectorParams p) {
  if (threadIdx.x == 0) {
    selfattn::kernels::store_vector(reinterpret_cast<float4*>(p.buffer + p.offset), make_float4(1, 2, 3, 4));
  }
}

// A 4-byte integer at a byte offset: the compiler's own 4-byte access (no helper).
__global__ void load_word_at_byte(const VectorParams p) {
  if (threadIdx.x == 0) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(p.buffer);
    p.sink[0] = float(*reinterpret_cast<const uint32_t*>(bytes + p.offset));
  }
}

// The same bytes as a field of a packed struct: the compiler knows it may be unaligned and reads
// it piecewise (nvcc too), so nothing faults.
struct __attribute__((packed)) PackedWord {
  unsigned char pad;
  uint32_t word;
};
__global__ void load_packed_word(const VectorParams p) {
  if (threadIdx.x == 0) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(p.buffer);
    p.sink[0] = float(reinterpret_cast<const PackedWord*>(bytes + p.offset - 1)->word);
  }
}

template <void (*Kernel)(VectorParams)>
std::string run_vector(const char* name, float* buffer, int offset) {
  float sink = 0.0f;
  return error_of([&] { launch<VectorParams, Kernel>(name, dim3(1), dim3(32), {buffer, offset, &sink}); });
}

TEST(SimAccessChecks, MisalignedVectorLoadOfDeviceMemory) {
  SKIP_UNLESS_RACECHECKED();
  DeviceFloats q(64, "q");
  EXPECT_EQ(run_vector<load_float2>("load_float2", q.data, 2), "");
  const std::string report = run_vector<load_float2>("load_float2", q.data, 1);
  EXPECT_CONTAINS(report, "sim: misaligned address in kernel 'load_float2', block (0,0,0), thread (0,0,0)");
  EXPECT_CONTAINS(report, "8 bytes read at offset 4 of buffer 'q' (256 bytes), not a multiple of 8");
}

TEST(SimAccessChecks, MisalignedScalarLoadOfDeviceMemory) {
  SKIP_UNLESS_RACECHECKED();
  DeviceFloats k(64, "k");
  EXPECT_EQ(run_vector<load_word_at_byte>("load_word_at_byte", k.data, 8), "");
  const std::string report = run_vector<load_word_at_byte>("load_word_at_byte", k.data, 6);
  EXPECT_CONTAINS(report, "misaligned address in kernel 'load_word_at_byte'");
  EXPECT_CONTAINS(report, "4 bytes read at offset 6 of buffer 'k' (256 bytes), not a multiple of 4");
  EXPECT_EQ(run_vector<load_packed_word>("load_packed_word", k.data, 6), "");
}

TEST(SimAccessChecks, MisalignedVectorStoreOfDeviceMemory) {
  SKIP_UNLESS_RACECHECKED();
  DeviceFloats out(64, "out");
  EXPECT_EQ(run_vector<store_float4>("store_float4", out.data, 4), "");
  const std::string report = run_vector<store_float4>("store_float4", out.data, 2);
  EXPECT_CONTAINS(report, "16 bytes written at offset 8 of buffer 'out' (256 bytes), not a multiple of 16");
}

// ---- shared memory -------------------------------------------------------------------------------

struct SharedParams {
  int byte_offset;  // where thread 3 loads a 16-byte vector from dynamic shared memory
  float* sink;
};

__global__ void load_shared_vector(const SharedParams p) {
  unsigned char* smem = selfattn::kernels::dynamic_smem<unsigned char>();
  if (threadIdx.x == 3) {
    const uint4 v = selfattn::kernels::load_vector(reinterpret_cast<const uint4*>(smem + p.byte_offset));
    p.sink[0] = float(v.x ^ v.w);
  }
}

std::string run_shared(int byte_offset, size_t smem_bytes) {
  float sink = 0.0f;
  return error_of([&] {
    launch<SharedParams, load_shared_vector>("load_shared_vector", dim3(1), dim3(32), {byte_offset, &sink}, smem_bytes);
  });
}

TEST(SimAccessChecks, SharedMemoryVectorLoads) {
  SKIP_UNLESS_RACECHECKED();
  EXPECT_EQ(run_shared(240, 256), "");  // the last 16 bytes
  std::string report = run_shared(36, 256);
  EXPECT_CONTAINS(report, "misaligned address in kernel 'load_shared_vector', block (0,0,0), thread (3,0,0)");
  EXPECT_CONTAINS(report, "16 bytes read at offset 36 of the block's dynamic shared memory (256 bytes), not a "
                          "multiple of 16");
  report = run_shared(256, 256);
  EXPECT_CONTAINS(report, "out-of-bounds read in kernel 'load_shared_vector'");
  EXPECT_CONTAINS(report, "at offset 256 of the block's dynamic shared memory (256 bytes), reaching 16 bytes past "
                          "its end");
  report = run_shared(248, 256);  // starts inside, ends outside
  EXPECT_CONTAINS(report, "reaching 8 bytes past its end");
}

}  // namespace
