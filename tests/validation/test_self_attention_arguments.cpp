// self_attention()'s bad inputs: the documented error type and message, `out` untouched (sim, no kernel).
#include <cmath>
#include <cstdint>

#include <gtest/gtest.h>

#include "selfattn/selfattn.h"
#include "test_helpers.h"

namespace selfattn {
namespace {

using host_test::kPoison;
using host_test::throws_with;
using host_test::untouched;

// A bad argument: InvalidArgument whose message contains `parts`, and out and lse untouched.
#define EXPECT_REJECTED(call, ...)                                                         \
  do {                                                                                     \
    EXPECT_TRUE(throws_with<InvalidArgument>([&] { (call).run(); }, {__VA_ARGS__}));       \
    EXPECT_TRUE(untouched((call).out_mem));                                                \
    EXPECT_TRUE(untouched((call).lse_mem));                                                \
  } while (0)

struct SelfAttentionCall {
  static constexpr int64_t kBatch = 2, kSeq = 5, kModel = 4, kHeads = 2, kDim = 3;
  Context ctx{Backend::sim};
  DeviceBuffer<float> x_mem{ctx, kBatch * kSeq * kModel};
  DeviceBuffer<float> w_mem{ctx, 3 * kModel * kHeads * kDim + kHeads * kDim * 8};
  DeviceBuffer<float> out_mem{ctx, kBatch * kHeads * kSeq * 8};
  DeviceBuffer<float> lse_mem{ctx, kBatch * kHeads * kSeq};
  TensorView x = TensorView::bhsd(x_mem.data(), DType::f32, kBatch, 1, kSeq, kModel);
  MatrixView wq = MatrixView::row_major(w_mem.data(), DType::f32, kModel, kHeads * kDim);
  MatrixView wk = MatrixView::row_major(w_mem.data() + kModel * kHeads * kDim, DType::f32, kModel, kHeads * kDim);
  MatrixView wv = MatrixView::row_major(w_mem.data() + 2 * kModel * kHeads * kDim, DType::f32, kModel, kHeads * kDim);
  MatrixView wo_matrix = MatrixView::row_major(w_mem.data() + 3 * kModel * kHeads * kDim, DType::f32, kHeads * kDim, 8);
  const MatrixView* wo = nullptr;
  int heads = int(kHeads);
  TensorView out = TensorView::bhsd(out_mem.data(), DType::f32, kBatch, kHeads, kSeq, kDim);
  AttentionOptions options;

  SelfAttentionCall() { out_mem.fill_bytes(kPoison); lse_mem.fill_bytes(kPoison); }
  void run() { self_attention(ctx, x, wq, wk, wv, heads, out, options, wo); }
  void use_wo() {  // out becomes [batch, 1, seq, 8]
    wo = &wo_matrix;
    out = TensorView::bhsd(out_mem.data(), DType::f32, kBatch, 1, kSeq, 8);
  }
};

TEST(SelfAttentionArguments, Rejected) {
  { SelfAttentionCall c; c.x.shape[1] = 2; EXPECT_REJECTED(c, "self_attention", "x.shape[1] expected 1"); }
  { SelfAttentionCall c; c.heads = 0; EXPECT_REJECTED(c, "heads expected >= 1, got 0"); }
  { SelfAttentionCall c; c.out.strides[0] = 0; EXPECT_REJECTED(c, "self_attention", "out.strides[0] (batch) = 0 makes elements"); }
  { SelfAttentionCall c; c.wq.rows = 3; EXPECT_REJECTED(c, "wq.rows expected 4", "got 3"); }
  { SelfAttentionCall c; c.heads = 4; EXPECT_REJECTED(c, "wq.cols expected a positive multiple of heads = 4, got 6"); }
  { SelfAttentionCall c; c.wv.cols = 3; EXPECT_REJECTED(c, "wv.cols expected 6 (wk.cols), got 3"); }
  { SelfAttentionCall c; c.wk.cols = c.wv.cols = 4; EXPECT_REJECTED(c, "wk.cols expected kv_heads * head_dim"); }
  { SelfAttentionCall c; c.wk.dtype = DType::f16; EXPECT_REJECTED(c, "wk.dtype expected f32 (x.dtype), got f16"); }
  { SelfAttentionCall c; c.wq.row_stride = 2; EXPECT_REJECTED(c, "wq.row_stride expected >= cols = 6, got 2"); }
  { SelfAttentionCall c; c.out.shape[3] = 2; EXPECT_REJECTED(c, "out.shape expected [2, 2, 5, 3]", "got [2, 2, 5, 2]"); }
  {
    SelfAttentionCall c;
    c.wo = &c.wo_matrix;
    c.wo_matrix.rows = 5;
    EXPECT_REJECTED(c, "wo.rows expected 6 (heads * head_dim), got 5");
  }
  {
    SelfAttentionCall c;
    c.wo = &c.wo_matrix;  // out must then be [batch, 1, seq, 8]
    EXPECT_REJECTED(c, "out.shape expected [2, 1, 5, 8]");
  }
  { SelfAttentionCall c; c.out.data = c.x_mem.data(); EXPECT_REJECTED(c, "out expected not to overlap x"); }
  // What the GEMMs and the attention step would refuse is refused before anything runs.
  { SelfAttentionCall c; c.x.strides[2] = 3; EXPECT_REJECTED(c, "x.strides[2] (seq) expected in [4, ", "got 3"); }
  {
    SelfAttentionCall c;
    c.use_wo();
    c.out.strides[2] = 7;
    EXPECT_REJECTED(c, "out.strides[2] (seq) expected in [8, ", "got 7");
  }
  {
    SelfAttentionCall c;
    c.options.lse = c.out_mem.data();
    EXPECT_REJECTED(c, "options.lse expected not to overlap out");
  }
  {
    SelfAttentionCall c;
    c.use_wo();
    c.options.lse = const_cast<float*>(static_cast<const float*>(c.wo_matrix.data));
    EXPECT_REJECTED(c, "options.lse expected not to overlap wo");
  }
  { SelfAttentionCall c; c.options.scale = NAN; EXPECT_REJECTED(c, "self_attention: options.scale expected a finite"); }
}

TEST(SelfAttentionArguments, PathErrorsNameSelfAttention) {
  Context ctx(Backend::sim);
  constexpr int kDim = 257;  // above the fused kernels' 256
  DeviceBuffer<float> x(ctx, 1), w(ctx, 3 * kDim), out(ctx, kDim);
  x.fill_bytes(0);
  w.fill_bytes(0);
  out.fill_bytes(kPoison);
  const auto weight = [&](int i) { return MatrixView::row_major(w.data() + i * kDim, DType::f32, 1, kDim); };
  AttentionOptions options;
  options.path = Path::fused;
  EXPECT_TRUE(throws_with<NotAvailable>(
      [&] {
        self_attention(ctx, TensorView::bhsd(x.data(), DType::f32, 1, 1, 1, 1), weight(0), weight(1), weight(2), 1,
                       TensorView::bhsd(out.data(), DType::f32, 1, 1, 1, kDim), options);
      },
      {"self_attention: path fused does not support"}));
  EXPECT_TRUE(untouched(out));
}

TEST(SelfAttentionArguments, EmptyBatchDoesNothing) {
  SelfAttentionCall c;
  c.x.shape[0] = c.out.shape[0] = 0;
  c.run();
  EXPECT_TRUE(untouched(c.out_mem));
  EXPECT_EQ(c.ctx.workspace_bytes(), 0u);
}

}  // namespace
}  // namespace selfattn
