// The fused path (flash_fwd.cuh on tensor cores, flash_fwd_simt.cuh in exact fp32) against the
// double-precision reference, on the sim. The shared sweep covers the axes every path is held to;
// the tensor-core cases below add what is particular to the fused kernel: each shipped head dim,
// query tiles that end mid-block, key tiles that end mid-tile, causal tiles that are skipped or
// partly masked, GQA groups, and keys lengths of 0.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "attention_harness.h"
#include "gpu_sized.h"
#include "kernels/registry.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

using testing::AttentionCase;
using testing::Layout;
using testing::make_case;

constexpr DType f32 = DType::f32, f16 = DType::f16, bf16 = DType::bf16;
constexpr Causal none = Causal::none, top_left = Causal::top_left, bottom_right = Causal::bottom_right;
constexpr Layout bhsd = Layout::bhsd, bshd = Layout::bshd;

AttentionCase fused_case(DType dtype, int batch, int heads, int kv_heads, int seq_q, int seq_k, int head_dim,
                         Causal causal, Layout layout, bool lse, std::vector<int32_t> key_lengths = {}) {
  return make_case(dtype, batch, heads, kv_heads, seq_q, seq_k, head_dim, causal, layout, lse, std::move(key_lengths),
                   Path::fused);
}

TEST(FusedPath, SharedSweepFloat32) {
  Context ctx;
  testing::expect_all_pass(ctx, testing::sweep_cases(f32, Path::fused));
}

TEST(FusedPath, SharedSweepFloat16) {
  Context ctx;
  testing::expect_all_pass(ctx, testing::sweep_cases(f16, Path::fused));
}

TEST(FusedPath, SharedSweepBFloat16) {
  Context ctx;
  testing::expect_all_pass(ctx, testing::sweep_cases(bf16, Path::fused));
}

// Every tensor-core instance, with sizes around its tiles (16-row m-tiles, 32/64-row warps,
// 32/64-key tiles): one row, one key, a tile and a bit, odd lengths.
TEST(FusedPath, TensorCoreHeadDims) {
  Context ctx;
  testing::expect_all_pass(
      ctx, {
               fused_case(f16, 1, 2, 1, 113, 64, 32, none, bhsd, true),
               fused_case(bf16, 2, 2, 2, 1, 257, 32, bottom_right, bshd, true, {257, 0}),
               fused_case(f16, 1, 4, 2, 64, 113, 64, top_left, bshd, true),
               fused_case(bf16, 1, 1, 1, 203, 7, 64, bottom_right, bhsd, true),
               fused_case(f16, 2, 1, 1, 7, 203, 96, none, bhsd, false, {203, 33}),
               fused_case(bf16, 1, 3, 1, 113, 113, 96, top_left, bhsd, true),
               fused_case(f16, 1, 2, 2, 129, 65, 128, bottom_right, bshd, true),
               fused_case(bf16, 3, 2, 1, 64, 64, 128, top_left, bhsd, true, {64, 0, 31}),
               fused_case(f16, 1, 1, 1, 2, 1, 128, none, bhsd, true),
               fused_case(f16, 1, 2, 1, 64, 100, 256, top_left, bhsd, true),
               fused_case(bf16, 2, 1, 1, 65, 33, 256, bottom_right, bshd, true, {33, 1}),
           });
}

// The tile sizes of the fused kernel that runs (head_dim, dtype) on ctx, read from the registry:
// query rows per block, the rows of one warp (mma.sync, SIMT) or of one consumer warpgroup (Hopper:
// a block's rows are split between its warpgroups), and keys per K/V tile.
struct FusedTiles {
  int block_rows, warp_rows, block_keys;
};
FusedTiles fused_tiles(Context& ctx, DType dtype, int head_dim) {
  using kernels::Element;
  namespace sim = kernels::sim_target;
  const bool half = dtype != f32;
  if (half && ctx.uses_hopper_kernels() && (head_dim == 64 || head_dim == 128 || head_dim == 256)) {
    const kernels::FlashFwdHopperInstance i =
        head_dim == 64    ? sim::flash_fwd_hopper_instance<Element::f16, 64, 64>()
        : head_dim == 128 ? sim::flash_fwd_hopper_instance<Element::f16, 128, 128>()
                          : sim::flash_fwd_hopper_instance<Element::f16, 256, 256>();
    const int consumer_groups = i.block_threads / 128 - 1;  // one producer warpgroup
    return {i.block_rows, i.block_rows / consumer_groups, i.block_keys};
  }
  kernels::FlashFwdInstance i = sim::flash_fwd_simt_instance(Element::f32, head_dim);
  if (half) {
    switch (head_dim) {
      case 32: i = sim::flash_fwd_instance<Element::f16, 32>(); break;
      case 64: i = sim::flash_fwd_instance<Element::f16, 64>(); break;
      case 96: i = sim::flash_fwd_instance<Element::f16, 96>(); break;
      case 128: i = sim::flash_fwd_instance<Element::f16, 128>(); break;
      case 256: i = sim::flash_fwd_instance<Element::f16, 256>(); break;
      default: break;  // the SIMT kernel
    }
  }
  return {i.block_rows, i.block_rows / (i.block_threads / 32), i.block_keys};
}

// Every remainder of the work division, sized from the tiles of the kernel that runs (so the
// .mma_sync run of this program sizes them from the mma.sync kernel, the default run from the
// Hopper one for head dims 64/128/256): query rows one below, at and one above a block and a
// warp's (warpgroup's) share - the rows past the first warp's, and a last block of one row - and
// keys one below, at and one above a key tile and two, with each causal alignment, so that the
// diagonal crosses a tile edge, and key lengths that end one key into a tile or at its edge.
TEST(FusedPath, EveryTileEdge) {
  Context ctx;
  std::vector<AttentionCase> cases;
  // Each distinct tiling once (head dim 128 tiles as 96 does on mma.sync and as 64 on Hopper); the
  // last two run the SIMT kernel.
  const std::pair<DType, int> kernels[] = {{f16, 32}, {bf16, 64}, {f16, 96}, {bf16, 256}, {f32, 40}, {bf16, 7}};
  for (const auto& [dtype, d] : kernels) {
    const FusedTiles t = fused_tiles(ctx, dtype, d);
    ASSERT_GT(t.block_rows, 0);
    ASSERT_GT(t.block_keys, 0);
    cases.push_back(fused_case(dtype, 1, 2, 1, t.block_rows + 1, t.block_keys - 1, d, none, bhsd, true));
    cases.push_back(fused_case(dtype, 1, 1, 1, t.block_rows - 1, t.block_keys + 1, d, bottom_right, bshd, true));
    cases.push_back(fused_case(dtype, 1, 1, 1, t.block_rows, 2 * t.block_keys, d, top_left, bhsd, true));
    cases.push_back(fused_case(dtype, 2, 2, 2, t.warp_rows + 1, 2 * t.block_keys + 1, d, bottom_right, bshd, true,
                               {t.block_keys + 1, t.block_keys}));
    cases.push_back(fused_case(dtype, 1, 1, 1, t.warp_rows - 1, t.block_keys, d, top_left, bhsd, true));
  }
  testing::expect_all_pass(ctx, cases);
}

// A sliding window whose edges fall at every position of a key tile: with block_keys + 2 rows the
// left edge i' - window_left and the right edge i' + window_right each move one key per row, across
// a whole tile and over both its edges (left edge at keys 1 .. block_keys + 2, right edge at
// block_keys + 1 .. 2 block_keys + 2 below) (so a tile the window only grazes at its first or last key
// is neither skipped nor taken unmasked). Without a causal mask (the window aligned at the last
// key) and with top_left.
TEST(FusedPath, WindowEdgeAtEveryKeyOfATile) {
  Context ctx;
  std::vector<AttentionCase> cases;
  for (const auto& [dtype, d] : {std::pair{f16, 64}, std::pair{bf16, 96}, std::pair{f32, 24}}) {
    const FusedTiles t = fused_tiles(ctx, dtype, d);
    AttentionCase both_edges =
        fused_case(dtype, 1, 2, 1, t.block_keys + 2, 2 * t.block_keys + 2, d, none, bshd, true);
    both_edges.mods.window_left = t.block_keys - 1;
    both_edges.mods.window_right = 1;
    AttentionCase left_edge = fused_case(dtype, 1, 1, 1, t.block_keys + 2, 2 * t.block_keys + 3, d, top_left, bhsd, true);
    left_edge.mods.window_left = 1;
    cases.push_back(both_edges);
    cases.push_back(left_edge);
  }
  testing::expect_all_pass(ctx, cases);
}

// Causal masks where whole key tiles lie beyond the diagonal (skipped) and where a block's rows
// straddle it (masked per element); bottom_right with more queries than keys leaves the first rows
// without any key (output 0, LSE -inf). With seq_k - seq_q = 62, each query block's first row sees
// one key less than a whole number of key tiles (32 or 64 keys): that tile needs the mask for that
// row alone.
TEST(FusedPath, CausalTilesSkippedAndMasked) {
  Context ctx;
  testing::expect_all_pass(
      ctx, {
               fused_case(f16, 1, 1, 1, 66, 128, 64, bottom_right, bhsd, true),
               fused_case(bf16, 1, 1, 1, 130, 192, 32, bottom_right, bshd, true),
               fused_case(f16, 1, 1, 1, 257, 257, 64, top_left, bhsd, true),
               fused_case(bf16, 1, 1, 1, 203, 64, 128, bottom_right, bhsd, true),
               fused_case(f16, 1, 2, 1, 64, 203, 128, top_left, bshd, true),
               fused_case(f16, 1, 1, 1, 113, 7, 32, bottom_right, bhsd, true, {5}),
               fused_case(f32, 1, 1, 1, 113, 7, 32, bottom_right, bhsd, true, {5}),
               fused_case(f32, 1, 2, 1, 70, 203, 64, top_left, bshd, true),
           });
}

// Scores that rise slowly along each row (Keys::rising): the running maximum grows a little at
// every key tile, so the online softmax rescales O by a factor just below 1 each time - which
// random keys almost never do - and many key tiles let a wrong rescale accumulate. Tensor-core
// kernels in both dtypes, and the SIMT kernel.
TEST(FusedPath, RisingScoresRescaleAtEveryTile) {
  Context ctx;
  std::vector<AttentionCase> cases = {
      fused_case(f16, 1, 1, 1, 64, 640, 64, none, bhsd, true),
      fused_case(bf16, 1, 1, 1, 16, 640, 128, bottom_right, bshd, true),
      fused_case(f32, 1, 1, 1, 33, 640, 32, none, bhsd, true),
  };
  for (AttentionCase& c : cases) c.keys = testing::Keys::rising;
  testing::expect_all_pass(ctx, cases);
}

// Head dims without a tensor-core instance go to the SIMT kernel in every dtype.
TEST(FusedPath, SimtForOtherHeadDims) {
  Context ctx;
  testing::expect_all_pass(ctx, {
                                    fused_case(f16, 1, 2, 1, 33, 70, 80, top_left, bhsd, true),
                                    fused_case(bf16, 2, 1, 1, 7, 64, 7, none, bshd, true, {3, 64}),
                                    fused_case(f32, 1, 1, 1, 40, 40, 256, bottom_right, bhsd, true),
                                    fused_case(f32, 1, 1, 1, 9, 33, 200, none, bhsd, true),
                                });
}

// Batch 1 of every tensor starts 2^31 elements after batch 0: element offsets need 64 bits.
// On the sim, which reserves the 2^31-element gaps without touching them; a GPU would need ~40 GB.
TEST(FusedPath, OffsetsPast32Bits) {
  Context ctx(Backend::sim);
  AttentionCase tensor_core = fused_case(f16, 2, 2, 1, 70, 40, 64, top_left, bshd, true);
  AttentionCase simt = fused_case(f32, 2, 1, 1, 5, 9, 7, none, bhsd, true);
  tensor_core.batch_gap = simt.batch_gap = int64_t(1) << 31;
  testing::expect_all_pass(ctx, {tensor_core, simt});
}

// Rows farther apart than head_dim (a slice of a packed QKV projection): a gap of 8 elements keeps
// rows on 16 bytes (tensor cores), a gap of 3 does not (the SIMT kernel takes f16/bf16 then).
TEST(FusedPath, RowGaps) {
  Context ctx;
  AttentionCase aligned = fused_case(bf16, 1, 2, 2, 33, 65, 128, bottom_right, bhsd, true);
  aligned.row_gap = 8;
  AttentionCase unaligned = fused_case(f16, 2, 2, 1, 20, 50, 64, top_left, bshd, true, {50, 17});
  unaligned.row_gap = 3;
  AttentionCase single = fused_case(f32, 1, 1, 1, 9, 40, 32, none, bhsd, false);
  single.row_gap = 5;
  testing::expect_all_pass(ctx, {aligned, unaligned, single});
}

TEST(FusedPath, ExplicitScale) {
  Context ctx;
  AttentionCase a = fused_case(f16, 1, 2, 1, 64, 113, 64, top_left, bhsd, true);
  a.scale = 0.9f;
  AttentionCase b = fused_case(f32, 1, 1, 1, 33, 40, 16, none, bhsd, true);
  b.scale = 2.0f;
  testing::expect_all_pass(ctx, {a, b});
}

TEST(FusedPath, AutomaticPicksFusedForEveryDtype) {
  Context ctx;
  for (DType dtype : {f32, f16, bf16}) {
    for (int head_dim : {7, 64, 128, 256}) {
      alignas(16) static unsigned char memory[4][1 << 16];
      const TensorView q = TensorView::bhsd(memory[0], dtype, 1, 2, 16, head_dim);
      const TensorView k = TensorView::bhsd(memory[1], dtype, 1, 2, 16, head_dim);
      EXPECT_EQ(resolve_path(ctx, q, k, k), Path::fused) << to_string(dtype) << " head_dim " << head_dim;
    }
  }
}

// The dispatch table's tile shapes are what the host launches with; the tensor-core kernels need
// whole 16-row m-tiles per warp and fit in the sim's (and H200's) 227 KB of shared memory.
TEST(FusedPath, InstancesAreConsistent) {
  using kernels::Element;
  const kernels::FlashFwdInstance instances[] = {
      kernels::sim_target::flash_fwd_instance<Element::f16, 32>(),
      kernels::sim_target::flash_fwd_instance<Element::f16, 64>(),
      kernels::sim_target::flash_fwd_instance<Element::f16, 96>(),
      kernels::sim_target::flash_fwd_instance<Element::bf16, 128>(),
      kernels::sim_target::flash_fwd_instance<Element::bf16, 256>(),
      kernels::sim_target::flash_fwd_simt_instance(Element::f32, 256),
      kernels::sim_target::flash_fwd_simt_instance(Element::f16, 1),
  };
  for (const kernels::FlashFwdInstance& instance : instances) {
    EXPECT_TRUE(instance.kernel);
    EXPECT_EQ(instance.block_threads % 32, 0);
    EXPECT_EQ(instance.block_rows % 16, 0);
    EXPECT_LE(instance.smem_bytes, size_t(227) * 1024);
  }
  EXPECT_FALSE(kernels::sim_target::flash_fwd_simt_instance(Element::f32, 257).kernel);
  EXPECT_FALSE(kernels::sim_target::flash_fwd_simt_instance(Element::f32, 0).kernel);
}

// GPU-sized (support/gpu_sized.h): every tensor-core head dim over many query blocks and key tiles.
using FusedPathOnGpu = testing::GpuSized<>;

TEST_F(FusedPathOnGpu, EveryTensorCoreHeadDimLarger) {
  std::vector<testing::AttentionCase> cases;
  const Causal causals[] = {Causal::none, Causal::top_left, Causal::bottom_right};
  int i = 0;
  for (DType dtype : {DType::f16, DType::bf16}) {
    for (int head_dim : {32, 64, 96, 128, 256}) {
      const Causal causal = causals[i % 3];
      const Layout layout = i % 2 ? Layout::bshd : Layout::bhsd;
      cases.push_back(make_case(dtype, 2, 4, 2, 517, 1000, head_dim, causal, layout, true, {1000, 301}, Path::fused));
      cases.push_back(make_case(dtype, 1, 2, 1, 1024, 777, head_dim, causals[(i + 1) % 3], layout, true, {}, Path::fused));
      ++i;
    }
  }
  cases.push_back(make_case(DType::f32, 2, 2, 1, 300, 700, 128, Causal::top_left, Layout::bshd, true, {700, 0}, Path::fused));
  cases.push_back(make_case(DType::f32, 1, 2, 2, 257, 513, 256, Causal::none, Layout::bhsd, true, {}, Path::fused));
  testing::expect_all_pass(ctx, cases);
}

}  // namespace
}  // namespace selfattn
