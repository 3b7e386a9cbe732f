// The cublas path (batched GEMMs via Device::gemm_strided_batched - the sim GEMM here - with the softmax kernel between) against the double-precision reference, on
// the sim: the harness's sweep per dtype (every value of each axis, not the cross product), the long
// rows that take the streaming softmax, an explicit scale, and chunking under a small workspace.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "attention_harness.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

using testing::AttentionCase;
using testing::Layout;
using testing::make_case;

TEST(CublasPath, SweepFloat32) {
  Context ctx;
  testing::expect_all_pass(ctx, testing::sweep_cases(DType::f32, Path::cublas));
}
TEST(CublasPath, SweepFloat16) {
  Context ctx;
  testing::expect_all_pass(ctx, testing::sweep_cases(DType::f16, Path::cublas));
}
TEST(CublasPath, SweepBFloat16) {
  Context ctx;
  testing::expect_all_pass(ctx, testing::sweep_cases(DType::bf16, Path::cublas));
}

// Rows longer than the cached limit (256 threads x 8 keys) take the streaming softmax.
TEST(CublasPath, LongRowsStreamingSoftmax) {
  Context ctx;
  testing::expect_all_pass(ctx, {
      make_case(DType::f32, 1, 1, 1, 7, 4100, 2, Causal::none, Layout::bhsd, true, {}, Path::cublas),
      make_case(DType::bf16, 1, 2, 1, 3, 2100, 16, Causal::bottom_right, Layout::bshd, true, {2099}, Path::cublas),
  });
}

// Batch 1 of every tensor starts 2^31 elements after batch 0: element offsets need 64 bits (the sim
// reserves the gap without touching it).
TEST(CublasPath, OffsetsPast32Bits) {
  Context ctx;
  AttentionCase half = make_case(DType::f16, 2, 2, 1, 7, 64, 32, Causal::top_left, Layout::bshd, true, {}, Path::cublas);
  AttentionCase single = make_case(DType::f32, 2, 1, 1, 5, 9, 7, Causal::none, Layout::bhsd, false, {}, Path::cublas);
  half.batch_gap = single.batch_gap = int64_t(1) << 31;
  testing::expect_all_pass(ctx, {half, single});
}

// Variable-length batches run sequence by sequence: empty sequences, sequences without keys, GQA,
// both layouts, each checked against the reference on that sequence alone.
TEST(CublasPath, VariableLengthSequences) {
  Context ctx;
  using testing::VarlenCase;
  const std::vector<VarlenCase> cases = {
      {DType::f32, 2, 1, 7, {7, 0, 64}, {70, 9, 0}, Causal::bottom_right, Layout::bshd, true, Path::cublas},
      {DType::f16, 4, 2, 64, {33, 1, 113}, {33, 100, 7}, Causal::top_left, Layout::bshd, true, Path::cublas},
      {DType::bf16, 2, 2, 32, {17, 40}, {50, 0}, Causal::none, Layout::bhsd, true, Path::cublas},
      {DType::f16, 1, 1, 80, {129, 3}, {0, 203}, Causal::none, Layout::bshd, false, Path::cublas},
  };
  for (const VarlenCase& c : cases) EXPECT_TRUE(testing::check_attention_varlen(ctx, c));
}

TEST(CublasPath, ExplicitScale) {
  Context ctx;
  AttentionCase c = make_case(DType::f32, 1, 2, 1, 64, 113, 32, Causal::top_left, Layout::bhsd, true, {}, Path::cublas);
  c.scale = 0.5f;
  testing::expect_all_pass(ctx, {c});
}

// A workspace limit far below the problem forces chunks over heads, then over rows of one head.
TEST(CublasPath, ChunkedByWorkspaceLimit) {
  ContextOptions options;
  options.workspace_limit = 64 * 1024;  // 64 KB: about 80 rows of 203 keys, far below either whole problem
  Context ctx(options);
  testing::expect_all_pass(ctx, {
      // whole heads per chunk
      make_case(DType::f32, 2, 4, 2, 30, 203, 32, Causal::bottom_right, Layout::bhsd, true, {203, 100}, Path::cublas),
      // row ranges of one head
      make_case(DType::f16, 1, 2, 1, 257, 203, 64, Causal::top_left, Layout::bshd, true, {}, Path::cublas),
  });
  EXPECT_LE(ctx.workspace_bytes(), options.workspace_limit);
}

// K and V broadcast along seq (stride 0) are valid views, but no cuBLAS leading dimension: the
// cublas path declines (automatic then picks another path) instead of failing inside cuBLAS.
TEST(CublasPath, DeclinesOverlappingRows) {
  Context ctx;
  DeviceBuffer<float> q(ctx, 4 * 2), kv(ctx, 2), out(ctx, 4 * 2);
  TensorView k = TensorView::bhsd(kv.data(), DType::f32, 1, 1, 9, 2);
  k.strides[2] = 0;
  AttentionOptions options;
  options.path = Path::cublas;
  EXPECT_THROW(attention(ctx, TensorView::bhsd(q.data(), DType::f32, 1, 1, 4, 2), k, k,
                         TensorView::bhsd(out.data(), DType::f32, 1, 1, 4, 2), options),
               NotAvailable);
}

TEST(CublasPath, RowTooLongForWorkspaceNamesTheLimit) {
  ContextOptions options;
  options.workspace_limit = 1024;  // 256 fp32 scores: less than one row of 1000 keys
  Context ctx(options);
  DeviceBuffer<float> q(ctx, 2 * 2), k(ctx, 1000 * 2), v(ctx, 1000 * 2), out(ctx, 2 * 2);
  AttentionOptions attention_options;
  attention_options.path = Path::cublas;
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
