// merge_states on the sim (kv_cache.h): disjoint key sets of a cache attended and merged, and
// rows around the kernel's one-thread-per-row blocks. out_a, out_b and out each have their own
// layout (kv_cache_check.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "kernels/decode/merge_states.cuh"
#include "kv_cache_check.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

using namespace kv_test;

// merge_states on two disjoint key sets: the two halves of a contiguous cache, attended separately
// on the device and merged, against the reference's merge of the reference halves. Sequence 1 has no
// key in part a (merged with a side of LSE -inf) and sequence 2 none at all (0 and -inf). out_a,
// out_b and the merged out each in their own layout (in place: out is out_a).
TEST(KvCacheMerge, DisjointKeySetsAgainstReference) {
  Context ctx;
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    for (bool in_place : {false, true}) {
      const int batch = 3, kv_heads = 2, heads = 4, d = 64, seq_q = 3, capacity = 40, split = 17;
      const std::string name = std::string("merge ") + to_string(dtype) + (in_place ? " in place" : "");
      std::mt19937_64 rng = rng_for(name);
      CacheSpec spec = contiguous(dtype, batch, kv_heads, d, capacity, {capacity, capacity, 0}, true);
      TestCache cache = make_cache(ctx, spec, rng);
      Tensor q = random_tensor(ctx, dtype, batch, heads, seq_q, d, rng, kQueryLayout);
      // Part a: rows [0, split) (lengths split, 0, 0); part b: rows [split, capacity) (a view that starts there).
      const std::vector<int32_t> lengths_a = {split, 0, 0}, lengths_b = {capacity - split, capacity - split, 0};
      DeviceBuffer<int32_t> a_lengths(ctx, 3, "lengths a"), b_lengths(ctx, 3, "lengths b");
      a_lengths.copy_from_host(lengths_a);
      b_lengths.copy_from_host(lengths_b);
      KvCache part_a = cache.view, part_b = cache.view;
      part_a.lengths = a_lengths.data();
      part_b.lengths = b_lengths.data();
      // `split` rows on, each pool by its own row stride.
      const size_t element = dtype_size(dtype);
      part_b.k.data = static_cast<unsigned char*>(cache.k.data()) + size_t(split * cache.view.k.strides[2]) * element;
      part_b.v.data = static_cast<unsigned char*>(cache.v.data()) + size_t(split * cache.view.v.strides[2]) * element;
      part_b.k.shape[2] = part_b.v.shape[2] = capacity - split;
      const size_t rows = size_t(batch) * heads * seq_q;
      const Output out_a = poisoned_output(ctx, dtype, batch, heads, seq_q, d, kMergeALayout);
      const Output out_b = poisoned_output(ctx, dtype, batch, heads, seq_q, d, kMergeBLayout);
      DeviceBuffer<float> lse_a(ctx, rows, "lse a"), lse_b(ctx, rows, "lse b");
      const TensorView view_a = out_a.view, view_b = out_b.view;
      KvAttentionOptions options;
      options.causal = Causal::none;
      options.lse = lse_a.data();
      attention_with_kv_cache(ctx, q.view, part_a, view_a, options);
      options.lse = lse_b.data();
      attention_with_kv_cache(ctx, q.view, part_b, view_b, options);

      const Output merged = poisoned_output(ctx, dtype, batch, heads, seq_q, d, kMergedLayout);
      DeviceBuffer<float> merged_lse(ctx, rows, "merged lse");
      merged_lse.fill_bytes(0xff);
      const TensorView merged_view = in_place ? view_a : merged.view;
      float* merged_lse_ptr = in_place ? lse_a.data() : merged_lse.data();
      merge_states(ctx, view_a, lse_a.data(), view_b, lse_b.data(), merged_view, merged_lse_ptr);
      ctx.synchronize();

      reference::Problem problem;
      problem.batch = batch;
      problem.heads = heads;
      problem.kv_heads = kv_heads;
      problem.seq_q = seq_q;
      problem.head_dim = d;
      problem.causal = Causal::none;
      reference::KvCacheImage image_a = cache.image, image_b = cache.image;
      image_a.lengths = lengths_a;
      // Part b as its own contiguous cache: rows [split, capacity) of each sequence.
      image_b.page_size = capacity - split;
      image_b.lengths = lengths_b;
      image_b.k.clear();
      image_b.v.clear();
      for (int b = 0; b < batch; ++b)
        for (int h = 0; h < kv_heads; ++h)
          for (int t = split; t < capacity; ++t)
            for (int e = 0; e < d; ++e) {
              image_b.k.push_back(cache.image.k[cache.image.offset(b, h, t) + size_t(e)]);
              image_b.v.push_back(cache.image.v[cache.image.offset(b, h, t) + size_t(e)]);
            }
      const testing::AttentionExpected expected =
          expected_merge(expected_kv_attention(problem, q.values, image_a, dtype),
                         expected_kv_attention(problem, q.values, image_b, dtype), dtype);
      std::vector<float> out_values;
      const Output& result = in_place ? out_a : merged;
      EXPECT_TRUE(download_output(name + " out", result.device, result.view, out_values));
      EXPECT_TRUE(judge_values(name + " out", out_values, expected.out));
      const std::vector<float> lse = (in_place ? lse_a : merged_lse).to_host();
      EXPECT_TRUE(judge_values(name + " lse", lse, expected.lse));
    }
  }
}

// merge_states runs one thread per row, blocks of MergeStatesTraits::kThreads: row counts just
// below, at and just above one block, and past two blocks with several batches and heads (each
// row's (b, h, s) from its tensor's own strides). Random parts stand in for attention results; a
// fifth of the rows have one side without keys (LSE -inf) and the last row both.
TEST(KvCacheMerge, RowsAroundEachBlockOfThreads) {
  constexpr int kThreads = kernels::MergeStatesTraits::kThreads;
  struct Shape {
    int batch, heads, seq;
    DType dtype;
    int d;
  };
  Context ctx;
  for (const Shape& shape : {Shape{1, 1, kThreads - 1, DType::f16, 40}, Shape{1, 1, kThreads, DType::f32, 8},
                             Shape{1, 1, kThreads + 1, DType::bf16, 24}, Shape{2, 3, 2 * kThreads / 6 + 1, DType::f16, 8}}) {
    const int rows = shape.batch * shape.heads * shape.seq;
    const std::string name = "merge rows " + std::to_string(rows) + " " + to_string(shape.dtype);
    std::mt19937_64 rng = rng_for(name);
    const Tensor a = random_tensor(ctx, shape.dtype, shape.batch, shape.heads, shape.seq, shape.d, rng, kMergeALayout);
    const Tensor b = random_tensor(ctx, shape.dtype, shape.batch, shape.heads, shape.seq, shape.d, rng, kMergeBLayout);
    std::vector<float> lse_a(static_cast<size_t>(rows)), lse_b(static_cast<size_t>(rows));
    std::uniform_real_distribution<float> uniform(-3.0f, 3.0f);
    for (int row = 0; row < rows; ++row) {
      lse_a[size_t(row)] = row % 5 == 1 || row == rows - 1 ? -INFINITY : uniform(rng);
      lse_b[size_t(row)] = row % 5 == 3 || row == rows - 1 ? -INFINITY : uniform(rng);
    }
    DeviceBuffer<float> lse_a_device(ctx, size_t(rows), "lse a"), lse_b_device(ctx, size_t(rows), "lse b");
    DeviceBuffer<float> lse_out(ctx, size_t(rows), "lse out");
    lse_a_device.copy_from_host(lse_a);
    lse_b_device.copy_from_host(lse_b);
    lse_out.fill_bytes(0xff);
    const Output out = poisoned_output(ctx, shape.dtype, shape.batch, shape.heads, shape.seq, shape.d, kMergedLayout);
    merge_states(ctx, a.view, lse_a_device.data(), b.view, lse_b_device.data(), out.view, lse_out.data());
    ctx.synchronize();

    const auto stored = [&](const Tensor& part, const std::vector<float>& lse) {
      testing::AttentionExpected e;
      e.out = exact_copy(part.values);
      e.out.row_length = shape.d;
      e.lse = exact_copy(std::vector<double>(lse.begin(), lse.end()));
      for (double& scale : e.lse.scale) scale = std::isfinite(scale) ? scale : 0.0;  // a side without keys weighs 0
      return e;
    };
    const testing::AttentionExpected expected = expected_merge(stored(a, lse_a), stored(b, lse_b), shape.dtype);
    std::vector<float> out_values;
    EXPECT_TRUE(download_output(name + " out", out.device, out.view, out_values));
    EXPECT_TRUE(judge_values(name + " out", out_values, expected.out));
    EXPECT_TRUE(judge_values(name + " lse", lse_out.to_host(), expected.lse));
  }
}

}  // namespace
}  // namespace selfattn
