// The fused forward's hot loop held to its ideal on the sim's profiler (issue 35 item 4;
// support/access_profile.h): real attention() calls, bf16 at head dims 64 and 128, 256 queries and
// keys (two query tiles per head and several key tiles, so the steady-state loop with a K/V tile in
// flight runs), on both kernels the fused path ships:
//   - the mma.sync kernel (flash_fwd.cuh; hopper_kernels = false): no bank conflicts at its
//     ldmatrix sites (Q, K, and V .trans from rows padded by 16 bytes) nor at its cp.async
//     destinations (16-byte chunks, a quarter-warp filling one row);
//   - the Hopper kernel (flash_fwd_hopper.cuh): TMA writes and wgmma reads its 128-byte-swizzled
//     tiles, neither of which is a load/store-pipe access (sim/README.md), so its only shared sites
//     are elsewhere; it must have no ldmatrix and no conflicts at any site;
//   - both: Q, K and V read at 4 sectors per 128 bytes asked for (efficiency 1); O written at 8
//     (the named exception: 4 bytes per lane from the mma fragments, see expect_forward_traffic);
//   - both: every query tile reads K and V once and no more (sectors read = query tiles x K/V
//     bytes), and the DRAM floor is within 1.1x of Q + K + V + O + LSE.
// The tiles key_start and q_offset rule out are skipped (KeyStartAndQueryOffsetSkipTiles).
// SELFATTN_TEST_PROFILE=1 prints the profiles.
#include <gtest/gtest.h>

#include <cstdint>
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

struct ForwardShape {
  int batch, heads, seq_q, seq_k, head_dim;
  std::string name() const {
    return "bf16 b" + std::to_string(batch) + " h" + std::to_string(heads) + " q" + std::to_string(seq_q) + " k" +
           std::to_string(seq_k) + " d" + std::to_string(head_dim);
  }
};

const ForwardShape kShapes[] = {{1, 2, 256, 256, 64}, {1, 2, 256, 256, 128}};

// One fused attention() of `shape` (dense BHSD bf16 tensors, LSE on), profiled; its one launch.
// `options` adds masks (its path and lse are set here).
sim::LaunchProfile profile_forward(Context& ctx, const ForwardShape& s, const char* expected_kernel,
                                   AttentionOptions options = {}) {
  std::mt19937_64 rng(testing::input_seed(s.name()));
  const size_t q_elems = size_t(s.batch) * s.heads * s.seq_q * s.head_dim;
  const size_t kv_elems = size_t(s.batch) * s.heads * s.seq_k * s.head_dim;
  DeviceBuffer<unsigned char> q = testing::random_device_values(ctx, DType::bf16, q_elems, rng, "q");
  DeviceBuffer<unsigned char> k = testing::random_device_values(ctx, DType::bf16, kv_elems, rng, "k");
  DeviceBuffer<unsigned char> v = testing::random_device_values(ctx, DType::bf16, kv_elems, rng, "v");
  DeviceBuffer<unsigned char> out(ctx, q_elems * 2, "out");
  DeviceBuffer<float> lse(ctx, size_t(s.batch) * s.heads * s.seq_q, "lse");
  options.path = Path::fused;
  options.lse = lse.data();
  const auto view = [&](const DeviceBuffer<unsigned char>& b, int seq) {
    return TensorView::bhsd(b.data(), DType::bf16, s.batch, s.heads, seq, s.head_dim);
  };
  const std::vector<sim::LaunchProfile> profiles = testing::profile_launches([&] {
    attention(ctx, view(q, s.seq_q), view(k, s.seq_k), view(v, s.seq_k), view(out, s.seq_q), options);
    ctx.synchronize();
  });
  const std::vector<const sim::LaunchProfile*> launches = testing::launches_of(profiles, expected_kernel);
  EXPECT_EQ(launches.size(), 1u) << s.name() << ": launches " << testing::kernel_names(profiles);
  return launches.empty() ? sim::LaunchProfile{} : *launches[0];
}

// Q, K, V read whole sectors; each block reads Q's tile once and K and V once (the per-tile pass);
// the grid's DRAM floor is within 1.1x of the tensors' bytes.
void expect_forward_traffic(const sim::LaunchProfile& p, const ForwardShape& s) {
  for (const char* label : {"q", "k", "v"}) EXPECT_TRUE(reads_fully_used(p, label)) << s.name();
  const uint64_t q_bytes = uint64_t(s.batch) * s.heads * s.seq_q * s.head_dim * 2;
  const uint64_t kv_bytes = uint64_t(s.batch) * s.heads * s.seq_k * s.head_dim * 2;  // each of K, V
  const uint64_t lse_bytes = uint64_t(s.batch) * s.heads * s.seq_q * 4;
  // The grid is (query tiles, heads, batch): every block of a head streams all its keys (no mask).
  const uint64_t query_tiles = p.grid.x;
  EXPECT_EQ(p.blocks, query_tiles * s.heads * s.batch) << s.name();
  EXPECT_EQ(traffic_of(p, "q").read.sectors * 32, q_bytes) << s.name() << "\n" << sim::format_profile(p);
  for (const char* label : {"k", "v"}) {
    const sim::GlobalTraffic r = traffic_of(p, label).read;
    EXPECT_EQ(r.sectors * 32, query_tiles * kv_bytes)
        << s.name() << ": '" << label << "' read beyond one pass per query tile\n" << sim::format_profile(p);
    EXPECT_EQ(r.distinct_sectors * 32, kv_bytes) << s.name() << " " << label;
  }
  // The named exception: the epilogue (flash_store_row) writes O straight from the mma C
  // fragments, a lane's 2 elements (4 bytes) per row, 8 rows per request: 128 bytes in 8 sectors,
  // half of each sector per request. The other half comes from the next instruction, so L2 merges
  // them and DRAM sees each byte once (the floor below); staging O through shared memory for
  // 16-byte stores would cost a barrier and 2 x D x 128 bytes of shared memory per block for an
  // epilogue that runs once.
  const sim::GlobalTraffic o = traffic_of(p, "out").write;
  EXPECT_EQ(o.sectors * 32, 2 * o.bytes_requested) << s.name() << "\n" << sim::format_profile(p);
  EXPECT_EQ(o.distinct_sectors * 32, q_bytes) << s.name();
  const uint64_t tensors = q_bytes + 2 * kv_bytes + q_bytes + lse_bytes;  // Q, K, V, O, LSE
  const double dram_ratio = double(p.dram_bytes_lower_bound()) / double(tensors);
  EXPECT_LE(dram_ratio, 1.1) << s.name() << "\n" << sim::format_profile(p);
  EXPECT_GE(dram_ratio, 1.0) << s.name() << ": the kernel cannot skip a byte of its inputs or outputs";
  if (testing::print_profiles())
    std::printf("%s %s: DRAM floor / (Q + K + V + O + LSE) = %.4f\n", p.kernel.c_str(), s.name().c_str(), dram_ratio);
}

TEST(FusedForwardAccessPattern, MmaSyncKernel) {
  ContextOptions options;
  options.backend = Backend::sim;
  options.hopper_kernels = false;
  Context ctx(options);
  for (const ForwardShape& s : kShapes) {
    const sim::LaunchProfile p = profile_forward(ctx, s, "flash_fwd_kernel");
    EXPECT_TRUE(no_bank_conflicts(p, sim::SharedOp::ldmatrix, "flash_fwd.cuh")) << s.name();
    // flash_load_tile's cp.async: a quarter-warp's 8 chunks are 128 contiguous bytes of one row.
    EXPECT_TRUE(no_bank_conflicts(p, sim::SharedOp::cp_async_dst, "flash_fwd.cuh")) << s.name();
    expect_forward_traffic(p, s);
  }
}

TEST(FusedForwardAccessPattern, HopperKernel) {
  ContextOptions options;
  options.backend = Backend::sim;
  options.hopper_kernels = true;
  Context ctx(options);
  ASSERT_TRUE(ctx.uses_hopper_kernels());
  for (const ForwardShape& s : kShapes) {
    const sim::LaunchProfile p = profile_forward(ctx, s, "flash_fwd_hopper_kernel");
    for (const sim::SharedSite& site : p.shared) {
      EXPECT_NE(site.op, sim::SharedOp::ldmatrix) << site.location << ": wgmma reads its operands itself";
      EXPECT_EQ(site.bank_conflicts(), 0u) << s.name() << " " << site.location << "\n" << sim::format_profile(p);
    }
    expect_forward_traffic(p, s);
  }
}

// The tiles key_start and q_offset rule out are never read (AttentionOptions): K and V's distinct
// bytes are those of the keys a row sees, up to one key tile (<= 128 keys) of rounding. key_start
// runs the mma.sync kernel (the Hopper one takes no key_start), q_offset with a causal mask the
// Hopper kernel.
TEST(FusedForwardAccessPattern, KeyStartAndQueryOffsetSkipTiles) {
  Context ctx;
  ASSERT_TRUE(ctx.uses_hopper_kernels());
  const ForwardShape s{1, 2, 64, 1024, 64};
  const uint64_t key_bytes = uint64_t(s.heads) * s.head_dim * 2;  // one key of every head, of K or V
  const int32_t start = 700, offset = 200;
  DeviceBuffer<int32_t> start_buffer(ctx, 1, "key_start"), offset_buffer(ctx, 1, "q_offset");
  start_buffer.copy_from_host(&start, 1);
  offset_buffer.copy_from_host(&offset, 1);
  struct Case {
    const char* kernel;
    bool key_start, q_offset;
    int first_key, end_key;  // the keys some row sees
  };
  for (const Case& c : {Case{"flash_fwd_kernel", true, false, start, s.seq_k},
                        Case{"flash_fwd_hopper_kernel", false, true, 0, offset + s.seq_q},
                        Case{"flash_fwd_kernel", true, true, start, start + offset + s.seq_q}}) {
    AttentionOptions options;
    options.causal = Causal::bottom_right;
    if (c.key_start) options.key_start = start_buffer.data();
    if (c.q_offset) options.q_offset = offset_buffer.data();
    const sim::LaunchProfile p = profile_forward(ctx, s, c.kernel, options);
    const uint64_t seen = uint64_t(c.end_key - c.first_key) * key_bytes;
    for (const char* label : {"k", "v"}) {
      const uint64_t read = traffic_of(p, label).read.distinct_sectors * 32;
      EXPECT_GE(read, seen) << c.kernel << " " << label << "\n" << sim::format_profile(p);
      EXPECT_LE(read, seen + 2 * 128 * key_bytes) << c.kernel << " " << label << ": read keys no row sees\n"
                                                  << sim::format_profile(p);
    }
  }
}

}  // namespace
}  // namespace selfattn
