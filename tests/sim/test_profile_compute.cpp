// The profiler's compute and synchronisation counts and its speed-of-light estimate (sim/README.md,
// "The profiler"; selfattn_sim/profile.h): tensor-core instructions and their FLOPs, MUFU
// operations, barriers and collectives, a TMA box and a wgmma, profiling off recording nothing,
// and the estimate on hand-computed numbers and on a launch that writes more than it reads.
#include "sim_test_profile.h"

namespace {

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

// The per-SM global-memory path (128 bytes per SM per clock): a grid of few blocks cannot pull
// DRAM's bandwidth through its SMs. 8 blocks each reading 2 MB once (16 MB, 524288 sectors, each
// distinct) and writing 4 KB.
sim::LaunchProfile few_blocks_streaming(uint64_t blocks) {
  sim::LaunchProfile p;
  p.blocks = blocks;
  sim::BufferTraffic cache;
  cache.label = "cache";
  cache.read.requests = 32768;
  cache.read.sectors = 524288;
  cache.read.distinct_sectors = 524288;
  sim::BufferTraffic out;
  out.label = "out";
  out.write.sectors = 1024;
  out.write.distinct_sectors = 1024;
  p.global = {cache, out};
  return p;
}

TEST(SimProfile, SpeedOfLightOfTheSmGlobalPath) {
  // 8 blocks: 16 MB / (128 B x 8 SMs x 1.98e9) = 8.28 us, over DRAM's (16 MB + 32 KB) / 4.3e12 = 3.91 us.
  const sim::SpeedOfLight few = sim::estimate(few_blocks_streaming(8), sim::gpu_h200());
  EXPECT_NEAR(seconds_of(few, "sm_global"), 16777216.0 / (128.0 * 8 * 1.98e9), 1e-12);
  EXPECT_NEAR(seconds_of(few, "dram"), (16777216.0 + 32768.0) / 4.3e12, 1e-12);
  EXPECT_EQ(few.limiter, "sm_global");
  // 264 blocks: 132 SMs share it, 16 MB / (128 x 132 x 1.98e9) = 0.50 us; DRAM is the bound.
  const sim::SpeedOfLight full = sim::estimate(few_blocks_streaming(264), sim::gpu_h200());
  EXPECT_NEAR(seconds_of(full, "sm_global"), 16777216.0 / (128.0 * 132 * 1.98e9), 1e-12);
  EXPECT_EQ(full.limiter, "dram");
  // The sectors each request moved count, not the distinct ones: every block re-reading the same
  // 16 MB (8x the requests and sectors, the distinct sectors unchanged) moves 8x through the SMs.
  sim::LaunchProfile reread = few_blocks_streaming(264);
  reread.global[0].read.sectors *= 8;
  const sim::SpeedOfLight r = sim::estimate(reread, sim::gpu_h200());
  EXPECT_NEAR(seconds_of(r, "sm_global"), 8 * 16777216.0 / (128.0 * 132 * 1.98e9), 1e-12);  // 4.01 us
  EXPECT_NEAR(seconds_of(r, "dram"), seconds_of(full, "dram"), 1e-15);
  EXPECT_EQ(r.limiter, "sm_global");
  // Writes take the larger of the two directions, not their sum: 1024 sectors written beside
  // 524288 read leave the time the reads'.
  EXPECT_NEAR(seconds_of(full, "sm_global"), 32.0 * 524288 / (128.0 * 132 * 1.98e9), 1e-12);
}

// A launch that writes more sectors than it reads, counted and then estimated: 8 blocks of one
// warp, lane t of block b reading in[t] (the same 128 bytes, 4 sectors, in every block) and writing
// out[8 (32 b + t)] (32 bytes apart: a sector of its own). Reads: 8 requests of 4 sectors, 4
// distinct; writes: 8 requests of 32 sectors, 256 distinct. DRAM moves (4 + 256) x 32 bytes; the
// 8 SMs' global paths the larger direction, the writes' 256 x 32 bytes, at 128 bytes per SM per
// clock: 4.04 ns, over DRAM's 1.93 ns (the reads' 32 sectors alone would take 0.51 ns).
__global__ void scattered_writes(const CopyParams p) {
  const unsigned t = threadIdx.x;
  p.out[(blockIdx.x * 32 + t) * 8] = p.in[t];
}

TEST(SimProfile, SpeedOfLightOfALaunchWritingMoreThanItReads) {
  SKIP_UNLESS_INSTRUMENTED();
  DeviceBuffer<float> in(32, "in"), out(8 * 32 * 8, "out");
  const sim::LaunchProfile p = profile_of([&] {
    launch<CopyParams, scattered_writes>("scattered", dim3(8), dim3(32), {in.data, out.data});
  });
  ASSERT_NE(buffer(p, "in"), nullptr) << sim::format_profile(p);
  ASSERT_NE(buffer(p, "out"), nullptr);
  expect_traffic(buffer(p, "in")->read, 8, 8 * 128, 32, 4);
  expect_traffic(buffer(p, "out")->write, 8, 8 * 128, 256, 256);
  expect_traffic(p.reads(), 8, 8 * 128, 32, 4);
  expect_traffic(p.writes(), 8, 8 * 128, 256, 256);
  EXPECT_EQ(p.dram_bytes_lower_bound(), (4u + 256u) * 32u);
  const sim::SpeedOfLight s = sim::estimate(p, sim::gpu_h200());
  EXPECT_NEAR(seconds_of(s, "sm_global"), 256.0 * 32 / (128.0 * 8 * 1.98e9), 1e-15);
  EXPECT_NEAR(seconds_of(s, "dram"), 260.0 * 32 / 4.3e12, 1e-15);
  EXPECT_EQ(s.limiter, "sm_global");
  EXPECT_NEAR(s.lower_bound_seconds, 256.0 * 32 / (128.0 * 8 * 1.98e9), 1e-15);
  // On the A100 (108 SMs, 1.41 GHz, 2.039 TB/s) too.
  const sim::SpeedOfLight a100 = sim::estimate(p, sim::gpu_a100_sxm_80gb());
  EXPECT_NEAR(seconds_of(a100, "sm_global"), 256.0 * 32 / (128.0 * 8 * 1.41e9), 1e-15);
  EXPECT_NEAR(seconds_of(a100, "dram"), 260.0 * 32 / 2.039e12, 1e-15);
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
  EXPECT_EQ(seconds_of(s, "sm_global"), 0.0);  // the hand profile counts distinct sectors only
  EXPECT_EQ(a100->global_bytes_per_sm_clock, 128.0);
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
