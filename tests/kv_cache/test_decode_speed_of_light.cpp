// Decode at the bandwidth limit, judged by the sim's counters (issue 35 item 5; sim/README.md, "The
// profiler", "A call's estimate"): an attention_with_kv_cache() call's launches each get a
// speed-of-light bound on the H200 (sim::estimate), and the call is memory-bound when
//   DRAM time / total >= 0.9,   total = sum over the call's launches of their bounds,
//                               DRAM time = sum over them of their DRAM times,
// for the shape the issue names: bf16, 32 query heads over 8 KV heads (GQA 4), head dim 128, one
// new token, a paged cache (pages shuffled in the pool) of 16 or 64 tokens a page, the split count
// the heuristic chooses for the H200's 132 SMs (the sim reports 132, checked below).
//
// The shapes here are the largest the sim profiles in a few seconds each; what the issue names
// (batch 1 at 32k tokens, batch x length >= 256k) has the same per-block pattern at more tiles per
// block, so the ratio only rises with the length (the launch's fixed costs, q, out and the
// partials, shrink against the cache): DISABLED_IssueShapes runs them on demand
// (--gtest_also_run_disabled_tests; minutes).
//
// Besides the call's ratio: each launch's own (a combine re-reading its partials moves the call's
// sum by well under 1%, its own ratio by a sixth), and the DRAM bytes: the ideal (every attended
// K/V byte once, q read and out written once) plus, exactly, the splits' fp32 partials written and
// read back and the block table and lengths. SELFATTN_TEST_PROFILE=1 prints each launch's
// resources, bound and limiter.
//
// Planted regressions (issue 35 item 5), each failing Batch1SplitKv at both page sizes:
//   - choose_splits() returning 1 (8 blocks on 132 SMs): ratio 0.185, the split kernel held by
//     shared memory (42.2 us) and the per-SM global path (16.6 us) over DRAM's 7.8 us;
//   - decode_combine reading its partials twice: the call's ratio still 0.997, the combine's own
//     0.83 (sm_global 0.150 us over DRAM's 0.125 us);
//   - (before this test) decode_combine computing each split's weight in all 128 threads, twice:
//     the combine's ratio 0.48, MUFU 0.263 us over DRAM's 0.125 us.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "access_profile.h"
#include "attention_harness.h"
#include "runtime/context_state.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

constexpr int kHeads = 32, kKvHeads = 8, kHeadDim = 128;
constexpr DType kDtype = DType::bf16;
constexpr double kMemoryBound = 0.9;     // DRAM time / total, the issue's criterion

struct SolShape {
  int batch;
  int length;  // every sequence's
  int page_size;
  int num_splits = 0;  // 0: the heuristic's
  std::string name() const {
    return "batch" + std::to_string(batch) + " x " + std::to_string(length) + " page" + std::to_string(page_size) +
           (num_splits ? " splits" + std::to_string(num_splits) : std::string(" auto splits"));
  }
};

struct LaunchSol {
  sim::LaunchProfile profile;
  sim::SpeedOfLight sol;
  double dram_seconds = 0.0;
};

// One call's launches and the criterion's sums.
struct CallSol {
  std::vector<LaunchSol> launches;
  double total_seconds = 0.0;  // sum of the launches' bounds
  double dram_seconds = 0.0;   // sum of their DRAM times
  uint64_t dram_bytes = 0;     // sum of their DRAM floors
  uint64_t ideal_bytes = 0;    // attended K and V, q and out, once each
  unsigned splits = 0;         // the split-KV kernel's grid.x (one row block per group: GQA 4 fits 16 rows)
  double ratio() const { return total_seconds > 0.0 ? dram_seconds / total_seconds : 0.0; }
};

double seconds_of(const sim::SpeedOfLight& s, const std::string& resource) {
  for (const sim::ResourceTime& r : s.resources)
    if (r.resource == resource) return r.seconds;
  ADD_FAILURE() << "no resource " << resource;
  return 0.0;
}

std::string describe(const CallSol& c, const SolShape& s) {
  char line[512];
  std::string text;
  std::snprintf(line, sizeof line,
                "%s: %u splits, DRAM %.4f / total %.4f us = %.3f; DRAM bytes %llu = %.4f x ideal %llu\n",
                s.name().c_str(), c.splits, c.dram_seconds * 1e6, c.total_seconds * 1e6, c.ratio(),
                static_cast<unsigned long long>(c.dram_bytes), double(c.dram_bytes) / double(c.ideal_bytes),
                static_cast<unsigned long long>(c.ideal_bytes));
  text += line;
  for (const LaunchSol& l : c.launches) {
    std::snprintf(line, sizeof line, "  %-28s %6llu blocks, DRAM bytes %11llu:", l.profile.kernel.c_str(),
                  static_cast<unsigned long long>(l.profile.blocks),
                  static_cast<unsigned long long>(l.profile.dram_bytes_lower_bound()));
    text += line;
    for (const sim::ResourceTime& r : l.sol.resources) {
      std::snprintf(line, sizeof line, " %s %.4f", r.resource.c_str(), r.seconds * 1e6);
      text += line;
    }
    std::snprintf(line, sizeof line, " us; bound %.4f us (%s)\n", l.sol.lower_bound_seconds * 1e6, l.sol.limiter.c_str());
    text += line;
  }
  return text;
}

// One attention_with_kv_cache() over a paged pool [num_pages, kv_heads, page_size, d] whose pages
// are handed out shuffled, every sequence `length` long; profiled, and estimated on the H200.
CallSol profile_call(Context& ctx, const SolShape& s) {
  std::mt19937_64 rng(testing::input_seed(s.name()));
  const int pages_per_seq = (s.length + s.page_size - 1) / s.page_size;
  const int num_pages = s.batch * pages_per_seq;
  const size_t pool_elems = size_t(num_pages) * kKvHeads * s.page_size * kHeadDim;
  // The cache's values do not change a count: a constant fill (bf16 0x3c3c, ~0.0115) is quicker
  // than random values for the hundreds of MB of the larger shapes.
  DeviceBuffer<unsigned char> k(ctx, pool_elems * dtype_size(kDtype), "k_pages");
  DeviceBuffer<unsigned char> v(ctx, pool_elems * dtype_size(kDtype), "v_pages");
  k.fill_bytes(0x3c);
  v.fill_bytes(0x3c);
  std::vector<int32_t> table(static_cast<size_t>(num_pages));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  DeviceBuffer<int32_t> block_table(ctx, table.size(), "block_table");
  block_table.copy_from_host(table);
  DeviceBuffer<int32_t> lengths(ctx, size_t(s.batch), "lengths");
  lengths.copy_from_host(std::vector<int32_t>(size_t(s.batch), s.length));
  const size_t q_elems = size_t(s.batch) * kHeads * kHeadDim;
  DeviceBuffer<unsigned char> q = testing::random_device_values(ctx, kDtype, q_elems, rng, "q");
  DeviceBuffer<unsigned char> out(ctx, q_elems * dtype_size(kDtype), "out");

  const KvCache cache = KvCache::paged_pool(
      TensorView::bhsd(k.data(), kDtype, num_pages, kKvHeads, s.page_size, kHeadDim),
      TensorView::bhsd(v.data(), kDtype, num_pages, kKvHeads, s.page_size, kHeadDim), block_table.data(), s.batch,
      pages_per_seq, lengths.data());
  KvAttentionOptions options;
  options.path = Path::fused;
  options.num_splits = s.num_splits;
  const std::vector<sim::LaunchProfile> profiles = testing::profile_launches([&] {
    attention_with_kv_cache(ctx, TensorView::bhsd(q.data(), kDtype, s.batch, kHeads, 1, kHeadDim), cache,
                            TensorView::bhsd(out.data(), kDtype, s.batch, kHeads, 1, kHeadDim), options);
    ctx.synchronize();
  });

  CallSol call;
  for (const sim::LaunchProfile& p : profiles) {
    LaunchSol l{p, sim::estimate(p, sim::gpu_h200()), 0.0};
    l.dram_seconds = seconds_of(l.sol, "dram");
    call.total_seconds += l.sol.lower_bound_seconds;
    call.dram_seconds += l.dram_seconds;
    call.dram_bytes += p.dram_bytes_lower_bound();
    if (p.kernel.rfind("decode_split_kv", 0) == 0) call.splits = p.grid.x;
    call.launches.push_back(l);
  }
  const uint64_t element = dtype_size(kDtype);
  call.ideal_bytes = 2 * uint64_t(s.batch) * uint64_t(s.length) * kKvHeads * kHeadDim * element + 2 * q_elems * element;
  if (testing::print_profiles()) std::printf("%s", describe(call, s).c_str());
  return call;
}

// The DRAM bytes a call cannot avoid beyond the ideal: with more than one split, each split's fp32
// partial O and LSE rows written by the split kernel and read by decode_combine (the split-KV
// design's price, which the heuristic sizes); the block table and lengths; each rounded up to
// whole sectors.
uint64_t expected_extra_bytes(const CallSol& c, const SolShape& s) {
  const auto sectors = [](uint64_t bytes) { return (bytes + 31) / 32 * 32; };
  const uint64_t rows = uint64_t(s.batch) * kHeads;
  const uint64_t partials = c.splits > 1 ? sectors(uint64_t(c.splits) * rows * kHeadDim * 4) + sectors(uint64_t(c.splits) * rows * 4) : 0;
  const uint64_t pages_per_seq = (uint64_t(s.length) + s.page_size - 1) / s.page_size;
  return 2 * partials + sectors(uint64_t(s.batch) * pages_per_seq * 4) + sectors(uint64_t(s.batch) * 4);
}

// The criterion, and the traffic: nothing read or written beyond the ideal but the partials and
// the metadata. Each launch is held to the ratio too, which names the launch that fails (a
// combine re-reading its partials is a rounding error in the call's sum, not in its own).
CallSol expect_memory_bound(Context& ctx, const SolShape& s) {
  const CallSol c = profile_call(ctx, s);
  EXPECT_GE(c.ratio(), kMemoryBound) << describe(c, s);
  for (const LaunchSol& l : c.launches)
    EXPECT_GE(l.dram_seconds, kMemoryBound * l.sol.lower_bound_seconds) << l.profile.kernel << "\n" << describe(c, s);
  EXPECT_GE(c.dram_bytes, c.ideal_bytes) << "an attended byte was never read\n" << describe(c, s);
  // Sector rounding of q and out per head row (256 bytes: none) leaves a few sectors at most.
  EXPECT_LE(c.dram_bytes, c.ideal_bytes + expected_extra_bytes(c, s) + 1024) << describe(c, s);
  EXPECT_GE(c.splits, 1u);
  return c;
}

// The heuristic sees the H200's SM count: the sim reports the same 132.
TEST(DecodeSpeedOfLight, TheSimPlansForTheH200) {
  Context ctx(Backend::sim);
  EXPECT_EQ(unsigned(ctx.state().device->multiprocessor_count()), sim::gpu_h200().sms);
}

// Batch 1: the heuristic splits the 8 (sequence, kv head) groups 33 ways for two waves of 132 SMs,
// as it does at 32k tokens (each split then 8 x the keys); 8192 tokens keep it a few seconds.
TEST(DecodeSpeedOfLight, Batch1SplitKv) {
  Context ctx(Backend::sim);
  for (int page_size : {16, 64}) expect_memory_bound(ctx, SolShape{1, 8192, page_size});
}

// Batch 8: 64 groups, 5 splits (320 blocks), the split count the heuristic gives batch 8 at any
// length from 640 tokens up (8 x 32k included, each split there 32 x the keys).
TEST(DecodeSpeedOfLight, Batch8SplitKv) {
  Context ctx(Backend::sim);
  for (int page_size : {16, 64}) expect_memory_bound(ctx, SolShape{8, 1024, page_size});
}

// DeepSeek's absorbed decode over a latent cache (issue 48 item 6): rows [c_kv 512 | k_rope 64] in
// one bf16 pool of 64-token pages, V the view of their first 512 columns (read with K), one kv
// head, 16 query heads (a tensor-parallel shard) of one new token, 16 sequences of 4096 tokens; the
// heuristic's split count, on the latent kernel. The criterion as above, and the traffic: the
// ideal counts the pool's attended rows once, q and out once; beyond it, only the partials of the
// heuristic's 9 splits (1.12 x the ideal in all) and the metadata. Planted: the two waves' 17
// splits the heuristic gave before it weighed the partials (1.23 x) fail it.
TEST(DecodeSpeedOfLight, LatentCacheAtSixteenHeads) {
  constexpr int kBatch = 16, kLength = 4096, kPage = 64, kLatentHeads = 16, kQk = 576, kV = 512;
  Context ctx(Backend::sim);
  std::mt19937_64 rng(testing::input_seed("latent sixteen heads"));
  const int pages_per_seq = kLength / kPage, num_pages = kBatch * pages_per_seq;
  DeviceBuffer<unsigned char> pool(ctx, size_t(num_pages) * kPage * kQk * dtype_size(kDtype), "latent_pages");
  pool.fill_bytes(0x3c);
  std::vector<int32_t> table(static_cast<size_t>(num_pages));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  DeviceBuffer<int32_t> block_table(ctx, table.size(), "block_table");
  block_table.copy_from_host(table);
  DeviceBuffer<int32_t> lengths(ctx, size_t(kBatch), "lengths");
  lengths.copy_from_host(std::vector<int32_t>(size_t(kBatch), kLength));
  const size_t q_elems = size_t(kBatch) * kLatentHeads * kQk, out_elems = size_t(kBatch) * kLatentHeads * kV;
  DeviceBuffer<unsigned char> q = testing::random_device_values(ctx, kDtype, q_elems, rng, "q");
  DeviceBuffer<unsigned char> out(ctx, out_elems * dtype_size(kDtype), "out");
  const TensorView k = TensorView::bhsd(pool.data(), kDtype, num_pages, 1, kPage, kQk);
  TensorView v = k;
  v.shape[3] = kV;  // the view of K's leading columns
  const KvCache cache = KvCache::paged_pool(k, v, block_table.data(), kBatch, pages_per_seq, lengths.data());
  KvAttentionOptions options;
  options.path = Path::fused;
  const std::vector<sim::LaunchProfile> profiles = testing::profile_launches([&] {
    attention_with_kv_cache(ctx, TensorView::bhsd(q.data(), kDtype, kBatch, kLatentHeads, 1, kQk), cache,
                            TensorView::bhsd(out.data(), kDtype, kBatch, kLatentHeads, 1, kV), options);
    ctx.synchronize();
  });
  double total = 0.0, dram = 0.0;
  uint64_t bytes = 0;
  unsigned splits = 0;
  for (const sim::LaunchProfile& p : profiles) {
    const sim::SpeedOfLight sol = sim::estimate(p, sim::gpu_h200());
    total += sol.lower_bound_seconds;
    dram += seconds_of(sol, "dram");
    bytes += p.dram_bytes_lower_bound();
    if (p.kernel.rfind("decode_latent_mma", 0) == 0) splits = p.grid.x;
  }
  const uint64_t element = dtype_size(kDtype);
  const uint64_t ideal = uint64_t(kBatch) * kLength * kQk * element + (q_elems + out_elems) * element;
  const std::string summary = std::to_string(profiles.size()) + " launches, " + std::to_string(splits) +
                              " splits, DRAM bytes " + std::to_string(bytes) + " (" +
                              std::to_string(double(bytes) / double(ideal)) + " x ideal " + std::to_string(ideal) +
                              "), DRAM " + std::to_string(dram * 1e6) + " of " + std::to_string(total * 1e6) + " us";
  // An eighth of the cache allows 8 splits (its 1152 bytes a key against 16 x 513 fp32 partials
  // written and read per split); one wave of 132 SMs needs 9 (16 sequences x 9 >= 132).
  EXPECT_EQ(splits, 9u) << summary;
  EXPECT_GE(dram, kMemoryBound * total) << summary;
  EXPECT_GE(bytes, ideal) << summary;
  // Beyond the ideal: the partial O and LSE rows (written, then read by decode_combine), the block
  // table and lengths, each in whole sectors.
  const auto sectors = [](uint64_t n) { return (n + 31) / 32 * 32; };
  const uint64_t rows = uint64_t(kBatch) * kLatentHeads;
  const uint64_t partials = sectors(uint64_t(splits) * rows * kV * 4) + sectors(uint64_t(splits) * rows * 4);
  const uint64_t metadata = sectors(uint64_t(num_pages) * 4) + sectors(uint64_t(kBatch) * 4);
  EXPECT_LE(bytes, ideal + 2 * partials + metadata + 1024) << summary;
  if (testing::print_profiles()) std::printf("latent 16 heads: %s\n", summary.c_str());
}

// What the issue names, on demand (all six: 605 s and 1.1 GB of host memory on the shared 2-core
// machine; every one at ratio 1.000, DRAM bytes 1.0000-1.0081 x the ideal):
// batch 1 at 32k tokens, and batch x length = 256k tokens at batch 8 (5 splits) and at batch 64
// (512 groups: 1 split, no combine).
TEST(DecodeSpeedOfLight, DISABLED_IssueShapes) {
  Context ctx(Backend::sim);
  for (int page_size : {16, 64})
    for (const SolShape& s : {SolShape{1, 32768, page_size}, SolShape{8, 32768, page_size}, SolShape{64, 4096, page_size}})
      std::printf("%s", describe(expect_memory_bound(ctx, s), s).c_str());
}

// Any shape on demand, printed: SELFATTN_SOL_SHAPE=batch,length,page_size[,num_splits] with
// --gtest_also_run_disabled_tests --gtest_filter='*Measure'.
TEST(DecodeSpeedOfLight, DISABLED_Measure) {
  const char* spec = std::getenv("SELFATTN_SOL_SHAPE");
  if (spec == nullptr) GTEST_SKIP() << "SELFATTN_SOL_SHAPE=batch,length,page_size[,num_splits]";
  SolShape s{0, 0, 0, 0};
  ASSERT_GE(std::sscanf(spec, "%d,%d,%d,%d", &s.batch, &s.length, &s.page_size, &s.num_splits), 3) << spec;
  Context ctx(Backend::sim);
  const CallSol c = profile_call(ctx, s);
  std::printf("%s", describe(c, s).c_str());
}

}  // namespace
}  // namespace selfattn
