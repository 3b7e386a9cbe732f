// The naive path (tiled Q K^T, softmax rows, tiled P V) against the double-precision reference, on
// the sim: a chosen list of cases that covers every value of each axis (dtype, batch, heads/kv_heads,
// seq_q/seq_k, head_dim, causal, key lengths, layout, LSE) without the full cross product.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "attention_harness.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

using testing::AttentionCase;
using testing::Layout;

AttentionCase naive_case(DType dtype, int batch, int heads, int kv_heads, int seq_q, int seq_k, int head_dim,
                         Causal causal = Causal::none, Layout layout = Layout::bhsd, bool lse = false,
                         std::vector<int32_t> key_lengths = {}) {
  AttentionCase c;
  c.dtype = dtype;
  c.batch = batch;
  c.heads = heads;
  c.kv_heads = kv_heads;
  c.seq_q = seq_q;
  c.seq_k = seq_k;
  c.head_dim = head_dim;
  c.causal = causal;
  c.layout = layout;
  c.with_lse = lse;
  c.key_lengths = std::move(key_lengths);
  c.path = Path::naive;
  return c;
}

void run_cases(const std::vector<AttentionCase>& cases) {
  Context ctx;
  for (const AttentionCase& c : cases) EXPECT_TRUE(testing::check_attention(ctx, c));
}

constexpr DType f32 = DType::f32, f16 = DType::f16, bf16 = DType::bf16;
constexpr Causal none = Causal::none, top_left = Causal::top_left, bottom_right = Causal::bottom_right;
constexpr Layout bhsd = Layout::bhsd, bshd = Layout::bshd;

TEST(NaivePath, SeedExampleAndTinyShapes) {
  run_cases({
      naive_case(f32, 1, 1, 1, 2, 2, 2),  // the seed: 2 tokens, head_dim 2
      naive_case(f32, 1, 1, 1, 1, 1, 1),
      naive_case(f32, 1, 1, 1, 1, 7, 1, none, bhsd, true),
      naive_case(f32, 1, 1, 1, 7, 1, 2, top_left, bshd, true),
      naive_case(f16, 1, 1, 1, 2, 7, 7, bottom_right, bhsd, true),
      naive_case(bf16, 1, 1, 1, 7, 2, 1, none, bshd),
  });
}

TEST(NaivePath, Float32Sweep) {
  run_cases({
      naive_case(f32, 2, 4, 2, 64, 113, 32, none, bhsd, true),
      naive_case(f32, 1, 2, 1, 113, 64, 64, top_left, bshd, true),
      naive_case(f32, 3, 1, 1, 7, 203, 80, bottom_right, bhsd, false, {203, 0, 57}),
      naive_case(f32, 1, 8, 2, 203, 7, 7, none, bshd, true),
      naive_case(f32, 2, 3, 3, 257, 64, 2, top_left, bhsd, true, {64, 1}),
      naive_case(f32, 1, 2, 2, 64, 257, 128, bottom_right, bshd, true),
      naive_case(f32, 1, 6, 3, 2, 203, 32, none, bhsd, false, {0}),
  });
}

TEST(NaivePath, Float16Sweep) {
  run_cases({
      naive_case(f16, 2, 4, 1, 113, 64, 64, none, bhsd, true),
      naive_case(f16, 1, 2, 2, 64, 113, 32, top_left, bshd, true, {100}),
      naive_case(f16, 3, 2, 1, 7, 257, 80, bottom_right, bhsd, true, {257, 3, 0}),
      naive_case(f16, 1, 8, 8, 203, 2, 128, none, bshd),
      naive_case(f16, 1, 1, 1, 257, 203, 7, top_left, bhsd, true),
      naive_case(f16, 2, 4, 2, 1, 64, 1, bottom_right, bshd, true),
  });
}

TEST(NaivePath, BFloat16Sweep) {
  run_cases({
      naive_case(bf16, 1, 4, 2, 64, 203, 64, bottom_right, bshd, true),
      naive_case(bf16, 2, 2, 1, 113, 7, 128, top_left, bhsd, true, {7, 0}),
      naive_case(bf16, 1, 3, 1, 203, 113, 32, none, bhsd, false, {60}),
      naive_case(bf16, 3, 1, 1, 2, 64, 80, none, bshd, true),
      naive_case(bf16, 1, 8, 4, 7, 257, 2, top_left, bshd, true),
      naive_case(bf16, 1, 2, 2, 257, 1, 7, bottom_right, bhsd, true),
  });
}

// Rows longer than the cached limit (256 threads x 8 keys) take the streaming softmax.
TEST(NaivePath, LongRowsStreamingSoftmax) {
  run_cases({
      naive_case(f32, 1, 1, 1, 7, 4100, 2, none, bhsd, true, {}),
      naive_case(bf16, 1, 2, 1, 3, 2100, 16, bottom_right, bshd, true, {2099}),
  });
}

TEST(NaivePath, ExplicitScale) {
  AttentionCase c = naive_case(f32, 1, 2, 1, 64, 113, 32, top_left, bhsd, true);
  c.scale = 0.5f;
  run_cases({c});
}

// A workspace limit far below the problem forces chunks over heads, then over rows of one head.
TEST(NaivePath, ChunkedByWorkspaceLimit) {
  ContextOptions options;
  options.workspace_limit = 64 * 1024;  // 64 KB: 64 rows of 203 keys
  Context ctx(options);
  const std::vector<AttentionCase> cases = {
      naive_case(f32, 2, 4, 2, 7, 203, 32, bottom_right, bhsd, true, {203, 100}),  // whole heads per chunk
      naive_case(f16, 1, 2, 1, 257, 203, 64, top_left, bshd, true),               // row ranges of one head
  };
  for (const AttentionCase& c : cases) EXPECT_TRUE(testing::check_attention(ctx, c));
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
