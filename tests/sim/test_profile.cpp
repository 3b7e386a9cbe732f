// The profiler (sim/README.md, "The profiler"; selfattn_sim/profile.h): small kernels whose counts
// follow by hand from their access pattern, each asserted exactly, and the speed-of-light estimate
// on hand-computed numbers.
//   - global: a coalesced warp load (1 request, 4 sectors), a strided one (32 sectors), a loop (one
//     request per iteration), a divergent half-warp, 16-byte vectors, cp.async sources, and the
//     distinct sectors of a grid whose blocks re-read the same data;
//   - shared: stores conflict-free, 2-way and 32-way, a broadcast read, 8- and 16-byte vectors,
//     ldmatrix on an unswizzled and a swizzled tile, cp.async destinations;
//   - tensor-core instructions and their FLOPs, MUFU operations, barriers and collectives;
//   - profiling off records nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common/primitives.cuh"
#include "common/primitives_hopper.cuh"
#include "common/tma_descriptor.h"
#include "sim_test_launch.h"

namespace sim = selfattn::sim;
namespace kernels = selfattn::kernels;
using sim::testing::launch;
using sim::testing::ScopedOptions;

// Plain loads and stores reach the profiler through the racecheck's compiler instrumentation; the
// twins' reports (ldmatrix, cp.async, vectors, mma, MUFU) do without it.
#if defined(__SANITIZE_THREAD__)
#define SKIP_UNLESS_INSTRUMENTED()
#else
#define SKIP_UNLESS_INSTRUMENTED() GTEST_SKIP() << "built without the racecheck's instrumentation"
#endif

namespace {

// A device buffer of `count` elements, freed at scope end.
template <class T>
struct DeviceBuffer {
  DeviceBuffer(size_t count, const char* label) : data(static_cast<T*>(sim::device_alloc(count * sizeof(T), label))) {}
  ~DeviceBuffer() { sim::device_free(data); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* data;
};

sim::Options profiling_on(bool racecheck = true, int workers = 0) {
  sim::Options o = sim::options();
  o.profile = true;
  o.racecheck = racecheck;
  if (workers > 0) o.worker_threads = workers;
  return o;
}

// Runs `run` (one launch) with profiling on and returns its profile.
template <class Run>
sim::LaunchProfile profile_of(Run&& run, bool racecheck = true, int workers = 0) {
  (void)sim::take_profiles();  // whatever earlier tests left
  {
    ScopedOptions scoped(profiling_on(racecheck, workers));
    run();
  }
  std::vector<sim::LaunchProfile> profiles = sim::take_profiles();
  EXPECT_EQ(profiles.size(), 1u);
  return profiles.empty() ? sim::LaunchProfile{} : profiles[0];
}

const sim::BufferTraffic* buffer(const sim::LaunchProfile& p, const std::string& label) {
  for (const sim::BufferTraffic& b : p.global)
    if (b.label == label) return &b;
  return nullptr;
}

void expect_traffic(const sim::GlobalTraffic& g, uint64_t requests, uint64_t bytes, uint64_t sectors,
                    uint64_t distinct) {
  EXPECT_EQ(g.requests, requests);
  EXPECT_EQ(g.bytes_requested, bytes);
  EXPECT_EQ(g.sectors, sectors);
  EXPECT_EQ(g.distinct_sectors, distinct);
}

// The profile's only shared-memory site of kind `op` (failing the test if there is not exactly one).
sim::SharedSite only_site(const sim::LaunchProfile& p, sim::SharedOp op) {
  std::vector<sim::SharedSite> found;
  for (const sim::SharedSite& s : p.shared)
    if (s.op == op) found.push_back(s);
  EXPECT_EQ(found.size(), 1u) << sim::format_profile(p);
  return found.empty() ? sim::SharedSite{} : found[0];
}

void expect_site(const sim::SharedSite& s, uint64_t instructions, uint64_t bytes, uint64_t wavefronts, uint64_t ideal) {
  EXPECT_EQ(s.instructions, instructions) << s.location;
  EXPECT_EQ(s.bytes, bytes) << s.location;
  EXPECT_EQ(s.wavefronts, wavefronts) << s.location;
  EXPECT_EQ(s.ideal_wavefronts, ideal) << s.location;
}

struct CopyParams {
  const float* in;
  float* out;
};

// ---- global memory --------------------------------------------------------------------------------

// Lane t reads in[t * Stride] and writes out[t]: 32 lanes x 4 bytes.
template <int Stride>
__global__ void strided_copy(const CopyParams p) {
  const unsigned t = threadIdx.x;
  p.out[t] = p.in[t * Stride];
}

TEST(SimProfile, CoalescedWarpLoadIsOneRequestOfFourSectors) {
  SKIP_UNLESS_INSTRUMENTED();
  DeviceBuffer<float> in(32, "in"), out(32, "out");
  const sim::LaunchProfile p = profile_of([&] {
    launch<CopyParams, strided_copy<1>>("coalesced", dim3(1), dim3(32), {in.data, out.data});
  });
  EXPECT_EQ(p.kernel, "coalesced");
  EXPECT_EQ(p.blocks, 1u);
  ASSERT_NE(buffer(p, "in"), nullptr) << sim::format_profile(p);
  ASSERT_NE(buffer(p, "out"), nullptr);
  // 128 bytes from a page-aligned buffer: 4 sectors, one request; read and written once.
  expect_traffic(buffer(p, "in")->read, 1, 128, 4, 4);
  expect_traffic(buffer(p, "in")->write, 0, 0, 0, 0);
  expect_traffic(buffer(p, "out")->write, 1, 128, 4, 4);
  EXPECT_EQ(buffer(p, "in")->read.sectors_per_request(), 4.0);
  EXPECT_EQ(buffer(p, "in")->read.efficiency(), 1.0);
  EXPECT_EQ(p.dram_bytes_lower_bound(), 8u * 32);
  EXPECT_TRUE(p.shared.empty());
}

TEST(SimProfile, StridedWarpLoadTouchesOneSectorPerLane) {
  SKIP_UNLESS_INSTRUMENTED();
  DeviceBuffer<float> in(32 * 32, "in"), out(32, "out");
  const sim::LaunchProfile p = profile_of([&] {
    launch<CopyParams, strided_copy<32>>("strided", dim3(1), dim3(32), {in.data, out.data});
  });
  ASSERT_NE(buffer(p, "in"), nullptr) << sim::format_profile(p);
  // 128-byte stride: every lane in its own sector; 128 bytes asked for, 1024 moved.
  expect_traffic(buffer(p, "in")->read, 1, 128, 32, 32);
  EXPECT_EQ(buffer(p, "in")->read.sectors_per_request(), 32.0);
  EXPECT_EQ(buffer(p, "in")->read.efficiency(), 0.125);
  expect_traffic(buffer(p, "out")->write, 1, 128, 4, 4);
}

// The same counts with the racecheck off: the profiler rides on its instrumentation alone.
TEST(SimProfile, CountsTheSameWithTheRacecheckOff) {
  SKIP_UNLESS_INSTRUMENTED();
  DeviceBuffer<float> in(32 * 32, "in"), out(32, "out");
  const sim::LaunchProfile p = profile_of(
      [&] { launch<CopyParams, strided_copy<32>>("strided", dim3(1), dim3(32), {in.data, out.data}); },
      /*racecheck=*/false);
  ASSERT_NE(buffer(p, "in"), nullptr) << sim::format_profile(p);
  expect_traffic(buffer(p, "in")->read, 1, 128, 32, 32);
  expect_traffic(buffer(p, "out")->write, 1, 128, 4, 4);
}

// Every block reads the same 64 floats (8 sectors) and writes its own 64: 4 blocks of 2 warps.
__global__ void blocks_reread(const CopyParams p) {
  const unsigned t = threadIdx.x;
  p.out[blockIdx.x * 64 + t] = p.in[t];
}

TEST(SimProfile, DistinctSectorsCountDataTheGridRereadsOnce) {
  SKIP_UNLESS_INSTRUMENTED();
  DeviceBuffer<float> in(64, "in"), out(4 * 64, "out");
  // Two workers: blocks on both merge their counts, and share the grid's record of sectors.
  const sim::LaunchProfile p = profile_of(
      [&] { launch<CopyParams, blocks_reread>("reread", dim3(4), dim3(64), {in.data, out.data}); },
      /*racecheck=*/true, /*workers=*/2);
  ASSERT_NE(buffer(p, "in"), nullptr) << sim::format_profile(p);
  // 8 warp requests of 4 sectors each; the grid reads 8 sectors and writes 32.
  expect_traffic(buffer(p, "in")->read, 8, 8 * 128, 32, 8);
  expect_traffic(buffer(p, "out")->write, 8, 8 * 128, 32, 32);
  EXPECT_EQ(p.reads().distinct_sectors, 8u);
  EXPECT_EQ(p.dram_bytes_lower_bound(), (8u + 32u) * 32u);
}

// One code address, four dynamic occurrences per lane: four requests.
__global__ void loop_loads(const CopyParams p) {
  const unsigned t = threadIdx.x;
  float sum = 0.0f;
  for (int i = 0; i < 4; ++i) sum += p.in[t + 32 * i];
  p.out[t] = sum;
}

TEST(SimProfile, EachIterationOfALoopIsARequest) {
  SKIP_UNLESS_INSTRUMENTED();
  DeviceBuffer<float> in(128, "in"), out(32, "out");
  const sim::LaunchProfile p = profile_of([&] {
    launch<CopyParams, loop_loads>("loop", dim3(1), dim3(32), {in.data, out.data});
  });
  ASSERT_NE(buffer(p, "in"), nullptr) << sim::format_profile(p);
  expect_traffic(buffer(p, "in")->read, 4, 4 * 128, 16, 16);
}

// Half the warp loads: the request is counted when the warp ends, with the 16 lanes it has.
__global__ void half_warp_loads(const CopyParams p) {
  const unsigned t = threadIdx.x;
  if (t < 16) p.out[t] = p.in[t];
}

TEST(SimProfile, ADivergentRequestHasTheLanesThatMadeIt) {
  SKIP_UNLESS_INSTRUMENTED();
  DeviceBuffer<float> in(32, "in"), out(32, "out");
  const sim::LaunchProfile p = profile_of([&] {
    launch<CopyParams, half_warp_loads>("half", dim3(1), dim3(32), {in.data, out.data});
  });
  ASSERT_NE(buffer(p, "in"), nullptr) << sim::format_profile(p);
  expect_traffic(buffer(p, "in")->read, 1, 64, 2, 2);
  expect_traffic(buffer(p, "out")->write, 1, 64, 2, 2);
}

// ---- shared memory --------------------------------------------------------------------------------

// Lane t stores to word t * Stride: banks (t * Stride) % 32.
template <int Stride>
__global__ void shared_stores(const CopyParams) {
  float* s = kernels::dynamic_smem<float>();
  const unsigned t = threadIdx.x;
  s[t * Stride] = float(t);
}

template <int Stride>
sim::SharedSite shared_store_site() {
  const sim::LaunchProfile p = profile_of([&] {
    launch<CopyParams, shared_stores<Stride>>("stores", dim3(1), dim3(32), {nullptr, nullptr},
                                              32 * Stride * sizeof(float));
  });
  EXPECT_TRUE(p.global.empty());
  return only_site(p, sim::SharedOp::store);
}

TEST(SimProfile, SharedStoresConflictFreeTwoWayAndThirtyTwoWay) {
  SKIP_UNLESS_INSTRUMENTED();
  // Stride 1: 32 words in 32 banks. Stride 2: lanes t and t + 16 share bank 2t. Stride 32: all in
  // bank 0. The ideal is one wavefront for 128 bytes in each case.
  expect_site(shared_store_site<1>(), 1, 128, 1, 1);
  expect_site(shared_store_site<2>(), 1, 128, 2, 1);
  const sim::SharedSite s32 = shared_store_site<32>();
  expect_site(s32, 1, 128, 32, 1);
  EXPECT_EQ(s32.bank_conflicts(), 31u);
}

constexpr int kBroadcastLine = __LINE__ + 6;  // the load below
__global__ void broadcast_read(const CopyParams p) {
  float* s = kernels::dynamic_smem<float>();
  const unsigned t = threadIdx.x;
  if (t == 0) s[0] = 1.0f;
  __syncthreads();
  const float v = s[0];
  p.out[t] = v;
}

TEST(SimProfile, ABroadcastReadIsOneWavefront) {
  SKIP_UNLESS_INSTRUMENTED();
  DeviceBuffer<float> out(32, "out");
  const sim::LaunchProfile p = profile_of([&] {
    launch<CopyParams, broadcast_read>("broadcast", dim3(1), dim3(32), {nullptr, out.data}, 16);
  });
  const sim::SharedSite load = only_site(p, sim::SharedOp::load);
  expect_site(load, 1, 128, 1, 1);
  EXPECT_CONTAINS(load.location, "test_profile.cpp:" + std::to_string(kBroadcastLine));
  expect_site(only_site(p, sim::SharedOp::store), 1, 4, 1, 1);  // thread 0's store alone
  EXPECT_EQ(p.barriers, 1u);
}

// 16-byte vectors: a warp's contiguous 512 bytes, global to shared. Global: 1 request, 16 sectors;
// shared: 4 quarter-warp phases of 128 bytes, 4 wavefronts. The host compiler's 4-byte pieces of
// the copies are not counted again.
struct VectorParams {
  const float4* in;
  float2* out;
};
__global__ void vector_copies(const VectorParams p) {
  float4* s = kernels::dynamic_smem<float4>();
  const unsigned t = threadIdx.x;
  kernels::store_vector(s + t, kernels::load_vector(p.in + t));
  __syncthreads();
  // 8-byte vectors, 2 half-warp phases: lane t reads bytes 8t.. of the tile.
  kernels::store_vector(p.out + t, kernels::load_vector(reinterpret_cast<const float2*>(s) + t));
}

TEST(SimProfile, VectorAccessesAreOneRequestEach) {
  DeviceBuffer<float4> in(32, "in");
  DeviceBuffer<float2> out(32, "out");
  const sim::LaunchProfile p = profile_of([&] {
    launch<VectorParams, vector_copies>("vectors", dim3(1), dim3(32), {in.data, out.data}, 512);
  });
  ASSERT_NE(buffer(p, "in"), nullptr) << sim::format_profile(p);
  expect_traffic(buffer(p, "in")->read, 1, 512, 16, 16);
  expect_traffic(buffer(p, "out")->write, 1, 256, 8, 8);
  expect_site(only_site(p, sim::SharedOp::store), 1, 512, 4, 4);
  expect_site(only_site(p, sim::SharedOp::load), 1, 256, 2, 2);
}

// cp.async of 16 bytes per lane, a warp's contiguous 512 bytes: like the vector copy.
__global__ void cp_async_tile(const VectorParams p) {
  float4* s = kernels::dynamic_smem<float4>();
  const unsigned t = threadIdx.x;
  kernels::cp_async_cg(s + t, p.in + t);
  kernels::cp_async_wait_all();
  __syncthreads();
}

TEST(SimProfile, CpAsyncCountsItsSourceAndItsDestination) {
  DeviceBuffer<float4> in(32, "in");
  const sim::LaunchProfile p = profile_of([&] {
    launch<VectorParams, cp_async_tile>("cp_async", dim3(1), dim3(32), {in.data, nullptr}, 512);
  });
  ASSERT_NE(buffer(p, "in"), nullptr) << sim::format_profile(p);
  expect_traffic(buffer(p, "in")->read, 1, 512, 16, 16);
  expect_site(only_site(p, sim::SharedOp::cp_async_dst), 1, 512, 4, 4);
}

// ldmatrix.x4 over an 8 x 64 tile of 16-bit elements (128-byte rows): lane 8m + r gives row r of
// matrix m, the tile's 16-byte chunk m of row r, or, swizzled, chunk m ^ r. Unswizzled, the 8 rows
// of a matrix are 128 bytes apart: all in banks 4m..4m+3, 8 wavefronts per matrix, 32 in all.
// Swizzled, they cover the 32 banks: 1 per matrix, the ideal 4.
template <bool Swizzled>
__global__ void ldmatrix_tile(const CopyParams p) {
  unsigned char* tile = kernels::dynamic_smem<unsigned char>();
  const unsigned lane = threadIdx.x, m = lane / 8, r = lane % 8;
  const unsigned chunk = Swizzled ? (m ^ r) : m;
  uint32_t regs[4];
  kernels::ldmatrix<4>(regs, tile + r * 128 + chunk * 16);
  p.out[lane] = float(regs[0] & 1u);
}

template <bool Swizzled>
sim::SharedSite ldmatrix_site() {
  DeviceBuffer<float> out(32, "out");
  const sim::LaunchProfile p = profile_of([&] {
    launch<CopyParams, ldmatrix_tile<Swizzled>>("ldmatrix", dim3(1), dim3(32), {nullptr, out.data}, 1024);
  });
  EXPECT_EQ(p.warp_collectives, 1u);  // the ldmatrix twin's
  return only_site(p, sim::SharedOp::ldmatrix);
}

TEST(SimProfile, LdmatrixOnAnUnswizzledTileConflictsAndOnASwizzledOneDoesNot) {
  const sim::SharedSite plain = ldmatrix_site<false>();
  expect_site(plain, 1, 512, 32, 4);
  EXPECT_EQ(plain.bank_conflicts(), 28u);
  const sim::SharedSite swizzled = ldmatrix_site<true>();
  expect_site(swizzled, 1, 512, 4, 4);
  EXPECT_EQ(swizzled.bank_conflicts(), 0u);
}

// ---- tensor cores, MUFU, synchronisation ----------------------------------------------------------

__global__ void three_mmas(const CopyParams p) {
  uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0}, a8[2] = {0, 0}, b8[1] = {0};
  float acc[4] = {0, 0, 0, 0};
  for (int i = 0; i < 3; ++i) kernels::mma_m16n8k16_bf16(acc, a, b, acc);
  kernels::mma_m16n8k8_f16(acc, a8, b8, acc);
  p.out[blockIdx.x * 32 + threadIdx.x] = acc[0];
}

TEST(SimProfile, MmaSyncInstructionsAndTheirFlops) {
  DeviceBuffer<float> out(64, "out");
  const sim::LaunchProfile p = profile_of([&] {
    launch<CopyParams, three_mmas>("mma", dim3(2), dim3(32), {nullptr, out.data});
  });
  ASSERT_EQ(p.tensor.size(), 2u) << sim::format_profile(p);
  for (const sim::TensorOps& t : p.tensor) {
    if (t.shape == "m16n8k16") {
      EXPECT_EQ(t.dtype, "bf16");
      EXPECT_EQ(t.instructions, 6u);  // 3 per warp, 2 warps
      EXPECT_EQ(t.flops, 6u * 2 * 16 * 8 * 16);
    } else {
      EXPECT_EQ(t.shape, "m16n8k8");
      EXPECT_EQ(t.dtype, "f16");
      EXPECT_EQ(t.instructions, 2u);
      EXPECT_EQ(t.flops, 2u * 2 * 16 * 8 * 8);
    }
  }
  EXPECT_EQ(p.tensor_flops(), 6u * 4096 + 2u * 2048);
  EXPECT_EQ(p.warp_collectives, 8u);
}

}  // namespace

// In the library kernels' namespace, where unqualified exp2f and logf are the sim's CUDA math
// (kernels/common/sim_math.h), as for the library's kernels.
SELFATTN_KERNELS_BEGIN
namespace profile_test {
struct MathParams {
  float* out;
};
__global__ void special_functions(const MathParams p) {
  const unsigned t = threadIdx.x;
  const float x = float(t) / 64.0f;
  // exp2f and __expf are ex2, __fdividef rcp, __tanhf tanh; logf (a polynomial on the GPU) is none.
  p.out[t] = exp2f(x) + __expf(x) + __fdividef(1.0f, x + 1.0f) + __tanhf(x) + logf(x + 1.0f);
}
}  // namespace profile_test
SELFATTN_KERNELS_END

namespace {

namespace pt = selfattn::kernels::sim_target::profile_test;

TEST(SimProfile, MufuOperationsPerThread) {
  DeviceBuffer<float> out(64, "out");
  const sim::LaunchProfile p = profile_of([&] {
    launch<pt::MathParams, pt::special_functions>("mufu", dim3(1), dim3(64), {out.data});
  });
  EXPECT_EQ(p.mufu[size_t(sim::Mufu::ex2)], 128u);
  EXPECT_EQ(p.mufu[size_t(sim::Mufu::rcp)], 64u);
  EXPECT_EQ(p.mufu[size_t(sim::Mufu::tanh)], 64u);
  EXPECT_EQ(p.mufu[size_t(sim::Mufu::lg2)], 0u);
  EXPECT_EQ(p.mufu_ops(), 256u);
}

__global__ void synchronising(const CopyParams p) {
  const unsigned t = threadIdx.x;
  __syncthreads();
  __syncwarp();
  const float v = kernels::shuffle_xor(float(t), 1);
  __syncthreads();
  p.out[blockIdx.x * 64 + t] = v;
}

TEST(SimProfile, BarriersAndWarpCollectives) {
  DeviceBuffer<float> out(3 * 64, "out");
  const sim::LaunchProfile p = profile_of([&] {
    launch<CopyParams, synchronising>("sync", dim3(3), dim3(64), {nullptr, out.data});
  });
  EXPECT_EQ(p.blocks, 3u);
  EXPECT_EQ(p.barriers, 3u * 2);        // 2 per block
  EXPECT_EQ(p.warp_syncs, 3u * 2);      // 1 per warp
  EXPECT_EQ(p.warp_collectives, 3u * 2);
  EXPECT_EQ(p.warpgroup_collectives, 0u);
  EXPECT_CONTAINS(sim::format_profile(p), "kernel 'sync': grid (3,1,1), block (64,1,1), 3 blocks");
}

// ---- Hopper: a TMA box and a wgmma -----------------------------------------------------------------

}  // namespace

SELFATTN_KERNELS_BEGIN
namespace profile_test {
struct HopperParams {
  TmaDescriptor map;  // a 64 x 32 bf16 tensor, one box of all of it
  float* out;
};
// Thread 0 loads the 4096-byte tensor with one TMA box; the warpgroup multiplies its first 64 x 16
// (A, at offset 0) by 16 x 64 more (B, at 2048), both K-major without swizzle: core matrices of 8
// rows x 16 bytes, 128 bytes apart along K (LBO), 256 apart along M / N (SBO).
__global__ void tma_then_wgmma(const HopperParams p) {
  unsigned char* smem = dynamic_smem<unsigned char>();
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem + 4096);
  const unsigned t = threadIdx.x;
  if (t == 0) {
    mbarrier_init(bar, 1);
    fence_barrier_init();
  }
  __syncthreads();
  if (t == 0) {
    mbarrier_arrive_expect_tx(bar, 4096);
    tma_load_4d(smem, &p.map, 0, 0, 0, 0, bar);
  }
  mbarrier_wait(bar, 0);
  const uint64_t layout = uint64_t(128 >> 4) << 16 | uint64_t(256 >> 4) << 32;
  float d[32];
  wgmma_fence();
  wgmma_ss<__nv_bfloat16, 64>(d, layout | (0 >> 4), layout | (2048 >> 4), false);
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operands(d);
  p.out[t] = d[0];
}
}  // namespace profile_test
SELFATTN_KERNELS_END

namespace {

TEST(SimProfile, ATmaBoxIsOneRequestAndAWgmmaOneInstructionPerWarpgroup) {
  DeviceBuffer<uint16_t> tensor(64 * 32, "tensor");
  DeviceBuffer<float> out(128, "out");
  pt::HopperParams params{};
  kernels::TmaTiledSpec spec;
  spec.base = tensor.data;
  spec.rank = 4;
  spec.element_bytes = 2;
  const uint64_t dims[4] = {32, 64, 1, 1}, strides[4] = {2, 64, 4096, 4096};
  const uint32_t box[4] = {32, 64, 1, 1};
  for (int i = 0; i < 4; ++i) spec.dims[i] = dims[i], spec.strides_bytes[i] = strides[i], spec.box[i] = box[i];
  ASSERT_EQ(kernels::sim_encode_tma_tiled(&params.map, spec), "");
  params.out = out.data;
  const sim::LaunchProfile p = profile_of([&] {
    launch<pt::HopperParams, pt::tma_then_wgmma>("hopper", dim3(1), dim3(128), params, 4096 + 8);
  });
  ASSERT_NE(buffer(p, "tensor"), nullptr) << sim::format_profile(p);
  // The box: its 4096 bytes in 128 sectors, one request.
  expect_traffic(buffer(p, "tensor")->read, 1, 4096, 128, 128);
  ASSERT_EQ(p.tensor.size(), 1u);
  EXPECT_EQ(p.tensor[0].shape, "m64n64k16");
  EXPECT_EQ(p.tensor[0].dtype, "bf16");
  EXPECT_EQ(p.tensor[0].instructions, 1u);
  EXPECT_EQ(p.tensor[0].flops, 2u * 64 * 64 * 16);
  EXPECT_EQ(p.warpgroup_collectives, 2u);  // the wgmma's issue and its wait_group
  // The TMA's shared-memory writes and wgmma's operand reads are not load/store wavefronts.
  EXPECT_TRUE(p.shared.empty()) << sim::format_profile(p);
}

// ---- off ----------------------------------------------------------------------------------------

TEST(SimProfile, ProfilingOffRecordsNothing) {
  DeviceBuffer<float> in(32, "in"), out(64, "out");
  (void)sim::take_profiles();
  sim::Options o = sim::options();
  o.profile = false;
  ScopedOptions scoped(o);
  launch<CopyParams, strided_copy<1>>("unprofiled", dim3(1), dim3(32), {in.data, out.data});
  launch<CopyParams, three_mmas>("unprofiled_mma", dim3(2), dim3(32), {nullptr, out.data});
  EXPECT_TRUE(sim::take_profiles().empty());
  EXPECT_FALSE(sim::profiling());
}

TEST(SimProfile, TakeProfilesReturnsEachLaunchOnce) {
  DeviceBuffer<float> in(32, "in"), out(64, "out");
  (void)sim::take_profiles();
  {
    ScopedOptions scoped(profiling_on());
    launch<CopyParams, strided_copy<1>>("first", dim3(1), dim3(32), {in.data, out.data});
    launch<CopyParams, three_mmas>("second", dim3(2), dim3(32), {nullptr, out.data});
    EXPECT_TRUE(sim::profiling() == false);  // only while a launch runs
  }
  const std::vector<sim::LaunchProfile> profiles = sim::take_profiles();
  ASSERT_EQ(profiles.size(), 2u);
  EXPECT_EQ(profiles[0].kernel, "first");
  EXPECT_EQ(profiles[1].kernel, "second");
  EXPECT_TRUE(sim::take_profiles().empty());
}

// ---- speed of light -------------------------------------------------------------------------------

// A profile built by hand: 10^6 distinct sectors read (32 MB), 790 MFLOP of bf16 tensor work, and
// shared-memory and MUFU work sized to take 2 us and 1 us on a full H200.
sim::LaunchProfile hand_profile(uint64_t blocks) {
  sim::LaunchProfile p;
  p.blocks = blocks;
  sim::BufferTraffic keys;
  keys.label = "keys";
  keys.read.requests = 1;
  keys.read.distinct_sectors = 1000000;
  p.global.push_back(keys);
  sim::TensorOps mma;
  mma.shape = "m16n8k16";
  mma.dtype = "bf16";
  mma.flops = 790000000;
  p.tensor.push_back(mma);
  sim::SharedSite site;
  site.wavefronts = 522720;  // 2e-6 s x 132 SMs x 1.98e9 clocks x 1 wavefront
  p.shared.push_back(site);
  p.mufu[size_t(sim::Mufu::ex2)] = 4181760;  // 1e-6 s x 132 x 1.98e9 x 16
  return p;
}

double seconds_of(const sim::SpeedOfLight& s, const std::string& resource) {
  for (const sim::ResourceTime& r : s.resources)
    if (r.resource == resource) return r.seconds;
  ADD_FAILURE() << "no resource " << resource;
  return -1.0;
}

TEST(SimProfile, SpeedOfLightOnTheH200) {
  const sim::SpeedOfLight s = sim::estimate(hand_profile(264), sim::gpu_h200());
  EXPECT_NEAR(seconds_of(s, "dram"), 32e6 / 4.3e12, 1e-12);  // 7.44 us
  EXPECT_NEAR(seconds_of(s, "tensor"), 1e-6, 1e-12);
  EXPECT_NEAR(seconds_of(s, "shared"), 2e-6, 1e-12);
  EXPECT_NEAR(seconds_of(s, "mufu"), 1e-6, 1e-12);
  EXPECT_EQ(s.limiter, "dram");
  EXPECT_NEAR(s.lower_bound_seconds, 32e6 / 4.3e12, 1e-12);
}

TEST(SimProfile, SpeedOfLightWithFewerBlocksThanSms) {
  // 33 blocks use 33 of the 132 SMs: the per-SM resources take 4 times as long; DRAM does not.
  const sim::SpeedOfLight s = sim::estimate(hand_profile(33), sim::gpu_h200());
  EXPECT_NEAR(seconds_of(s, "dram"), 32e6 / 4.3e12, 1e-12);
  EXPECT_NEAR(seconds_of(s, "tensor"), 4e-6, 1e-12);
  EXPECT_NEAR(seconds_of(s, "shared"), 8e-6, 1e-12);
  EXPECT_NEAR(seconds_of(s, "mufu"), 4e-6, 1e-12);
  EXPECT_EQ(s.limiter, "shared");
  EXPECT_NEAR(s.lower_bound_seconds, 8e-6, 1e-12);
}

TEST(SimProfile, SpeedOfLightOnTheA100) {
  const sim::GpuCeilings* a100 = sim::gpu_ceilings("a100");
  ASSERT_NE(a100, nullptr);
  EXPECT_EQ(a100->sms, 108u);
  const sim::SpeedOfLight s = sim::estimate(hand_profile(216), *a100);
  EXPECT_NEAR(seconds_of(s, "dram"), 32e6 / 2.039e12, 1e-12);
  EXPECT_NEAR(seconds_of(s, "tensor"), 790e6 / 312e12, 1e-12);
  EXPECT_NEAR(seconds_of(s, "shared"), 522720.0 / (108 * 1.41e9), 1e-12);
  EXPECT_NEAR(seconds_of(s, "mufu"), 4181760.0 / (16 * 108 * 1.41e9), 1e-12);
  EXPECT_EQ(s.limiter, "dram");
  EXPECT_EQ(sim::gpu_ceilings("H200"), &sim::gpu_h200());
  EXPECT_EQ(sim::gpu_ceilings("V100"), nullptr);
}

TEST(SimProfile, SpeedOfLightOfNothingIsZero) {
  const sim::SpeedOfLight s = sim::estimate(sim::LaunchProfile{}, sim::gpu_h200());
  EXPECT_EQ(s.lower_bound_seconds, 0.0);
  EXPECT_EQ(s.limiter, "");
}

}  // namespace
