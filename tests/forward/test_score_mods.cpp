// Masks and score modifiers (sliding window, softcap, ALiBi, additive bias) on every path, on the
// sim, against the double reference: each feature alone, then combined with each other and with
// both causal alignments, GQA, key lengths, varlen; windows of width 0 and wider than the sequence;
// bias with -inf rows and columns in every broadcast layout and both element types; odd shapes.
// Then the arguments the options must reject. Each test runs once per path.
// This program: the modifiers alone and combined (the keys outside the window never read:
// test_score_mods_window_reads.cpp; the rejected arguments: test_score_mods_arguments.cpp; the
// fixture: score_mods_fixture.h).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attention_harness.h"
#include "gpu_sized.h"
#include "score_mods_fixture.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

// The window alone: both sides, one side, width 0, wider than the sequence, under each alignment.
// head_dim 32 f16 takes the fused path's tensor-core kernel; f32 its SIMT kernel.
TEST_P(ScoreMods, SlidingWindow) {
  Context ctx;
  testing::expect_all_pass(ctx, {
      with(make(DType::f32, 1, 2, 1, 113, 203, 7, none), window(16, 8)),
      with(make(DType::f16, 1, 2, 2, 113, 203, 32, top_left), window(0, 0)),
      with(make(DType::bf16, 2, 2, 1, 64, 113, 32, bottom_right, {113, 40}), window(5, -1)),
      with(make(DType::f32, 1, 1, 1, 7, 64, 16, none), window(-1, 3)),
      with(make(DType::f16, 1, 1, 1, 64, 64, 64, none), window(500, 500)),
      with(make(DType::f32, 1, 1, 1, 113, 7, 2, bottom_right), window(2, 0)),  // first rows see nothing
  });
}

// A narrow window over many keys: the fused kernels start past key tile 0 and stop early.
TEST_P(ScoreMods, NarrowWindowOverLongKeys) {
  Context ctx;
  testing::expect_all_pass(ctx, {
      with(make(DType::f16, 1, 1, 1, 70, 1000, 64, bottom_right), window(40, 0)),
      with(make(DType::f32, 1, 1, 1, 33, 700, 8, top_left, {}, Layout::bshd), window(20, 0)),
      with(make(DType::bf16, 1, 1, 1, 40, 900, 32, none), window(30, 30)),
  });
}

TEST_P(ScoreMods, Softcap) {
  Context ctx;
  ScoreModsCase cap;
  cap.softcap = 1.5f;
  AttentionCase big_scores = make(DType::f32, 1, 2, 1, 113, 64, 32, none);
  big_scores.scale = 1.0f;  // scores of a few units: the cap bends them hard
  testing::expect_all_pass(ctx, {
      with(big_scores, cap),
      with(make(DType::f16, 2, 2, 1, 64, 113, 64, top_left), cap),
      with(make(DType::bf16, 1, 1, 1, 7, 203, 7, bottom_right, {150}), cap),
  });
}

TEST_P(ScoreMods, Alibi) {
  Context ctx;
  ScoreModsCase per_head, per_batch;
  per_head.alibi = AlibiSlopes::heads;
  per_batch.alibi = AlibiSlopes::batch_heads;
  testing::expect_all_pass(ctx, {
      with(make(DType::f32, 2, 4, 2, 64, 113, 16, none), per_head),
      with(make(DType::f16, 3, 2, 1, 113, 64, 32, top_left, {64, 20, 0}), per_batch),
      with(make(DType::bf16, 2, 2, 2, 7, 203, 64, bottom_right), per_batch),
  });
}

// Every bias layout, fp32 and the input dtype, with -inf rows (rows that see no key: out 0, LSE
// -inf) and -inf columns.
TEST_P(ScoreMods, BiasLayoutsAndMasks) {
  Context ctx;
  std::vector<AttentionCase> cases;
  const BiasLayout layouts[] = {BiasLayout::full, BiasLayout::heads, BiasLayout::batch, BiasLayout::keys,
                                BiasLayout::stride0};
  const DType dtypes[] = {DType::f32, DType::f16, DType::bf16};
  for (int i = 0; i < 5; ++i) {
    ScoreModsCase bias;
    bias.bias = layouts[i];
    bias.bias_in_input_dtype = i % 2 == 1;
    bias.masked_row_period = i % 2 == 0 ? 5 : 0;
    bias.masked_key_period = i < 3 ? 7 : 0;
    const DType dtype = dtypes[i % 3];
    cases.push_back(with(make(dtype, 2, 2, 1, 33 + 20 * i, 71 - 10 * i, i % 2 ? 32 : 7, i % 3 == 0 ? none : top_left),
                         bias));
  }
  testing::expect_all_pass(ctx, cases);
}

// A boolean bias (DType::b8: 1 may attend, 0 masks, as SDPA's attn_mask), read by the kernels as
// bytes: every layout, masked rows and columns, each causal mode, GQA, ALiBi and a window beside
// it, and varlen; the fused tensor-core kernels (f16/bf16, head dims 64 and 128) and the SIMT one.
TEST_P(ScoreMods, BooleanBias) {
  Context ctx;
  std::vector<AttentionCase> cases;
  const BiasLayout layouts[] = {BiasLayout::full, BiasLayout::heads, BiasLayout::batch, BiasLayout::keys,
                                BiasLayout::stride0};
  const DType dtypes[] = {DType::f16, DType::bf16, DType::f32};
  const Causal causals[] = {none, top_left, bottom_right};
  for (int i = 0; i < 5; ++i) {
    ScoreModsCase mask;
    mask.bias = layouts[i];
    mask.bias_bool = true;
    mask.masked_row_period = i % 2 == 0 ? 4 : 0;
    mask.masked_key_period = 3 + i;
    if (i == 3) mask.alibi = testing::AlibiSlopes::heads;
    if (i == 4) mask.window_left = 20;
    cases.push_back(with(make(dtypes[i % 3], 2, 4, 2, 40 + 17 * i, 90 - 11 * i, i % 3 == 2 ? 16 : (i % 2 ? 128 : 64),
                              causals[i % 3]),
                         mask));
  }
  testing::expect_all_pass(ctx, cases);
  ScoreModsCase mask;
  mask.bias = BiasLayout::full;
  mask.bias_bool = true;
  mask.masked_key_period = 4;
  testing::VarlenCase varlen = make_varlen(DType::bf16, 2, 1, 64);
  EXPECT_TRUE(testing::check_attention_varlen(ctx, varlen, mask)) << varlen.name();
}

// A bias that masks every key of every row: all outputs 0, every LSE -inf, no NaN.
TEST_P(ScoreMods, BiasMasksEverything) {
  Context ctx;
  ScoreModsCase all;
  all.bias = BiasLayout::keys;
  all.masked_row_period = 1;  // row r is masked when r % 1 == 0: every row
  testing::expect_all_pass(ctx, {with(make(DType::f16, 1, 2, 1, 17, 40, 32, none), all),
                                 with(make(DType::f32, 1, 1, 1, 9, 13, 3, bottom_right), all)});
}
// Everything at once, on odd shapes: window + causal (both alignments) + softcap + ALiBi + bias
// + GQA + key lengths, and the same through attention_varlen.
TEST_P(ScoreMods, Combined) {
  Context ctx;
  const ScoreModsCase all = every_modifier();
  ScoreModsCase all_heads = all;
  all_heads.alibi = AlibiSlopes::heads;
  all_heads.bias = BiasLayout::heads;
  all_heads.bias_in_input_dtype = true;
  testing::expect_all_pass(ctx, {
      with(make(DType::f32, 2, 4, 2, 113, 203, 7, bottom_right, {203, 150}), all),
      with(make(DType::f16, 2, 2, 1, 113, 203, 64, top_left, {100, 203}, Layout::bshd), all_heads),
      with(make(DType::bf16, 1, 3, 1, 64, 113, 32, none), all),
  });

  VarlenCase varlen = make_varlen(DType::f16, 4, 2, 32);
  EXPECT_TRUE(testing::check_attention_varlen(ctx, varlen, all)) << varlen.name() << all.name();
  varlen.dtype = DType::f32;
  varlen.head_dim = 7;
  varlen.causal = none;
  ScoreModsCase varlen_mods = all_heads;
  varlen_mods.bias_in_input_dtype = false;
  varlen_mods.bias = BiasLayout::stride0;
  EXPECT_TRUE(testing::check_attention_varlen(ctx, varlen, varlen_mods)) << varlen.name() << varlen_mods.name();
}

// A mask written with the lowest finite value (torch.finfo(dtype).min) instead of -inf: fp32's
// -FLT_MAX and bf16's -3.39e38 mask like -inf (attention.h: scores at or below -1e38), also rows
// whose every key is so masked (out 0, LSE -inf, or the sink's); f16's -65504 is an ordinary value.
TEST_P(ScoreMods, LowestFiniteBiasMasks) {
  Context ctx;
  ScoreModsCase lowest;
  lowest.bias = BiasLayout::keys;
  lowest.masked_row_period = 3;
  lowest.masked_key_period = 7;
  lowest.mask_with_lowest = true;
  ScoreModsCase input_dtype = lowest;
  input_dtype.bias_in_input_dtype = true;
  ScoreModsCase with_sinks = lowest;
  with_sinks.sinks = true;
  testing::expect_all_pass(ctx, {
      with(make(DType::f32, 1, 2, 1, 40, 70, 7, none), lowest),
      with(make(DType::bf16, 1, 2, 1, 40, 70, 64, bottom_right), input_dtype),
      with(make(DType::f16, 1, 3, 1, 40, 70, 64, top_left), with_sinks),
  });
}

// Attention sinks: every dtype and each fused kernel's head dims (the Hopper kernel's 64 and 128,
// mma.sync's 32, SIMT's odd ones), GQA with a head without a sink (every third), both causal
// alignments, key lengths of 0 and rows the causal mask leaves empty (out 0, LSE the sink's logit),
// a bias that masks every key, and varlen with empty sequences.
TEST_P(ScoreMods, Sinks) {
  Context ctx;
  ScoreModsCase sinks;
  sinks.sinks = true;
  ScoreModsCase masked = sinks;
  masked.bias = BiasLayout::keys;
  masked.masked_row_period = 3;  // rows 2, 5, ...: every key masked, only the sink left
  testing::expect_all_pass(ctx, {
      with(make(DType::f32, 2, 3, 1, 113, 203, 7, none, {0, 150}), sinks),
      with(make(DType::f16, 2, 3, 3, 113, 70, 64, bottom_right, {70, 9}), sinks),  // rows 0-42 see no key
      with(make(DType::bf16, 1, 6, 2, 64, 203, 128, top_left, {}, Layout::bshd), sinks),
      with(make(DType::f16, 1, 3, 1, 7, 64, 32, none), masked),
      with(make(DType::bf16, 1, 3, 1, 1, 1000, 64, bottom_right), sinks),
  });
  const VarlenCase varlen = make_varlen(DType::bf16, 3, 1, 64);
  EXPECT_TRUE(testing::check_attention_varlen(ctx, varlen, sinks)) << varlen.name() << sinks.name();
}

// Sinks beside every other modifier.
TEST_P(ScoreMods, SinksWithEverything) {
  Context ctx;
  ScoreModsCase all = every_modifier();
  all.sinks = true;
  testing::expect_all_pass(ctx, {
      with(make(DType::f32, 2, 3, 1, 113, 203, 7, bottom_right, {203, 150}), all),
      with(make(DType::f16, 2, 3, 3, 113, 203, 64, top_left, {100, 203}, Layout::bshd), all),
  });
}

// Batch 1 of the bias starts 2^31 elements after batch 0: bias offsets need 64 bits. On the sim,
// which reserves the gap without touching it; a GPU would need 8 GB for it.
TEST_P(ScoreMods, BiasOffsetsPast32Bits) {
  Context ctx(Backend::sim);
  ScoreModsCase far;
  far.bias = BiasLayout::batch;
  far.bias_in_input_dtype = true;
  far.bias_batch_gap = int64_t(1) << 31;
  far.masked_key_period = 4;
  testing::expect_all_pass(ctx, {with(make(DType::f16, 2, 2, 1, 7, 64, 32, top_left), far)});
}

// The naive and cublas paths split a call into chunks of heads and of rows when the workspace is
// small: rows of a later chunk keep their window, ALiBi distance and bias row (the fused path, which
// needs no workspace, runs the same cases whole).
TEST_P(ScoreMods, ChunkedByWorkspaceLimit) {
  ContextOptions options;
  options.workspace_limit = 48 * 1024;  // about 60 rows of 203 keys
  Context ctx(options);
  ScoreModsCase all = window(20, 3);
  all.softcap = 3.0f;
  all.alibi = AlibiSlopes::heads;
  all.bias = BiasLayout::batch;
  all.masked_key_period = 5;
  testing::expect_all_pass(ctx, {
      with(make(DType::f32, 2, 2, 1, 150, 203, 16, bottom_right, {203, 90}), all),
      with(make(DType::bf16, 1, 2, 2, 257, 203, 32, top_left), all),
  });
}

INSTANTIATE_TEST_SUITE_P(EveryPath, ScoreMods, ::testing::Values(Path::naive, Path::cublas, Path::fused),
                         [](const ::testing::TestParamInfo<Path>& info) { return std::string(to_string(info.param)); });

// GPU-sized (support/gpu_sized.h): every modifier at every head dim of the tensor-core kernels over
// hundreds of rows, a narrow window over 8k keys, a varlen batch.
class ScoreModsOnGpu : public testing::GpuSized<::testing::TestWithParam<Path>> {
 protected:
  Path path() const { return GetParam(); }
};

// every_modifier() over more keys: window (100, 20), softcap 8, -inf bias rows and columns sparser.
ScoreModsCase larger_every_modifier() {
  ScoreModsCase m = every_modifier();
  m.window_left = 100;
  m.window_right = 20;
  m.softcap = 8.0f;
  m.masked_row_period = 37;
  m.masked_key_period = 13;
  return m;
}

TEST_P(ScoreModsOnGpu, EveryFeatureEveryDtype) {
  std::vector<AttentionCase> cases;
  const Causal causals[] = {Causal::none, Causal::top_left, Causal::bottom_right};
  int i = 0;
  for (DType dtype : {DType::f32, DType::f16, DType::bf16})
    for (int head_dim : {32, 64, 96, 128, 256}) {
      AttentionCase c = make_case(dtype, 2, 4, 2, 300 + 7 * i, 700 - 11 * i, head_dim, causals[i % 3],
                                  i % 2 ? Layout::bshd : Layout::bhsd, true, i % 4 ? std::vector<int32_t>{}
                                                                                   : std::vector<int32_t>{650, 300},
                                  path());
      c.mods = larger_every_modifier();
      c.mods.bias = i % 2 ? BiasLayout::heads : BiasLayout::full;
      c.mods.bias_in_input_dtype = i % 3 == 1;
      cases.push_back(c);
      ++i;
    }
  testing::expect_all_pass(ctx, cases);
}

// A window of 128 keys over 8k: the fused kernels visit only the window's tiles.
TEST_P(ScoreModsOnGpu, NarrowWindowOverLongKeys) {
  ScoreModsCase window;
  window.window_left = 128;
  window.window_right = 0;
  AttentionCase c = make_case(DType::bf16, 1, 4, 1, 1000, 8192, 128, Causal::bottom_right, Layout::bhsd, true, {}, path());
  c.mods = window;
  AttentionCase no_causal = make_case(DType::f16, 1, 2, 2, 2000, 2000, 64, Causal::none, Layout::bshd, true, {}, path());
  no_causal.mods = window;
  no_causal.mods.window_right = 64;
  testing::expect_all_pass(ctx, {c, no_causal});
}

TEST_P(ScoreModsOnGpu, Varlen) {
  testing::VarlenCase c{DType::bf16, 4, 2, 128, {170, 0, 513}, {500, 30, 513}, Causal::bottom_right, Layout::bshd,
                        true, path()};
  EXPECT_TRUE(testing::check_attention_varlen(ctx, c, larger_every_modifier())) << c.name() << larger_every_modifier().name();
}

INSTANTIATE_TEST_SUITE_P(EveryPath, ScoreModsOnGpu, ::testing::Values(Path::naive, Path::cublas, Path::fused),
                         [](const ::testing::TestParamInfo<Path>& info) { return std::string(to_string(info.param)); });

}  // namespace
}  // namespace selfattn
