// The fused backward's hot loops held to their ideal on the sim's profiler (issue 35 item 4;
// support/access_profile.h): real attention_backward() calls on the fused path, bf16 at head dims
// 64 and 128, 256 queries and keys (several key blocks, and query tiles streaming through each),
// in both modes:
//   - default: flash_bwd_dkdv.cuh with its dQ part (dS^T staged in shared memory, dQ added to an
//     fp32 accumulator);
//   - deterministic: flash_bwd_dkdv.cuh without it, then flash_bwd_dq.cuh (dQ per query tile).
// Held: no bank conflicts at any ldmatrix site (rows padded by 16 bytes), cp.async destination
// (16-byte chunks, a quarter-warp filling one row) or the dS^T store; Q, K, V and dO read at 4
// sectors per 128 bytes asked for (efficiency 1); K and V read once per key block by dK/dV, and
// once per query tile by dQ.
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

struct BackwardShape {
  int batch, heads, seq, head_dim;
  std::string name() const {
    return "bf16 b" + std::to_string(batch) + " h" + std::to_string(heads) + " s" + std::to_string(seq) + " d" +
           std::to_string(head_dim);
  }
};

const BackwardShape kShapes[] = {{1, 2, 256, 64}, {1, 2, 256, 128}};

// attention() for out and the LSE, then one fused attention_backward(), profiled alone.
std::vector<sim::LaunchProfile> profile_backward(Context& ctx, const BackwardShape& s, bool deterministic) {
  std::mt19937_64 rng(testing::input_seed(s.name()));
  const size_t elems = size_t(s.batch) * s.heads * s.seq * s.head_dim;
  DeviceBuffer<unsigned char> q = testing::random_device_values(ctx, DType::bf16, elems, rng, "q");
  DeviceBuffer<unsigned char> k = testing::random_device_values(ctx, DType::bf16, elems, rng, "k");
  DeviceBuffer<unsigned char> v = testing::random_device_values(ctx, DType::bf16, elems, rng, "v");
  DeviceBuffer<unsigned char> dout = testing::random_device_values(ctx, DType::bf16, elems, rng, "dout");
  DeviceBuffer<unsigned char> out(ctx, elems * 2, "out"), dq(ctx, elems * 2, "dq"), dk(ctx, elems * 2, "dk"),
      dv(ctx, elems * 2, "dv");
  DeviceBuffer<float> lse(ctx, size_t(s.batch) * s.heads * s.seq, "lse");
  const auto view = [&](const DeviceBuffer<unsigned char>& b) {
    return TensorView::bhsd(b.data(), DType::bf16, s.batch, s.heads, s.seq, s.head_dim);
  };
  AttentionOptions options;
  options.path = Path::fused;
  options.lse = lse.data();
  attention(ctx, view(q), view(k), view(v), view(out), options);
  options.lse = nullptr;
  BackwardOptions backward;
  backward.deterministic = deterministic;
  return testing::profile_launches([&] {
    attention_backward(ctx, view(q), view(k), view(v), view(out), view(dout), lse.data(), view(dq), view(dk), view(dv),
                       options, backward);
    ctx.synchronize();
  });
}

const sim::LaunchProfile* only_launch(const std::vector<sim::LaunchProfile>& profiles, const std::string& kernel) {
  const std::vector<const sim::LaunchProfile*> launches = testing::launches_of(profiles, kernel);
  EXPECT_EQ(launches.size(), 1u) << kernel << " among " << testing::kernel_names(profiles);
  return launches.size() == 1 ? launches[0] : nullptr;
}

// A kernel's shared sites of the kinds its hot loop uses, all at their ideal, in `file`.
void expect_conflict_free(const sim::LaunchProfile& p, const std::string& file, const BackwardShape& s) {
  EXPECT_TRUE(no_bank_conflicts(p, sim::SharedOp::ldmatrix, file)) << s.name();
  EXPECT_TRUE(no_bank_conflicts(p, sim::SharedOp::cp_async_dst, file)) << s.name();
}

// dK/dV: each block (grid.x key blocks per head) reads its K and V rows once, and streams Q and dO.
void expect_dkdv_traffic(const sim::LaunchProfile& p, const BackwardShape& s) {
  for (const char* label : {"q", "k", "v", "dout"}) EXPECT_TRUE(reads_fully_used(p, label)) << s.name();
  const uint64_t bytes = uint64_t(s.batch) * s.heads * s.seq * s.head_dim * 2;
  for (const char* label : {"k", "v"})
    EXPECT_EQ(traffic_of(p, label).read.sectors * 32, bytes) << s.name() << " " << label << "\n"
                                                              << sim::format_profile(p);
  // The named exception, as the forward's O (test_fused_access_pattern.cpp): dK and dV go from
  // the mma C fragments, 4 bytes per lane and row, 8 sectors per 128-byte request, each byte once.
  for (const char* label : {"dk", "dv"}) {
    const sim::GlobalTraffic w = traffic_of(p, label).write;
    EXPECT_EQ(w.sectors * 32, 2 * w.bytes_requested) << s.name() << " " << label;
    EXPECT_EQ(w.distinct_sectors * 32, bytes) << s.name() << " " << label;
  }
  // Without a mask every key block streams every query tile: Q and dO once per key block.
  for (const char* label : {"q", "dout"})
    EXPECT_EQ(traffic_of(p, label).read.sectors * 32, uint64_t(p.grid.x) * bytes) << s.name() << " " << label;
}

TEST(FusedBackwardAccessPattern, DkDvWithDqAccumulation) {
  Context ctx(Backend::sim);
  for (const BackwardShape& s : kShapes) {
    const std::vector<sim::LaunchProfile> profiles = profile_backward(ctx, s, /*deterministic=*/false);
    const sim::LaunchProfile* dkdv = only_launch(profiles, "flash_bwd_dkdv_kernel");
    if (dkdv == nullptr) continue;
    expect_conflict_free(*dkdv, "flash_bwd_dkdv.cuh", s);
    // The dS^T tile written for dQ = dS K: a lane's 4-byte pair, rows padded by 16 bytes.
    EXPECT_TRUE(no_bank_conflicts(*dkdv, sim::SharedOp::store, "flash_bwd_dkdv.cuh")) << s.name();
    expect_dkdv_traffic(*dkdv, s);
  }
}

TEST(FusedBackwardAccessPattern, DeterministicDq) {
  Context ctx(Backend::sim);
  for (const BackwardShape& s : kShapes) {
    const std::vector<sim::LaunchProfile> profiles = profile_backward(ctx, s, /*deterministic=*/true);
    const sim::LaunchProfile* dkdv = only_launch(profiles, "flash_bwd_dkdv_kernel");
    const sim::LaunchProfile* dq = only_launch(profiles, "flash_bwd_dq_kernel");
    if (dkdv == nullptr || dq == nullptr) continue;
    expect_conflict_free(*dkdv, "flash_bwd_dkdv.cuh", s);
    expect_dkdv_traffic(*dkdv, s);
    expect_conflict_free(*dq, "flash_bwd_dq.cuh", s);
    for (const char* label : {"q", "k", "v", "dout"}) EXPECT_TRUE(reads_fully_used(*dq, label)) << s.name();
    // dQ: each query tile (grid.x per head) streams every key once.
    const uint64_t bytes = uint64_t(s.batch) * s.heads * s.seq * s.head_dim * 2;
    for (const char* label : {"k", "v"})
      EXPECT_EQ(traffic_of(*dq, label).read.sectors * 32, uint64_t(dq->grid.x) * bytes) << s.name() << " " << label;
  }
}

}  // namespace
}  // namespace selfattn
