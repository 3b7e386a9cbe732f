// The naive path (tiled Q K^T, softmax rows, tiled P V) against the double-precision reference, on
// the sim: the harness's sweep per dtype (every value of each axis, not the cross product), the long
// rows that take the streaming softmax, an explicit scale, and chunking under a small workspace.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "attention_harness.h"
#include "context_state.h"
#include "kernels/registry.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

using testing::AttentionCase;
using testing::Layout;
using testing::make_case;

// The sweeps below only test the tensor-core kernels if the registry picks them: f16/bf16 from
// head_dim 16 on; the SIMT kernels for f32 and small head dims.
TEST(NaivePath, RegistryPicksTensorCoresForHalfTypes) {
  using kernels::Element;
  namespace sim = kernels::sim_target;
  EXPECT_NE(std::string(sim::qk_tiled_instance(Element::f16, 64).kernel.name).find("mma"), std::string::npos);
  EXPECT_NE(std::string(sim::pv_tiled_instance(Element::bf16, 80).kernel.name).find("mma"), std::string::npos);
  EXPECT_NE(std::string(sim::qk_tiled_instance(Element::bf16, 7).kernel.name).find("simt"), std::string::npos);
  EXPECT_NE(std::string(sim::pv_tiled_instance(Element::f32, 128).kernel.name).find("simt"), std::string::npos);
}

TEST(NaivePath, SweepFloat32) {
  Context ctx;
  testing::expect_all_pass(ctx, testing::sweep_cases(DType::f32, Path::naive));
}
TEST(NaivePath, SweepFloat16) {
  Context ctx;
  testing::expect_all_pass(ctx, testing::sweep_cases(DType::f16, Path::naive));
}
TEST(NaivePath, SweepBFloat16) {
  Context ctx;
  testing::expect_all_pass(ctx, testing::sweep_cases(DType::bf16, Path::naive));
}

// Rows longer than the cached limit (256 threads x 8 keys) take the streaming softmax.
TEST(NaivePath, LongRowsStreamingSoftmax) {
  Context ctx;
  testing::expect_all_pass(ctx, {
      make_case(DType::f32, 1, 1, 1, 7, 4100, 2, Causal::none, Layout::bhsd, true, {}, Path::naive),
      make_case(DType::bf16, 1, 2, 1, 3, 2100, 16, Causal::bottom_right, Layout::bshd, true, {2099}, Path::naive),
  });
}

// Batch 1 of every tensor starts 2^31 elements after batch 0: element offsets need 64 bits (the sim
// reserves the gap without touching it).
TEST(NaivePath, OffsetsPast32Bits) {
  Context ctx;
  AttentionCase half = make_case(DType::f16, 2, 2, 1, 7, 64, 32, Causal::top_left, Layout::bshd, true, {}, Path::naive);
  AttentionCase single = make_case(DType::f32, 2, 1, 1, 5, 9, 7, Causal::none, Layout::bhsd, false, {}, Path::naive);
  half.batch_gap = single.batch_gap = int64_t(1) << 31;
  testing::expect_all_pass(ctx, {half, single});
}

// Variable-length batches run sequence by sequence: empty sequences, sequences without keys, GQA,
// both layouts, each checked against the reference on that sequence alone.
TEST(NaivePath, VariableLengthSequences) {
  Context ctx;
  using testing::VarlenCase;
  const std::vector<VarlenCase> cases = {
      {DType::f32, 2, 1, 7, {7, 0, 64}, {70, 9, 0}, Causal::bottom_right, Layout::bshd, true, Path::naive},
      {DType::f16, 4, 2, 64, {33, 1, 113}, {33, 100, 7}, Causal::top_left, Layout::bshd, true, Path::naive},
      {DType::bf16, 2, 2, 32, {17, 40}, {50, 0}, Causal::none, Layout::bhsd, true, Path::naive},
      {DType::f16, 1, 1, 80, {129, 3}, {0, 203}, Causal::none, Layout::bshd, false, Path::naive},
  };
  for (const VarlenCase& c : cases) EXPECT_TRUE(testing::check_attention_varlen(ctx, c));
}

TEST(NaivePath, ExplicitScale) {
  Context ctx;
  AttentionCase c = make_case(DType::f32, 1, 2, 1, 64, 113, 32, Causal::top_left, Layout::bhsd, true, {}, Path::naive);
  c.scale = 0.5f;
  testing::expect_all_pass(ctx, {c});
}

// A workspace limit far below the problem forces chunks over heads, then over rows of one head.
TEST(NaivePath, ChunkedByWorkspaceLimit) {
  ContextOptions options;
  options.workspace_limit = 64 * 1024;  // 64 KB: about 80 rows of 203 keys, far below either whole problem
  Context ctx(options);
  testing::expect_all_pass(ctx, {
      // whole heads per chunk
      make_case(DType::f32, 2, 4, 2, 30, 203, 32, Causal::bottom_right, Layout::bhsd, true, {203, 100}, Path::naive),
      // row ranges of one head
      make_case(DType::f16, 1, 2, 1, 257, 203, 64, Causal::top_left, Layout::bshd, true, {}, Path::naive),
  });
  EXPECT_LE(ctx.workspace_bytes(), options.workspace_limit);
}

// Another workspace slot (self_attention's projections) holds most of the limit: the path finds the
// largest chunk that fits in what is left instead of failing.
TEST(NaivePath, ChunksAroundOtherWorkspaceSlots) {
  ContextOptions options;
  options.workspace_limit = 256 * 1024;
  Context ctx(options);
  ctx.state().workspace.reserve(200 * 1024, "test: held by another slot", detail::WorkspaceSlot::projections);
  testing::expect_all_pass(ctx, {
      make_case(DType::bf16, 1, 4, 2, 113, 203, 64, Causal::none, Layout::bshd, true, {}, Path::naive),
  });
  EXPECT_LE(ctx.workspace_bytes(), options.workspace_limit);
}

TEST(NaivePath, RowTooLongForWorkspaceNamesTheLimit) {
  ContextOptions options;
  options.workspace_limit = 1024;  // 256 fp32 scores: less than one row of 1000 keys
  Context ctx(options);
  DeviceBuffer<float> q(ctx, 2 * 2), k(ctx, 1000 * 2), v(ctx, 1000 * 2), out(ctx, 2 * 2);
  AttentionOptions attention_options;
  attention_options.path = Path::naive;
  try {
    attention(ctx, TensorView::bhsd(q.data(), DType::f32, 1, 1, 2, 2), TensorView::bhsd(k.data(), DType::f32, 1, 1, 1000, 2),
              TensorView::bhsd(v.data(), DType::f32, 1, 1, 1000, 2), TensorView::bhsd(out.data(), DType::f32, 1, 1, 2, 2),
              attention_options);
    FAIL() << "expected WorkspaceTooSmall";
  } catch (const WorkspaceTooSmall& e) {
    EXPECT_NE(std::string(e.what()).find("1024"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace selfattn
