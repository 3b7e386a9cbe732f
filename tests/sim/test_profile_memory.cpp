// The profiler's memory counts (sim/README.md, "The profiler"; selfattn_sim/profile.h): small
// kernels whose counts follow by hand from their access pattern, each asserted exactly.
//   - global: a coalesced warp load (1 request, 4 sectors), a strided one (32 sectors), a loop (one
//     request per iteration), a divergent half-warp, 16-byte vectors, cp.async sources, and the
//     distinct sectors of a grid whose blocks re-read the same data;
//   - shared: stores conflict-free, 2-way and 32-way, a broadcast read, 8- and 16-byte vectors
//     (8-byte ones conflicting on different banks in each half-warp),
//     ldmatrix on an unswizzled and a swizzled tile, cp.async destinations.
#include "sim_test_profile.h"

namespace {

// ---- global memory --------------------------------------------------------------------------------

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
  EXPECT_CONTAINS(load.location, "test_profile_memory.cpp:" + std::to_string(kBroadcastLine));
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

// 8-byte accesses conflicting differently in each half-warp. The hardware serves a warp's 8-byte
// request in two phases, lanes 0-15 then 16-31; within a phase, distinct 4-byte words in one bank
// conflict. float2 i holds words 2i and 2i + 1, in banks 2 (i % 16) and 2 (i % 16) + 1. Lane u < 16
// takes float2 (u % 4) + 16 (u / 4): 4 distinct words in each of banks 0-7, 4 wavefronts. Lane
// 16 + u takes float2 8 + (u % 8) + 16 (u / 8): 2 distinct words in each of banks 16-31, 2
// wavefronts. 6 in all; ideal 2 (each phase's 32 words fit one pass), so 4 conflicts. One phase of
// 32 lanes would count the busier half alone (4: the halves' banks differ), and lanes split odd
// and even 8 (4-way on both sides).
__global__ void half_warp_conflicts(const VectorParams p) {
  float2* s = kernels::dynamic_smem<float2>();
  const unsigned t = threadIdx.x, u = t % 16;
  const unsigned i = t < 16 ? u % 4 + 16 * (u / 4) : 8 + u % 8 + 16 * (u / 8);
  kernels::store_vector(s + i, make_float2(float(t), 1.0f));
  __syncthreads();
  kernels::store_vector(p.out + t, kernels::load_vector(s + i));
}

TEST(SimProfile, EightByteHalfWarpsConflictEachInItsOwnBanks) {
  DeviceBuffer<float2> out(32, "out");
  const sim::LaunchProfile p = profile_of([&] {
    launch<VectorParams, half_warp_conflicts>("half_warps", dim3(1), dim3(32), {nullptr, out.data}, 64 * 8);
  });
  for (sim::SharedOp op : {sim::SharedOp::store, sim::SharedOp::load}) {
    const sim::SharedSite site = only_site(p, op);
    expect_site(site, 1, 256, 6, 2);
    EXPECT_EQ(site.bank_conflicts(), 4u) << sim::format_profile(p);
  }
  expect_traffic(buffer(p, "out")->write, 1, 256, 8, 8);
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

}  // namespace
