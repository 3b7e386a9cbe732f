// Dropout on the attention weights (AttentionOptions::dropout_p, seed, offset) on every path, on the
// sim: each case against the double reference fed the library's own keep mask
// (reference::dropout_keep_mask, the same Philox function), judged by the shared rule
// (support/judge.h; the allowed computation drops what the mask drops, attention_expected.h), so a
// wrong mask bit, scale or coordinate fails by a whole probability. Odd and round sizes, each
// causal alignment, GQA, key lengths, windows, every modifier and sinks beside it, varlen. Then
// what only running twice shows: the same seed and offset give bitwise the same output, another
// seed or offset another mask, dropout_p = 0 is bitwise the call without dropout; and the mask's
// keep rate over a large call, read back through the output itself.
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "attention_harness.h"
#include "score_mods_fixture.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

class Dropout : public ScoreMods {};

ScoreModsCase dropout(float p, uint64_t seed = 1234, uint64_t offset = 0) {
  ScoreModsCase m;
  m.dropout_p = p;
  m.dropout_seed = seed;
  m.dropout_offset = offset;
  return m;
}

// Odd and round shapes; f32 takes the fused path's SIMT kernel, f16/bf16 its tensor-core one (on
// the sim's compute capability 9.0, head_dim 64 and 128 would take the Hopper kernel without
// dropout: with it they must run the mma.sync kernel).
TEST_P(Dropout, Shapes) {
  Context ctx;
  testing::expect_all_pass(ctx, {
      with(make(DType::f32, 1, 2, 1, 113, 203, 7, none), dropout(0.3f)),
      with(make(DType::f32, 1, 1, 1, 1, 1, 1, none), dropout(0.2f, 7)),
      with(make(DType::f32, 2, 1, 1, 7, 113, 16, none), dropout(0.9f, 99, 5)),
      with(make(DType::f16, 2, 2, 2, 64, 64, 64, none), dropout(0.1f)),
      with(make(DType::bf16, 1, 2, 1, 113, 128, 128, none), dropout(0.5f, 3)),
      with(make(DType::f16, 1, 1, 1, 1, 7, 32, none), dropout(0.25f, 11)),
  });
}

// Each causal alignment, GQA and key lengths (rows that see no key stay 0 with LSE -inf).
TEST_P(Dropout, CausalGqaAndKeyLengths) {
  Context ctx;
  testing::expect_all_pass(ctx, {
      with(make(DType::f16, 2, 4, 2, 113, 203, 64, top_left), dropout(0.2f)),
      with(make(DType::bf16, 2, 4, 1, 7, 113, 32, bottom_right, {113, 40}), dropout(0.5f, 8)),
      with(make(DType::f32, 2, 2, 2, 113, 7, 7, bottom_right, {0, 5}), dropout(0.3f, 9)),
      with(make(DType::f16, 1, 2, 1, 64, 64, 128, bottom_right, {}, Layout::bshd), dropout(0.15f, 10)),
  });
}

// Beside the sliding window and every other modifier, sinks included (the sink is never dropped).
TEST_P(Dropout, WithWindowModifiersAndSinks) {
  Context ctx;
  ScoreModsCase win = window(16, 8);
  win.dropout_p = 0.3f;
  win.dropout_seed = 5;
  ScoreModsCase all = every_modifier();
  all.sinks = true;
  all.dropout_p = 0.2f;
  all.dropout_seed = 6;
  all.dropout_offset = 1u << 20;
  ScoreModsCase sinks = dropout(0.4f, 12);
  sinks.sinks = true;
  testing::expect_all_pass(ctx, {
      with(make(DType::f16, 1, 2, 1, 113, 203, 32, none), win),
      with(make(DType::f32, 2, 4, 2, 70, 113, 16, bottom_right, {113, 60}), all),
      with(make(DType::bf16, 2, 3, 3, 64, 90, 64, top_left), all),
      with(make(DType::f32, 1, 3, 1, 33, 47, 7, none), sinks),
  });
}

// The naive and cublas paths run the rows in chunks when the workspace limit is small: each chunk
// draws with its rows' place in the call (not in the chunk), so the mask is the whole call's.
TEST_P(Dropout, ChunkedByWorkspaceLimit) {
  Context ctx;
  ctx.set_workspace_limit(10 * 1024);  // about 20 rows of 113 keys a chunk
  testing::expect_all_pass(ctx, {
      with(make(DType::f32, 1, 2, 1, 113, 113, 16, top_left), dropout(0.3f, 31)),
      with(make(DType::f16, 2, 2, 2, 70, 113, 32, none), dropout(0.2f, 32)),
  });
}

// attention_varlen: each sequence's mask is the sequence's (b the sequence index, rows and keys
// counted within it), whichever path runs it.
TEST_P(Dropout, Varlen) {
  Context ctx;
  VarlenCase varlen = make_varlen(DType::f16, 4, 2, 32);
  EXPECT_TRUE(testing::check_attention_varlen(ctx, varlen, dropout(0.3f, 21))) << varlen.name();
  varlen.dtype = DType::f32;
  varlen.head_dim = 7;
  varlen.causal = none;
  ScoreModsCase mods = window(20, 3);
  mods.dropout_p = 0.6f;
  mods.dropout_seed = 22;
  mods.dropout_offset = 3;
  EXPECT_TRUE(testing::check_attention_varlen(ctx, varlen, mods)) << varlen.name();
  varlen = make_varlen(DType::bf16, 2, 1, 64);
  EXPECT_TRUE(testing::check_attention_varlen(ctx, varlen, dropout(0.1f, 23))) << varlen.name();
}

// One call's output bytes, for the bitwise checks below: inputs fixed by `seed_inputs`, out
// poisoned (NaN) before the call.
struct Outputs {
  std::vector<uint16_t> out;
  std::vector<float> lse;
};

class DropoutRuns : public ::testing::TestWithParam<Path> {
 protected:
  static constexpr int kBatch = 2, kHeads = 2, kSeqQ = 37, kSeqK = 70, kDim = 32;
  Context ctx;
  DeviceBuffer<__half> q{ctx, size_t(kBatch) * kHeads * kSeqQ * kDim}, k{ctx, size_t(kBatch) * kHeads * kSeqK * kDim},
      v{ctx, k.size()}, out{ctx, q.size()};
  DeviceBuffer<float> lse{ctx, size_t(kBatch) * kHeads * kSeqQ};

  void SetUp() override {
    std::vector<__half> host(k.size());
    for (size_t i = 0; i < host.size(); ++i) host[i] = __float2half(float(std::sin(0.37 * double(i))));
    q.copy_from_host(host.data(), q.size());
    k.copy_from_host(host.data(), k.size());
    for (size_t i = 0; i < host.size(); ++i) host[i] = __float2half(float(std::cos(0.11 * double(i))));
    v.copy_from_host(host.data(), v.size());
  }
  Outputs run(float p, uint64_t seed, uint64_t offset, bool set_dropout = true) {
    AttentionOptions options;
    options.path = GetParam();
    options.causal = Causal::bottom_right;
    options.lse = lse.data();
    if (set_dropout) {
      options.dropout_p = p;
      options.dropout_seed = seed;
      options.dropout_offset = offset;
    }
    out.fill_bytes(0xFF);
    lse.fill_bytes(0xFF);
    attention(ctx, TensorView::bhsd(q.data(), DType::f16, kBatch, kHeads, kSeqQ, kDim),
              TensorView::bhsd(k.data(), DType::f16, kBatch, kHeads, kSeqK, kDim),
              TensorView::bhsd(v.data(), DType::f16, kBatch, kHeads, kSeqK, kDim),
              TensorView::bhsd(out.data(), DType::f16, kBatch, kHeads, kSeqQ, kDim), options);
    ctx.synchronize();
    Outputs r;
    r.out.resize(out.size());
    r.lse.resize(lse.size());
    out.copy_to_host(reinterpret_cast<__half*>(r.out.data()), r.out.size());
    lse.copy_to_host(r.lse.data(), r.lse.size());
    for (uint16_t bits : r.out) EXPECT_NE(bits & 0x7C00, 0x7C00) << "out holds NaN or inf";
    return r;
  }
};

// Same seed and offset: bitwise the same output (and the LSE, which dropout never changes). Another
// seed, another offset: another output. dropout_p = 0 with any seed: bitwise the call without it.
TEST_P(DropoutRuns, DeterministicPerSeedAndOffset) {
  const Outputs first = run(0.3f, 42, 7), again = run(0.3f, 42, 7);
  EXPECT_EQ(first.out, again.out);
  EXPECT_EQ(0, std::memcmp(first.lse.data(), again.lse.data(), first.lse.size() * sizeof(float)));
  const Outputs other_seed = run(0.3f, 43, 7), other_offset = run(0.3f, 42, 8);
  EXPECT_NE(first.out, other_seed.out);
  EXPECT_NE(first.out, other_offset.out);
  const Outputs plain = run(0.0f, 0, 0, /*set_dropout=*/false), zero = run(0.0f, 42, 7);
  EXPECT_EQ(plain.out, zero.out);
  EXPECT_EQ(0, std::memcmp(plain.lse.data(), first.lse.data(), plain.lse.size() * sizeof(float)));
}

INSTANTIATE_TEST_SUITE_P(EveryPath, Dropout, ::testing::Values(Path::naive, Path::cublas, Path::fused),
                         [](const ::testing::TestParamInfo<Path>& info) { return std::string(to_string(info.param)); });
INSTANTIATE_TEST_SUITE_P(EveryPath, DropoutRuns, ::testing::Values(Path::naive, Path::cublas, Path::fused),
                         [](const ::testing::TestParamInfo<Path>& info) { return std::string(to_string(info.param)); });

// The keep rate as the kernels apply it: q = 0 makes every row's softmax uniform over its n keys,
// and v = 1 makes out = (kept keys / n) / (1 - p) in every column, so each row's output counts its
// kept keys exactly (fp32, SIMT fused kernel and the naive path). Over 2 x 2 x 32 rows of 1000 keys
// (128000 draws) the rate is within 5 standard deviations of 1 - p.
TEST(DropoutKeepRate, CloseToOneMinusP) {
  Context ctx;
  constexpr int kBatch = 2, kHeads = 2, kSeqQ = 32, kSeqK = 1000, kDim = 4;
  DeviceBuffer<float> q(ctx, size_t(kBatch) * kHeads * kSeqQ * kDim), k(ctx, size_t(kBatch) * kHeads * kSeqK * kDim),
      v(ctx, k.size()), out(ctx, q.size());
  q.copy_from_host(std::vector<float>(q.size(), 0.0f));
  k.copy_from_host(std::vector<float>(k.size(), 0.5f));
  v.copy_from_host(std::vector<float>(v.size(), 1.0f));
  for (const Path path : {Path::fused, Path::naive}) {
    for (const float p : {0.1f, 0.5f, 0.85f}) {
      AttentionOptions options;
      options.path = path;
      options.dropout_p = p;
      options.dropout_seed = 2024;
      out.fill_bytes(0xFF);
      attention(ctx, TensorView::bhsd(q.data(), DType::f32, kBatch, kHeads, kSeqQ, kDim),
                TensorView::bhsd(k.data(), DType::f32, kBatch, kHeads, kSeqK, kDim),
                TensorView::bhsd(v.data(), DType::f32, kBatch, kHeads, kSeqK, kDim),
                TensorView::bhsd(out.data(), DType::f32, kBatch, kHeads, kSeqQ, kDim), options);
      std::vector<float> host(out.size());
      out.copy_to_host(host.data(), host.size());
      double kept = 0;
      for (size_t row = 0; row < host.size() / kDim; ++row) {
        ASSERT_TRUE(std::isfinite(host[row * kDim])) << "row " << row;
        kept += std::round(double(host[row * kDim]) * (1.0 - p) * kSeqK);  // this row's kept keys
      }
      const double draws = double(kBatch) * kHeads * kSeqQ * kSeqK, rate = kept / draws;
      const double sigma = std::sqrt(p * (1.0 - p) / draws);
      EXPECT_NEAR(rate, 1.0 - p, 5 * sigma) << to_string(path) << " p " << p;
    }
  }
}

}  // namespace
}  // namespace selfattn
