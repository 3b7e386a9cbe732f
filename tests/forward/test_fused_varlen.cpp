// The fused path on variable-length batches (attention_varlen: packed sequences, cu_seqlens, zero-
// length sequences; each sequence judged against the reference on its own by the shared harness),
// its determinism (bitwise-equal results under different sim schedules), and graph capture of the
// varlen forward and backward once the workspace is warm.
#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <random>
#include <vector>

#include <selfattn_sim/sim.h>

#include "attention_harness.h"
#include "gpu_sized.h"
#include "selfattn/selfattn.h"
#include "runtime/sim_capture_scope.h"

namespace selfattn {
namespace {

using testing::Layout;
using testing::VarlenCase;

TEST(FusedVarlen, PackedSequencesWithEmptyOnes) {
  Context ctx;
  constexpr Layout bhsd = Layout::bhsd, bshd = Layout::bshd;
  constexpr Path fused = Path::fused;
  const std::vector<VarlenCase> cases = {
      {DType::f16, 2, 1, 64, {7, 0, 113, 1}, {64, 5, 0, 203}, Causal::none, bhsd, true, fused},
      {DType::bf16, 4, 2, 128, {33, 64, 0}, {33, 100, 7}, Causal::bottom_right, bshd, true, fused},
      {DType::f16, 1, 1, 96, {0, 65, 2}, {0, 31, 9}, Causal::top_left, bhsd, true, fused},
      {DType::bf16, 2, 2, 256, {17, 40}, {50, 8}, Causal::top_left, bhsd, false, fused},
      {DType::f16, 3, 1, 32, {129, 3}, {70, 3}, Causal::bottom_right, bshd, true, fused},
      {DType::f32, 2, 1, 64, {7, 0, 40}, {70, 9, 0}, Causal::bottom_right, bhsd, true, fused},
      {DType::f32, 1, 1, 13, {20, 5}, {20, 80}, Causal::none, bshd, true, fused},
      // Rows not on 16 bytes: the tensor-core kernel's cp.async cannot take them; the SIMT one runs.
      {DType::f16, 2, 1, 64, {9, 33}, {40, 70}, Causal::top_left, bhsd, true, fused, 1},
      {DType::bf16, 1, 1, 128, {17}, {33}, Causal::none, bhsd, true, fused, 3},
      // Views longer than cu_seqlens says (a batch padded to a bucket): NaN rows nobody owns, which
      // out and lse must leave unwritten - the tensor-core kernel and the SIMT one.
      {DType::f16, 2, 1, 64, {9, 0, 70}, {30, 4, 65}, Causal::bottom_right, bshd, true, fused, 0,
       testing::Strides::distinct, 7, 5},
      {DType::f32, 2, 2, 24, {33, 3}, {12, 40}, Causal::none, bhsd, true, fused, 0, testing::Strides::distinct, 3, 9},
  };
  for (const VarlenCase& c : cases) EXPECT_TRUE(testing::check_attention_varlen(ctx, c));
}

// Runs one padded call twice under different sim schedules; the outputs must match bit for bit
// (the kernels have no atomics and a fixed reduction order; a race would show as a difference).
std::vector<unsigned char> run_once(Context& ctx, DType dtype, int head_dim, Causal causal, uint64_t schedule_seed) {
  const int batch = 2, heads = 2, kv_heads = 1, seq_q = 77, seq_k = 91;
  std::mt19937_64 rng(1234);
  auto operand = [&](size_t count) { return testing::random_device_values(ctx, dtype, count, rng, "determinism operand"); };
  DeviceBuffer<unsigned char> q = operand(size_t(batch) * heads * seq_q * head_dim);
  DeviceBuffer<unsigned char> k = operand(size_t(batch) * kv_heads * seq_k * head_dim);
  DeviceBuffer<unsigned char> v = operand(size_t(batch) * kv_heads * seq_k * head_dim);
  DeviceBuffer<unsigned char> out(ctx, size_t(batch) * heads * seq_q * head_dim * dtype_size(dtype), "out");
  DeviceBuffer<float> lse(ctx, size_t(batch) * heads * seq_q, "lse");
  out.fill_bytes(0xff);
  sim::Options sim_options = sim::options();
  const sim::Options saved = sim_options;
  sim_options.seed = schedule_seed;
  sim::set_options(sim_options);
  AttentionOptions options;
  options.path = Path::fused;
  options.causal = causal;
  options.lse = lse.data();
  attention(ctx, TensorView::bhsd(q.data(), dtype, batch, heads, seq_q, head_dim),
            TensorView::bhsd(k.data(), dtype, batch, kv_heads, seq_k, head_dim),
            TensorView::bhsd(v.data(), dtype, batch, kv_heads, seq_k, head_dim),
            TensorView::bhsd(out.data(), dtype, batch, heads, seq_q, head_dim), options);
  ctx.synchronize();
  sim::set_options(saved);
  std::vector<unsigned char> bytes = out.to_host();
  const std::vector<float> lse_host = lse.to_host();
  const auto* lse_bytes = reinterpret_cast<const unsigned char*>(lse_host.data());
  bytes.insert(bytes.end(), lse_bytes, lse_bytes + lse_host.size() * sizeof(float));
  return bytes;
}

TEST(FusedDeterminism, BitwiseEqualUnderDifferentSchedules) {
  Context ctx;
  for (DType dtype : {DType::f16, DType::bf16, DType::f32}) {
    const std::vector<unsigned char> first = run_once(ctx, dtype, 64, Causal::top_left, 11);
    const std::vector<unsigned char> second = run_once(ctx, dtype, 64, Causal::top_left, 12345);
    ASSERT_EQ(first.size(), second.size());
    EXPECT_EQ(std::memcmp(first.data(), second.data(), first.size()), 0) << to_string(dtype);
  }
}

// The fused varlen forward and backward read cu_seqlens on the device only: once the context's
// workspace holds their running maximum (and the backward's D), both run inside a SimCaptureScope
// (what a CUDA graph capture cannot contain - host reads of device data, allocations,
// synchronisation - refused) and give the bytes they gave outside it. A cold context has to grow its
// workspace first, which the scope refuses.
TEST(FusedVarlen, RunsInAGraphCaptureOnceTheWorkspaceIsWarm) {
  const DType dtype = DType::bf16;
  const int heads = 2, total_q = 12, total_k = 20, d = 64;
  const std::vector<int32_t> offsets_q{0, 5, 5, 12}, offsets_k{0, 9, 20, 20};
  // Forward then backward on `ctx`, inside the scope or not; every output poisoned first. Returns
  // the bytes of out, dq, dk and dv.
  BackwardOptions deterministic;  // dQ without atomics: the two runs' bytes compare exactly
  deterministic.deterministic = true;
  const auto step = [&](Context& ctx, bool captured) {
    std::mt19937_64 rng(77);
    auto operand = [&](int rows) { return testing::random_device_values(ctx, dtype, size_t(rows) * d, rng, "operand"); };
    DeviceBuffer<unsigned char> q = operand(heads * total_q), k = operand(total_k), v = operand(total_k);
    DeviceBuffer<unsigned char> dout = operand(heads * total_q);
    DeviceBuffer<int32_t> cu_q(ctx, 4, "cu_seqlens_q"), cu_k(ctx, 4, "cu_seqlens_k");
    cu_q.copy_from_host(offsets_q);
    cu_k.copy_from_host(offsets_k);
    DeviceBuffer<unsigned char> out(ctx, size_t(heads) * total_q * d * 2, "out"), dq(ctx, out.size(), "dq");
    DeviceBuffer<unsigned char> dk(ctx, size_t(total_k) * d * 2, "dk"), dv(ctx, dk.size(), "dv");
    DeviceBuffer<float> lse(ctx, size_t(heads) * total_q, "lse");
    for (DeviceBuffer<unsigned char>* b : {&out, &dq, &dk, &dv}) b->fill_bytes(0xff);
    lse.fill_bytes(0xff);
    const auto rows = [&](DeviceBuffer<unsigned char>& b, int h, int n) { return TensorView::bhsd(b.data(), dtype, 1, h, n, d); };
    {
      std::optional<detail::SimCaptureScope> capture;
      if (captured) capture.emplace();
      AttentionOptions options;
      options.path = Path::fused;
      options.causal = Causal::bottom_right;
      options.lse = lse.data();
      attention_varlen(ctx, rows(q, heads, total_q), rows(k, 1, total_k), rows(v, 1, total_k), rows(out, heads, total_q),
                       cu_q.data(), cu_k.data(), 3, 7, 11, options);
      options.lse = nullptr;
      attention_varlen_backward(ctx, rows(q, heads, total_q), rows(k, 1, total_k), rows(v, 1, total_k),
                                rows(out, heads, total_q), rows(dout, heads, total_q), lse.data(),
                                rows(dq, heads, total_q), rows(dk, 1, total_k), rows(dv, 1, total_k), cu_q.data(),
                                cu_k.data(), 3, 7, 11, options, deterministic);
    }
    ctx.synchronize();
    std::vector<unsigned char> bytes;
    for (DeviceBuffer<unsigned char>* b : {&out, &dq, &dk, &dv}) {
      const std::vector<unsigned char> host = b->to_host();
      bytes.insert(bytes.end(), host.begin(), host.end());
    }
    return bytes;
  };
  // The scope is the sim's (the cuda backend's graph capture is the CUDA runtime's own).
  Context cold(Backend::sim);
  EXPECT_THROW((void)step(cold, /*captured=*/true), BackendError);
  Context ctx(Backend::sim);
  const std::vector<unsigned char> outside = step(ctx, /*captured=*/false);
  EXPECT_EQ(step(ctx, /*captured=*/true), outside);
}

// GPU-sized (support/gpu_sized.h): packed batches of hundreds of rows at every tensor-core head dim.
using FusedVarlenOnGpu = testing::GpuSized<>;

TEST_F(FusedVarlenOnGpu, HundredsOfRowsEveryHeadDim) {
  constexpr Layout bhsd = Layout::bhsd, bshd = Layout::bshd;
  constexpr Path fused = Path::fused;
  const std::vector<testing::VarlenCase> cases = {
      {DType::f16, 4, 2, 128, {300, 0, 1, 129}, {512, 7, 0, 129}, Causal::bottom_right, bshd, true, fused},
      {DType::bf16, 2, 1, 64, {64, 700}, {1000, 65}, Causal::top_left, bhsd, true, fused},
      {DType::f16, 2, 2, 256, {33, 200}, {100, 300}, Causal::none, bshd, true, fused},
      {DType::f32, 2, 1, 96, {50, 0, 70}, {130, 3, 0}, Causal::bottom_right, bhsd, true, fused},
      {DType::bf16, 2, 1, 64, {90, 33}, {40, 170}, Causal::top_left, bhsd, true, fused, 1},
  };
  for (const testing::VarlenCase& c : cases) EXPECT_TRUE(testing::check_attention_varlen(ctx, c));
}

}  // namespace
}  // namespace selfattn
