// Graph-friendliness of the KV-cache calls on the sim: once the context's workspace is warm,
// append_kv, attention_with_kv_cache (every path), merge_states and cu_seqlens_from_lengths run
// inside a SimCaptureScope, as do the packed append_kv_varlen and attention_with_kv_cache_varlen
// (fused path),
// where the sim device refuses synchronous copies (host reads of device data), allocations and
// stream synchronisation - what a CUDA graph capture cannot contain - and give the same bytes as
// outside it. The calls documented as not graph-safe are refused there.
#include <gtest/gtest.h>

#include <vector>

#include "kv_cache_check.h"
#include "selfattn/selfattn.h"
#include "runtime/sim_capture_scope.h"

namespace selfattn {
namespace {

using namespace kv_test;

struct DecodeStep {
  Context ctx;
  std::mt19937_64 rng{21};
  TestCache cache;
  Tensor q, k_new, v_new;
  DeviceBuffer<int32_t> updated{ctx, 3, "updated lengths"};
  DeviceBuffer<unsigned char> out = poisoned(ctx, DType::f16, 3 * 4 * 2 * 64);
  DeviceBuffer<unsigned char> merged = poisoned(ctx, DType::f16, 3 * 4 * 2 * 64);
  DeviceBuffer<float> lse{ctx, 3 * 4 * 2, "lse"}, merged_lse{ctx, 3 * 4 * 2, "merged lse"};
  DeviceBuffer<int32_t> cu_seqlens{ctx, 4, "cu_seqlens"};
  std::vector<unsigned char> k_pool, v_pool;  // the pools as made

  DecodeStep() {
    CacheSpec spec;
    spec.dtype = DType::f16;
    spec.batch = 3;
    spec.kv_heads = 2;
    spec.head_dim = 64;
    spec.page_size = 16;
    spec.max_pages_per_seq = 4;
    spec.lengths = {0, 17, 40};
    cache = make_cache(ctx, spec, rng);
    // Packed: the batch-1 step below views sequence 0 of each by hand.
    q = random_tensor(ctx, DType::f16, 3, 4, 2, 64, rng, kPacked);
    k_new = random_tensor(ctx, DType::f16, 3, 2, 2, 64, rng, kPacked);
    v_new = random_tensor(ctx, DType::f16, 3, 2, 2, 64, rng, kPacked);
    k_pool = cache.k.to_host();
    v_pool = cache.v.to_host();
  }

  // Every output NaN / 0xff again and the pools as before any append, so that a call skipped in
  // the scope cannot pass on what the run outside it left.
  void reset() {
    for (DeviceBuffer<unsigned char>* buffer : {&out, &merged}) buffer->fill_bytes(0xff);
    for (DeviceBuffer<float>* buffer : {&lse, &merged_lse}) buffer->fill_bytes(0xff);
    for (DeviceBuffer<int32_t>* buffer : {&updated, &cu_seqlens}) buffer->fill_bytes(0xff);
    cache.k.copy_from_host(k_pool);
    cache.v.copy_from_host(v_pool);
  }

  TensorView out_view(DeviceBuffer<unsigned char>& buffer) {
    return TensorView::bhsd(buffer.data(), DType::f16, 3, 4, 2, 64);
  }

  // One layer's decode step: append the new tokens (the updated lengths go to a second array),
  // attend with those lengths, merge the result with itself (a stand-in for a cascade's parts),
  // and derive varlen offsets from the new lengths.
  void run(Path path) {
    AppendKvOptions append;
    append.updated_lengths = updated.data();
    append_kv(ctx, cache.view, k_new.view, v_new.view, append);
    KvCache after = cache.view;
    after.lengths = updated.data();
    KvAttentionOptions options;
    options.path = path;
    options.lse = lse.data();
    options.num_splits = 3;
    attention_with_kv_cache(ctx, q.view, after, out_view(out), options);
    merge_states(ctx, out_view(out), lse.data(), out_view(out), lse.data(), out_view(merged), merged_lse.data());
    cu_seqlens_from_lengths(ctx, updated.data(), 3, cu_seqlens.data());
  }

  // Everything the step writes, as bytes.
  std::vector<unsigned char> results() {
    std::vector<unsigned char> bytes;
    const auto add = [&](const auto& values) {
      const auto* first = reinterpret_cast<const unsigned char*>(values.data());
      bytes.insert(bytes.end(), first, first + values.size() * sizeof(values[0]));
    };
    add(out.to_host());
    add(merged.to_host());
    add(lse.to_host());
    add(merged_lse.to_host());
    add(updated.to_host());
    add(cu_seqlens.to_host());
    add(cache.k.to_host());
    add(cache.v.to_host());
    return bytes;
  }
};

TEST(KvCacheGraph, WarmDecodeStepMakesNoSyncNoAllocation) {
  for (Path path : {Path::fused, Path::naive, Path::cublas}) {
    DecodeStep step;
    step.reset();
    step.run(path);  // grows the workspace
    step.ctx.synchronize();
    const std::vector<unsigned char> outside = step.results();
    step.reset();
    {
      detail::SimCaptureScope capture;
      EXPECT_NO_THROW(step.run(path)) << to_string(path);
    }
    step.ctx.synchronize();
    EXPECT_TRUE(step.results() == outside) << to_string(path) << ": different bytes inside the scope";
  }
}

// The scope does refuse: a cold context allocates its workspace, validate_metadata reads the
// metadata back, and attention_varlen on the naive path reads cu_seqlens back.
TEST(KvCacheGraph, ScopeRefusesWhatIsNotGraphSafe) {
  DecodeStep step;
  {
    detail::SimCaptureScope capture;
    EXPECT_THROW(step.run(Path::fused), BackendError);  // the workspace is not grown yet
  }
  step.run(Path::fused);
  KvAttentionOptions options;
  options.validate_metadata = true;
  DeviceBuffer<int32_t> cu(step.ctx, 2, "cu_seqlens");
  cu.copy_from_host(std::vector<int32_t>{0, 2});
  AttentionOptions naive;
  naive.path = Path::naive;
  const TensorView q1 = TensorView::bhsd(step.q.device.data(), DType::f16, 1, 4, 2, 64);
  const TensorView k1 = TensorView::bhsd(step.k_new.device.data(), DType::f16, 1, 2, 2, 64);
  const TensorView v1 = TensorView::bhsd(step.v_new.device.data(), DType::f16, 1, 2, 2, 64);
  const TensorView out1 = TensorView::bhsd(step.out.data(), DType::f16, 1, 4, 2, 64);
  detail::SimCaptureScope capture;
  EXPECT_THROW(attention_with_kv_cache(step.ctx, step.q.view, step.cache.view, step.out_view(step.out), options),
               BackendError);
  EXPECT_THROW(attention_varlen(step.ctx, q1, k1, v1, out1, cu.data(), cu.data(), 1, 2, 2, naive),
               BackendError);
}

// A continuous-batching step: sequences with 3, 0 and 1 new tokens appended and attended in one
// packed call each, fused; the same bytes inside the scope once warm. The naive path reads
// cu_seqlens_q back and is refused there.
TEST(KvCacheGraph, WarmPackedStepMakesNoSyncNoAllocation) {
  DecodeStep step;
  DeviceBuffer<int32_t> offsets(step.ctx, 4, "packed offsets");
  const TensorView q = TensorView::bshd(step.q.device.data(), DType::f16, 1, 4, 4, 64);
  const TensorView k_new = TensorView::bshd(step.k_new.device.data(), DType::f16, 1, 2, 4, 64);
  const TensorView v_new = TensorView::bshd(step.v_new.device.data(), DType::f16, 1, 2, 4, 64);
  const TensorView out = TensorView::bshd(step.out.data(), DType::f16, 1, 4, 4, 64);
  const auto run = [&](Path path) {
    AppendKvOptions append;
    append.updated_lengths = step.updated.data();
    append_kv_varlen(step.ctx, step.cache.view, k_new, v_new, offsets.data(), 3, append);
    KvCache after = step.cache.view;
    after.lengths = step.updated.data();
    KvAttentionOptions options;
    options.path = path;
    options.lse = step.lse.data();
    options.num_splits = 2;
    attention_with_kv_cache_varlen(step.ctx, q, offsets.data(), 3, after, out, options);
  };
  const auto reset = [&] {
    step.reset();
    offsets.copy_from_host(std::vector<int32_t>{0, 3, 3, 4});
  };
  reset();
  run(Path::fused);
  step.ctx.synchronize();
  const std::vector<unsigned char> outside = step.results();
  reset();
  {
    detail::SimCaptureScope capture;
    EXPECT_NO_THROW(run(Path::fused));
  }
  step.ctx.synchronize();
  EXPECT_TRUE(step.results() == outside) << "different bytes inside the scope";
  run(Path::naive);  // warm
  detail::SimCaptureScope capture;
  EXPECT_THROW(run(Path::naive), BackendError);
}

}  // namespace
}  // namespace selfattn
