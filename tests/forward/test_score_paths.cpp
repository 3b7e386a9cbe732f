// The two paths that hold the score matrix in the workspace, naive (tiled Q K^T, softmax rows, tiled
// P V) and cublas (batched GEMMs - the sim GEMM here - with the same softmax kernel between), against
// the double-precision reference on the sim: the harness's sweep per dtype (every value of each axis,
// not the cross product), the long rows that take the streaming softmax, 64-bit offsets, varlen, an
// explicit scale, and chunking under a small workspace. Each test runs once per path.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "attention_harness.h"
#include "gpu_sized.h"
#include "kernels/registry.h"
#include "runtime/context_state.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

using testing::AttentionCase;
using testing::Layout;
using testing::make_case;

class ScorePath : public ::testing::TestWithParam<Path> {
 protected:
  Path path() const { return GetParam(); }
};

TEST_P(ScorePath, SweepFloat32) {
  Context ctx;
  testing::expect_all_pass(ctx, testing::sweep_cases(DType::f32, path()));
}
TEST_P(ScorePath, SweepFloat16) {
  Context ctx;
  testing::expect_all_pass(ctx, testing::sweep_cases(DType::f16, path()));
}
TEST_P(ScorePath, SweepBFloat16) {
  Context ctx;
  testing::expect_all_pass(ctx, testing::sweep_cases(DType::bf16, path()));
}

// Rows longer than the cached limit (256 threads x 8 keys) take the streaming softmax. With rising
// scores (Keys::rising) each thread's running maximum grows a little at every key it reads, so its
// running sum is rescaled by factors just below 1 throughout the row.
TEST_P(ScorePath, LongRowsStreamingSoftmax) {
  Context ctx;
  AttentionCase rising = make_case(DType::f32, 1, 1, 1, 16, 4100, 16, Causal::none, Layout::bhsd, true, {}, path());
  rising.keys = testing::Keys::rising;
  testing::expect_all_pass(ctx, {
      make_case(DType::f32, 1, 1, 1, 7, 4100, 2, Causal::none, Layout::bhsd, true, {}, path()),
      make_case(DType::bf16, 1, 2, 1, 3, 2100, 16, Causal::bottom_right, Layout::bshd, true, {2099}, path()),
      rising,
  });
}

// Every remainder of the score paths' work division, from the kernels' tiles in the registry: the
// tiled Q K^T (query rows and keys per block: naive) and P V (query rows per block), tensor-core
// (f16, d32) and SIMT (f32, d7) variants, rows one past the softmax's rows per block, a sliding
// window whose edges sweep a whole key tile and both its edges (left edges at keys 1 .. tile + 2)
// or start at a key tile's last key for every row tile,
// and row lengths one below and at each change of the softmax's row group (warp-cached,
// block-cached, streaming: where softmax_rows_instance picks another kernel).
TEST_P(ScorePath, EveryTileEdge) {
  using kernels::Element;
  namespace sim = kernels::sim_target;
  Context ctx;
  std::vector<AttentionCase> cases;
  for (const auto& [dtype, element, d] : {std::tuple{DType::f16, Element::f16, 32}, std::tuple{DType::f32, Element::f32, 7}}) {
    const kernels::TiledKernel qk = sim::qk_tiled_instance(element, d), pv = sim::pv_tiled_instance(element, d);
    const int softmax_rows = sim::softmax_rows_instance(Element::f32, qk.tile_cols).rows_per_block;
    ASSERT_GT(qk.tile_rows, 0);
    ASSERT_GT(qk.tile_cols, 0);
    ASSERT_GT(pv.tile_rows, 0);
    ASSERT_GT(softmax_rows, 0);
    cases.push_back(make_case(dtype, 1, 2, 1, qk.tile_rows + 1, qk.tile_cols - 1, d, Causal::none, Layout::bhsd, true,
                              {}, path()));
    cases.push_back(make_case(dtype, 1, 1, 1, pv.tile_rows - 1, qk.tile_cols + 1, d, Causal::bottom_right,
                              Layout::bshd, true, {}, path()));
    cases.push_back(make_case(dtype, 2, 1, 1, softmax_rows + 1, 2 * qk.tile_cols, d, Causal::top_left, Layout::bhsd,
                              true, {qk.tile_cols + 1, qk.tile_cols}, path()));
    AttentionCase window = make_case(dtype, 1, 2, 2, qk.tile_cols + 2, 2 * qk.tile_cols + 2, d, Causal::none,
                                     Layout::bshd, true, {}, path());
    window.mods.window_left = qk.tile_cols - 1;
    window.mods.window_right = 1;
    cases.push_back(window);
    // Row tiles skip key tiles by their first row's window: window_left 1 under top_left starts row
    // r's window at key r - 1, a key tile's last key for every row tile starting on a tile edge.
    AttentionCase left_edge = make_case(dtype, 1, 1, 1, 2 * std::max(qk.tile_cols, qk.tile_rows) + 2,
                                        2 * std::max(qk.tile_cols, qk.tile_rows) + 2, d, Causal::top_left,
                                        Layout::bhsd, true, {}, path());
    left_edge.mods.window_left = 1;
    cases.push_back(left_edge);
  }
  // The softmax's row groups, by the row lengths at which the registry changes kernel.
  for (int seq_k = 2; seq_k <= 4096; ++seq_k) {
    const kernels::SoftmaxKernel before = sim::softmax_rows_instance(Element::f32, seq_k - 1),
                                 at = sim::softmax_rows_instance(Element::f32, seq_k);
    if (before.kernel.sim_entry == at.kernel.sim_entry && before.threads == at.threads) continue;
    for (int keys : {seq_k - 1, seq_k})
      cases.push_back(make_case(DType::f32, 1, 1, 1, std::max(before.rows_per_block, at.rows_per_block) + 1, keys, 2,
                                Causal::bottom_right, Layout::bhsd, true, {}, path()));
  }
  testing::expect_all_pass(ctx, cases);
}

// Batch 1 of every tensor starts 2^31 elements after batch 0: element offsets need 64 bits. On the
// sim, which reserves the gap without touching it; a GPU would need about 40 GB.
TEST_P(ScorePath, OffsetsPast32Bits) {
  Context ctx(Backend::sim);
  AttentionCase half = make_case(DType::f16, 2, 2, 1, 7, 64, 32, Causal::top_left, Layout::bshd, true, {}, path());
  AttentionCase single = make_case(DType::f32, 2, 1, 1, 5, 9, 7, Causal::none, Layout::bhsd, false, {}, path());
  half.batch_gap = single.batch_gap = int64_t(1) << 31;
  testing::expect_all_pass(ctx, {half, single});
}

// Variable-length batches run sequence by sequence: empty sequences, sequences without keys, GQA,
// both layouts, each checked against the reference on that sequence alone.
TEST_P(ScorePath, VariableLengthSequences) {
  Context ctx;
  using testing::VarlenCase;
  const std::vector<VarlenCase> cases = {
      {DType::f32, 2, 1, 7, {7, 0, 64}, {70, 9, 0}, Causal::bottom_right, Layout::bshd, true, path()},
      {DType::f16, 4, 2, 64, {33, 1, 113}, {33, 100, 7}, Causal::top_left, Layout::bshd, true, path()},
      {DType::bf16, 2, 2, 32, {17, 40}, {50, 0}, Causal::none, Layout::bhsd, true, path()},
      {DType::f16, 1, 1, 80, {129, 3}, {0, 203}, Causal::none, Layout::bshd, false, path()},
      // Views longer than cu_seqlens says (a batch padded to a bucket): NaN rows nobody owns, which
      // out and lse must leave unwritten.
      {DType::bf16, 2, 1, 32, {9, 0, 20}, {30, 4, 11}, Causal::bottom_right, Layout::bhsd, true, path(), 0,
       testing::Strides::distinct, 6, 5},
  };
  for (const VarlenCase& c : cases) EXPECT_TRUE(testing::check_attention_varlen(ctx, c));
}

TEST_P(ScorePath, ExplicitScale) {
  Context ctx;
  AttentionCase c = make_case(DType::f32, 1, 2, 1, 64, 113, 32, Causal::top_left, Layout::bhsd, true, {}, path());
  c.scale = 0.5f;
  testing::expect_all_pass(ctx, {c});
}

// A workspace limit far below the problem forces chunks over heads, then over rows of one head.
TEST_P(ScorePath, ChunkedByWorkspaceLimit) {
  ContextOptions options;
  options.workspace_limit = 64 * 1024;  // 64 KB: about 80 rows of 203 keys, far below either whole problem
  Context ctx(options);
  testing::expect_all_pass(ctx, {
      // whole heads per chunk
      make_case(DType::f32, 2, 4, 2, 30, 203, 32, Causal::bottom_right, Layout::bhsd, true, {203, 100}, path()),
      // row ranges of one head
      make_case(DType::f16, 1, 2, 1, 257, 203, 64, Causal::top_left, Layout::bshd, true, {}, path()),
  });
  EXPECT_LE(ctx.workspace_bytes(), options.workspace_limit);
}

// Only a single row too long for the limit is an error, and it names the limit.
TEST_P(ScorePath, RowTooLongForWorkspaceNamesTheLimit) {
  ContextOptions options;
  options.workspace_limit = 1024;  // 256 fp32 scores: less than one row of 1000 keys
  Context ctx(options);
  DeviceBuffer<float> q(ctx, 2 * 2), k(ctx, 1000 * 2), v(ctx, 1000 * 2), out(ctx, 2 * 2);
  AttentionOptions attention_options;
  attention_options.path = path();
  try {
    attention(ctx, TensorView::bhsd(q.data(), DType::f32, 1, 1, 2, 2), TensorView::bhsd(k.data(), DType::f32, 1, 1, 1000, 2),
              TensorView::bhsd(v.data(), DType::f32, 1, 1, 1000, 2), TensorView::bhsd(out.data(), DType::f32, 1, 1, 2, 2),
              attention_options);
    FAIL() << "expected WorkspaceTooSmall";
  } catch (const WorkspaceTooSmall& e) {
    EXPECT_NE(std::string(e.what()).find("1024"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(NaiveAndCublas, ScorePath, ::testing::Values(Path::naive, Path::cublas),
                         [](const ::testing::TestParamInfo<Path>& info) { return std::string(to_string(info.param)); });

// GPU-sized (support/gpu_sized.h): thousands of keys, chunked by a 4 MB workspace, and varlen
// batches of hundreds of rows.
class ScorePathOnGpu : public testing::GpuSized<::testing::TestWithParam<Path>> {
 protected:
  Path path() const { return GetParam(); }
};

TEST_P(ScorePathOnGpu, LargerShapesAndChunks) {
  ctx.set_workspace_limit(size_t(4) << 20);  // 4 MB: forces chunks below
  testing::expect_all_pass(ctx, {
      make_case(DType::f16, 2, 4, 2, 512, 1000, 128, Causal::bottom_right, Layout::bshd, true, {1000, 517}, path()),
      make_case(DType::bf16, 1, 4, 4, 700, 3000, 64, Causal::top_left, Layout::bhsd, true, {}, path()),
      make_case(DType::f32, 3, 2, 1, 513, 257, 80, Causal::none, Layout::bshd, true, {0, 257, 100}, path()),
  });
}

TEST_P(ScorePathOnGpu, VariableLengthSequences) {
  using testing::VarlenCase;
  const std::vector<VarlenCase> cases = {
      {DType::f32, 2, 1, 7, {7, 0, 64}, {70, 9, 0}, Causal::bottom_right, Layout::bshd, true, path()},
      {DType::f16, 4, 2, 64, {33, 1, 513}, {33, 100, 700}, Causal::top_left, Layout::bshd, true, path()},
      {DType::bf16, 2, 2, 128, {170, 40}, {500, 0}, Causal::none, Layout::bhsd, true, path()},
  };
  for (const VarlenCase& c : cases) EXPECT_TRUE(testing::check_attention_varlen(ctx, c));
}

INSTANTIATE_TEST_SUITE_P(NaiveAndCublas, ScorePathOnGpu, ::testing::Values(Path::naive, Path::cublas),
                         [](const ::testing::TestParamInfo<Path>& info) { return std::string(to_string(info.param)); });

}  // namespace
}  // namespace selfattn
