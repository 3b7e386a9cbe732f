// The split-KV decode kernels held to their ideal on the sim's profiler (issue 35 items 4 and 5;
// support/access_profile.h): real attention_with_kv_cache() calls over a paged cache (pages
// shuffled in the pool, lengths that end inside a page, GQA 4, one new row), at page sizes 1, 16
// and 64, on both kernels:
//   - decode_split_kv_mma (f16/bf16, head dims 64 and 128): no bank conflicts at its ldmatrix
//     sites (K, and V .trans, from rows padded by 16 bytes) nor at its staging stores;
//   - decode_split_kv (SIMT, everything else; here f32 head dim 64): no bank conflicts in its
//     loops over the staged tile (the dot products and P V) nor at its staging stores, but for
//     one named exception: K's 4-byte stores into rows padded by one float, 2-way (below);
//   - both: the K and V pools read at 4 sectors per 128 bytes asked for (efficiency 1), and each
//     byte of the cache a call attends read once: distinct sectors x 32 / attended bytes <= 1.05
//     (the DRAM floor) and, with one block per (sequence, kv head, split), total sectors too (no
//     block re-reads a key).
// SELFATTN_TEST_PROFILE=1 prints the profiles and the ratios.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "access_profile.h"
#include "attention_harness.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

using testing::no_bank_conflicts;
using testing::reads_fully_used;
using testing::traffic_of;

struct DecodeShape {
  DType dtype;
  int head_dim;
  int page_size;
  int num_splits;
  std::vector<int32_t> lengths;  // per sequence
  int kv_heads = 2, heads_per_kv = 4;
  std::string name() const {
    std::string lens;
    for (int32_t l : lengths) lens += (lens.empty() ? "" : ",") + std::to_string(l);
    return std::string(to_string(dtype)) + " d" + std::to_string(head_dim) + " page" + std::to_string(page_size) +
           " splits" + std::to_string(num_splits) + " lengths=[" + lens + "]";
  }
};

struct DecodeRun {
  sim::LaunchProfile decode;  // the split-KV kernel's launch
  uint64_t attended_bytes = 0;  // of K (and as many of V): the rows the lengths cover, every kv head
};

// One attention_with_kv_cache() over a paged pool [num_pages, kv_heads, page_size, d] whose pages
// are handed out in a shuffled order; profiled.
DecodeRun profile_decode(Context& ctx, const DecodeShape& s, const std::string& kernel) {
  std::mt19937_64 rng(testing::input_seed(s.name()));
  const int batch = int(s.lengths.size());
  const int max_length = *std::max_element(s.lengths.begin(), s.lengths.end());
  const int pages_per_seq = (max_length + s.page_size - 1) / s.page_size;
  const int num_pages = batch * pages_per_seq;
  const size_t pool_elems = size_t(num_pages) * s.kv_heads * s.page_size * s.head_dim;
  DeviceBuffer<unsigned char> k = testing::random_device_values(ctx, s.dtype, pool_elems, rng, "k_pages");
  DeviceBuffer<unsigned char> v = testing::random_device_values(ctx, s.dtype, pool_elems, rng, "v_pages");
  std::vector<int32_t> table(static_cast<size_t>(num_pages));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  DeviceBuffer<int32_t> block_table(ctx, table.size(), "block_table");
  block_table.copy_from_host(table);
  DeviceBuffer<int32_t> lengths(ctx, s.lengths.size(), "lengths");
  lengths.copy_from_host(s.lengths);
  const int heads = s.kv_heads * s.heads_per_kv;
  const size_t q_elems = size_t(batch) * heads * s.head_dim;
  DeviceBuffer<unsigned char> q = testing::random_device_values(ctx, s.dtype, q_elems, rng, "q");
  DeviceBuffer<unsigned char> out(ctx, q_elems * dtype_size(s.dtype), "out");

  const KvCache cache = KvCache::paged_pool(
      TensorView::bhsd(k.data(), s.dtype, num_pages, s.kv_heads, s.page_size, s.head_dim),
      TensorView::bhsd(v.data(), s.dtype, num_pages, s.kv_heads, s.page_size, s.head_dim), block_table.data(), batch,
      pages_per_seq, lengths.data());
  KvAttentionOptions options;
  options.path = Path::fused;
  options.num_splits = s.num_splits;
  const std::vector<sim::LaunchProfile> profiles = testing::profile_launches([&] {
    attention_with_kv_cache(ctx, TensorView::bhsd(q.data(), s.dtype, batch, heads, 1, s.head_dim), cache,
                            TensorView::bhsd(out.data(), s.dtype, batch, heads, 1, s.head_dim), options);
    ctx.synchronize();
  });
  const std::vector<const sim::LaunchProfile*> launches = testing::launches_of(profiles, kernel);
  EXPECT_EQ(launches.size(), 1u) << s.name() << ": launches " << testing::kernel_names(profiles);
  DecodeRun run;
  if (!launches.empty()) run.decode = *launches[0];
  const int64_t keys = std::accumulate(s.lengths.begin(), s.lengths.end(), int64_t(0));
  run.attended_bytes = uint64_t(keys) * s.kv_heads * s.head_dim * dtype_size(s.dtype);
  return run;
}

// The pools read in whole sectors, each attended byte once.
void expect_cache_read_once(const DecodeRun& run, const DecodeShape& s) {
  const sim::LaunchProfile& p = run.decode;
  for (const char* label : {"k_pages", "v_pages"}) {
    EXPECT_TRUE(reads_fully_used(p, label)) << s.name();
    const sim::GlobalTraffic r = traffic_of(p, label).read;
    const double distinct_ratio = double(r.distinct_sectors * 32) / double(run.attended_bytes);
    const double total_ratio = double(r.sectors * 32) / double(run.attended_bytes);
    // A byte of the cache not attended in a sector the call must read would raise it above 1.
    EXPECT_LE(distinct_ratio, 1.05) << s.name() << " " << label << "\n" << sim::format_profile(p);
    EXPECT_GE(distinct_ratio, 1.0) << s.name() << " " << label << ": an attended byte was never read";
    // The GQA group's 4 query heads share one block (16 rows) and each split its own keys: no
    // block reads a key another one reads.
    EXPECT_LE(total_ratio, 1.05) << s.name() << " " << label << ": keys read more than once\n"
                                 << sim::format_profile(p);
    if (testing::print_profiles())
      std::printf("%s %s %s: distinct sectors / attended bytes = %.4f, all sectors / attended = %.4f\n",
                  p.kernel.c_str(), s.name().c_str(), label, distinct_ratio, total_ratio);
  }
}

// Lengths that end inside a page at every page size, and a second sequence of another length.
const std::vector<int32_t> kLengths = {200, 131};

TEST(DecodeAccessPattern, MmaKernel) {
  Context ctx(Backend::sim);
  for (int head_dim : {64, 128})
    for (int page_size : {1, 16, 64}) {
      const DecodeShape s{DType::bf16, head_dim, page_size, page_size == 16 ? 2 : 1, kLengths};
      const DecodeRun run = profile_decode(ctx, s, "decode_split_kv_mma<bf16," + std::to_string(head_dim) + ">");
      const sim::LaunchProfile& p = run.decode;
      EXPECT_TRUE(no_bank_conflicts(p, sim::SharedOp::ldmatrix, "mma_tile.cuh")) << s.name();
      EXPECT_TRUE(no_bank_conflicts(p, sim::SharedOp::store, "decode_split_kv_mma.cuh")) << s.name();
      expect_cache_read_once(run, s);
    }
}

TEST(DecodeAccessPattern, SimtKernel) {
  Context ctx(Backend::sim);
  for (int page_size : {1, 16, 64}) {
    const DecodeShape s{DType::f32, 64, page_size, page_size == 16 ? 2 : 1, kLengths};
    const DecodeRun run = profile_decode(ctx, s, "decode_split_kv<f32>");
    const sim::LaunchProfile& p = run.decode;
    EXPECT_TRUE(no_bank_conflicts(p, sim::SharedOp::load, "decode_split_kv.cuh")) << s.name();
    // The staging stores: V's 16-byte vectors conflict-free; K's rows padded by one float (what
    // keeps the dot products' column reads above conflict-free) forbid vectors, and its 4-byte
    // stores, a lane's 4 consecutive words, go 2-way. The named exception: one store site at
    // most 2-way (wavefronts <= 2 x ideal), every other at its ideal.
    int conflicted_sites = 0;
    for (const sim::SharedSite& site : testing::sites_of(p, sim::SharedOp::store, "decode_split_kv.cuh")) {
      if (site.bank_conflicts() == 0) continue;
      ++conflicted_sites;
      EXPECT_LE(site.wavefronts, 2 * site.ideal_wavefronts) << s.name() << " " << site.location << "\n"
                                                            << sim::format_profile(p);
    }
    EXPECT_LE(conflicted_sites, 1) << s.name() << "\n" << sim::format_profile(p);
    expect_cache_read_once(run, s);
  }
}

}  // namespace
}  // namespace selfattn
