// attention_backward() on the cublas path, run on the sim (gemm_sim.cpp takes cuBLAS's conventions):
// the sweep of backward_check.h, NaN in the key rows past the key lengths, dsinks over many rows
// and varlen rows past cu_seqlens, row chunking under a small workspace limit, and bitwise
// determinism of the beta = 1 accumulation across the GQA group's heads and the chunks.
#include <gtest/gtest.h>

#include "backward_check.h"
#include "gpu_sized.h"
#include "kernels/registry.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

using backward_check::Case;

TEST(CublasBackward, Sweep) {
  Context ctx;
  for (const Case& c : backward_check::sweep(Path::cublas)) EXPECT_TRUE(backward_check::check(ctx, c));
}

// NaN in K and V rows past the key lengths (an unused cache's rows) reaches no gradient: dQ's sum
// over keys stops at each batch's length (gemm_over_visible_keys), and dK/dV there stay exactly 0.
// On a GPU, cuBLAS sums over all keys and the elements that came out NaN are recomputed over the
// key length (device_cuda.cu): the same gradients up to summation order (a few units in the last
// place of bf16 / f16 at most), not bitwise.
TEST(CublasBackward, NanKeyPaddingReachesNoGradient) {
  Context ctx;
  const double tolerance = ctx.backend() == Backend::cuda ? 1.0 / 128 : 0;
  EXPECT_TRUE(testing::check_backward_ignores_key_padding(ctx, Path::cublas, tolerance));
}

// dsinks over more rows per head than the sinks' gradient kernel has threads, and a varlen call
// whose views run past cu_seqlens (NaN rows nobody owns: 0 in the gradients, outside dsinks).
TEST(CublasBackward, SinksOverManyRowsAndVarlenRowsNobodyOwns) {
  Context ctx;
  const int sink_threads = kernels::sim_target::sink_gradient_instance().threads;
  ASSERT_GT(sink_threads, 0);
  for (const Case& c : backward_check::sinks_and_tails(Path::cublas, DType::f16, 16, sink_threads))
    EXPECT_TRUE(backward_check::check(ctx, c));
}

TEST(CublasBackward, RowChunks) {
  Case c;
  c.name = "chunked";
  c.dtype = DType::bf16;
  c.grad_f32 = true;
  c.heads = 6, c.kv_heads = 2, c.seq_q = 41, c.seq_k = 77, c.head_dim = 24;
  c.causal = Causal::top_left;
  c.path = Path::cublas;
  backward_check::Gradients whole, chunked;
  Context big(Backend::sim);
  ASSERT_TRUE(backward_check::check(big, c, &whole));
  ContextOptions options;
  options.backend = Backend::sim;
  // D (4 * 246 -> 1024) + two accumulators (4 * 24 * 154 = 14784 -> 14848 each) + 7 rows of
  // 2 * 4 * 80 + 2 * 2 * 80: chunks of a few rows of one head, so the group's heads and the row
  // ranges meet in the beta = 1 accumulation.
  options.workspace_limit = 1024 + 2 * 14848 + 7 * (2 * 4 * 80 + 2 * 2 * 80);
  Context small(options);
  ASSERT_TRUE(backward_check::check(small, c, &chunked));
  EXPECT_EQ(whole.dq, chunked.dq);  // dq rows are complete within a chunk (the sim's GEMM sums in order)
}

TEST(CublasBackward, BitwiseDeterministic) {
  Context ctx;
  Case c;
  c.name = "determinism";
  c.dtype = DType::f16;
  c.heads = 4, c.kv_heads = 1, c.seq_q = 50, c.seq_k = 61, c.head_dim = 16;
  c.path = Path::cublas;
  c.deterministic_rerun = true;
  EXPECT_TRUE(backward_check::check(ctx, c));
}

// GPU-sized (support/gpu_sized.h): 300 x 1000 rows at head_dim 128, a 2 MB workspace that forces row
// chunks, and the deterministic rerun.
using CublasBackwardOnGpu = testing::GpuSized<>;

TEST_F(CublasBackwardOnGpu, LargerShapesChunksAndDeterminism) {
  ctx.set_workspace_limit(size_t(2) << 20);
  for (const Case& c : backward_check::larger_shapes(Path::cublas)) EXPECT_TRUE(backward_check::check(ctx, c));
}

}  // namespace
}  // namespace selfattn
