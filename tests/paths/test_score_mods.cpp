// Masks and score modifiers (sliding window, softcap, ALiBi, additive bias) on every path, on the
// sim, against the double reference: each feature alone, then combined with each other and with
// both causal alignments, GQA, key lengths, varlen; windows of width 0 and wider than the sequence;
// bias with -inf rows and columns in every broadcast layout and both element types; odd shapes.
// Then the arguments the options must reject. Each test runs once per path.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <utility>
#include <string>
#include <vector>

#include "attention_harness.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

using testing::AlibiSlopes;
using testing::AttentionCase;
using testing::BiasLayout;
using testing::Layout;
using testing::make_case;
using testing::ScoreModsCase;
using testing::VarlenCase;

constexpr Causal none = Causal::none, top_left = Causal::top_left, bottom_right = Causal::bottom_right;

ScoreModsCase window(int left, int right) {
  ScoreModsCase m;
  m.window_left = left;
  m.window_right = right;
  return m;
}

// Window (30, 10), softcap, [batch, heads] ALiBi and a full bias with -inf rows and columns.
ScoreModsCase every_modifier() {
  ScoreModsCase all = window(30, 10);
  all.softcap = 4.0f;
  all.alibi = AlibiSlopes::batch_heads;
  all.bias = BiasLayout::full;
  all.masked_row_period = 11;
  all.masked_key_period = 9;
  return all;
}

AttentionCase with(AttentionCase c, const ScoreModsCase& mods) {
  c.mods = mods;
  return c;
}

class ScoreMods : public ::testing::TestWithParam<Path> {
 protected:
  Path path() const { return GetParam(); }
  // Shorthand: dtype, batch, heads / kv_heads, seq_q x seq_k, head_dim, causal, lse, key lengths.
  AttentionCase make(DType dtype, int batch, int heads, int kv_heads, int seq_q, int seq_k, int head_dim,
                     Causal causal, std::vector<int32_t> key_lengths = {}, Layout layout = Layout::bhsd) const {
    return make_case(dtype, batch, heads, kv_heads, seq_q, seq_k, head_dim, causal, layout, true,
                     std::move(key_lengths), path());
  }
  // Four sequences, bottom-right causal, LSE: one without queries, one without keys, one short.
  VarlenCase make_varlen(DType dtype, int heads, int kv_heads, int head_dim) const {
    VarlenCase varlen;
    varlen.dtype = dtype;
    varlen.heads = heads;
    varlen.kv_heads = kv_heads;
    varlen.head_dim = head_dim;
    varlen.seq_q = {37, 0, 64, 5};
    varlen.seq_k = {90, 12, 64, 0};
    varlen.causal = bottom_right;
    varlen.with_lse = true;
    varlen.path = path();
    return varlen;
  }
};

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

// A bias that masks every key of every row: all outputs 0, every LSE -inf, no NaN.
TEST_P(ScoreMods, BiasMasksEverything) {
  Context ctx;
  ScoreModsCase all;
  all.bias = BiasLayout::keys;
  all.masked_row_period = 1;  // row r is masked when r % 1 == 0: every row
  testing::expect_all_pass(ctx, {with(make(DType::f16, 1, 2, 1, 17, 40, 32, none), all),
                                 with(make(DType::f32, 1, 1, 1, 9, 13, 3, bottom_right), all)});
}

// No path reads keys outside every row's window: with keys [0, 832) of K and V set to NaN
// (bottom_right, window 40 back: row 0 of 64 over 1000 keys starts at key 896), any such key read
// would turn outputs NaN (P = 0 times V = NaN). Then again with a key length on the device (1000 of
// 1064 rows, the last 64 NaN too): the window's start then depends on the length, which the cublas
// path's GEMMs cannot know on the host, so its sums are bounded on the device.
TEST_P(ScoreMods, KeysOutsideTheWindowAreNeverRead) {
  Context ctx;
  for (const bool with_key_length : {false, true})
  for (const auto& [dtype, head_dim] : {std::pair<DType, int>{DType::f16, 64}, {DType::f32, 8}}) {
    const int seq_q = 64, seq_k = 1000, poisoned = 832;
    const int key_rows = with_key_length ? seq_k + 64 : seq_k;  // rows from seq_k on are past the length
    const std::string label = std::string(to_string(dtype)) + (with_key_length ? " with a key length" : "");
    std::mt19937_64 rng{uint64_t(head_dim)};
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<double> q(size_t(seq_q) * head_dim), k(size_t(seq_k) * head_dim), v(k.size());
    for (auto* t : {&q, &k, &v})
      for (double& x : *t) x = testing::round_to(dtype, normal(rng));
    auto upload = [&](const std::vector<double>& values, int rows, bool poison) {
      std::vector<unsigned char> bytes(size_t(rows) * head_dim * dtype_size(dtype));
      for (size_t i = 0; i < size_t(rows) * head_dim; ++i) {
        const int row = int(i / head_dim);
        const bool nan = poison && (row < poisoned || row >= seq_k);  // values has seq_k rows
        testing::store_element(bytes.data(), dtype, i, nan ? std::numeric_limits<float>::quiet_NaN() : float(values[i]));
      }
      DeviceBuffer<unsigned char> buffer(ctx, bytes.size(), "test tensor");
      buffer.copy_from_host(bytes);
      return std::make_pair(std::move(buffer), TensorView::bhsd(nullptr, dtype, 1, 1, rows, head_dim));
    };
    auto [q_buf, q_view] = upload(q, seq_q, false);
    auto [k_buf, k_view] = upload(k, key_rows, true);
    auto [v_buf, v_view] = upload(v, key_rows, true);
    auto [out_buf, out_view] = upload(q, seq_q, false);
    q_view.data = q_buf.data();
    k_view.data = k_buf.data();
    v_view.data = v_buf.data();
    out_view.data = out_buf.data();
    AttentionOptions options;
    options.path = path();
    options.causal = bottom_right;
    options.window_left = 40;
    options.window_right = 0;
    DeviceBuffer<int32_t> key_length(ctx, 1, "test key_lengths");
    key_length.copy_from_host(&seq_k, 1);
    if (with_key_length) options.key_lengths = key_length.data();
    attention(ctx, q_view, k_view, v_view, out_view, options);
    ctx.synchronize();

    reference::Problem problem;
    problem.seq_q = seq_q;
    problem.seq_k = seq_k;
    problem.head_dim = head_dim;
    problem.causal = bottom_right;
    problem.window_left = 40;
    problem.window_right = 0;
    testing::AttentionArithmetic arithmetic;
    arithmetic.dtype = dtype;
    arithmetic.p_rounded = testing::rounds_probabilities(ctx, path(), q_view, k_view, v_view, out_view, options);
    const testing::AttentionExpected expected = testing::expected_attention(problem, q, k, v, arithmetic);
    const std::vector<unsigned char> got = out_buf.to_host();
    std::vector<double> values(expected.out.size());
    for (size_t i = 0; i < values.size(); ++i) {
      values[i] = testing::load_element(got.data(), dtype, i);
      ASSERT_FALSE(std::isnan(values[i])) << label << ": out[" << i << "] is NaN: a key outside the window was read";
    }
    EXPECT_TRUE(testing::judge("out", values, expected.out)) << label;
  }
}

// The backward likewise: keys before every row's window hold NaN in K and V, and the gradients
// must be those of the same call with them finite (equal on the sim: the same arithmetic), all
// finite, with dk and dv exactly 0 on those keys (no row sees them). Then again with the key length
// on the device (where the window's start is known only there).
TEST_P(ScoreMods, BackwardNeverReadsKeysOutsideTheWindow) {
  Context ctx;
  // The dtypes and head dims every path's backward takes (the fused one runs on tensor cores).
  for (const bool with_key_length : {false, true})
  for (const auto& [dtype, head_dim] : {std::pair<DType, int>{DType::f16, 64}, {DType::bf16, 32}}) {
    const int seq_q = 64, seq_k = 300, poisoned = 180;  // rows see keys from 300 - 64 - 40 = 196 on
    std::mt19937_64 rng{uint64_t(head_dim) + 7};
    std::normal_distribution<float> normal(0.0f, 1.0f);
    auto random_rows = [&](int rows) {
      std::vector<float> values(size_t(rows) * head_dim);
      for (float& x : values) x = testing::round_to(dtype, normal(rng));
      return values;
    };
    const std::vector<float> q = random_rows(seq_q), k = random_rows(seq_k), v = random_rows(seq_k),
                             dout = random_rows(seq_q);
    std::vector<DeviceBuffer<unsigned char>> buffers;
    auto upload = [&](const std::vector<float>& values, int rows, bool poison) {
      std::vector<unsigned char> bytes(values.size() * dtype_size(dtype));
      for (size_t i = 0; i < values.size(); ++i) {
        const bool nan = poison && int(i / head_dim) < poisoned;
        testing::store_element(bytes.data(), dtype, i, nan ? std::numeric_limits<float>::quiet_NaN() : values[i]);
      }
      buffers.emplace_back(ctx, bytes.size(), "test tensor");
      buffers.back().copy_from_host(bytes);
      return TensorView::bhsd(buffers.back().data(), dtype, 1, 1, rows, head_dim);
    };
    const TensorView q_view = upload(q, seq_q, false), dout_view = upload(dout, seq_q, false);
    const TensorView out_view = upload(q, seq_q, false);
    DeviceBuffer<unsigned char> dq_buf(ctx, q.size() * dtype_size(dtype), "test dq"),
        dk_buf(ctx, k.size() * dtype_size(dtype), "test dk"), dv_buf(ctx, v.size() * dtype_size(dtype), "test dv");
    const TensorView dq = TensorView::bhsd(dq_buf.data(), dtype, 1, 1, seq_q, head_dim);
    const TensorView dk = TensorView::bhsd(dk_buf.data(), dtype, 1, 1, seq_k, head_dim);
    const TensorView dv = TensorView::bhsd(dv_buf.data(), dtype, 1, 1, seq_k, head_dim);
    DeviceBuffer<float> lse(ctx, seq_q, "test lse");
    DeviceBuffer<int32_t> key_length(ctx, 1, "test key_lengths");
    key_length.copy_from_host(&seq_k, 1);
    AttentionOptions options;
    if (with_key_length) options.key_lengths = key_length.data();
    options.path = path();
    options.causal = bottom_right;
    options.window_left = 40;
    options.window_right = 0;
    // out and the LSE of the finite inputs, then the gradients of each input set.
    const TensorView k_finite = upload(k, seq_k, false), v_finite = upload(v, seq_k, false);
    options.lse = lse.data();
    attention(ctx, q_view, k_finite, v_finite, out_view, options);
    options.lse = nullptr;
    auto gradients = [&](const TensorView& k_view, const TensorView& v_view) {
      std::vector<std::vector<float>> result;
      for (auto* g : {&dq_buf, &dk_buf, &dv_buf}) g->fill_bytes(0xff);  // NaN: an element not written fails
      attention_backward(ctx, q_view, k_view, v_view, out_view, dout_view, lse.data(), dq, dk, dv, options);
      ctx.synchronize();
      for (auto* g : {&dq_buf, &dk_buf, &dv_buf}) {
        const std::vector<unsigned char> bytes = g->to_host();
        std::vector<float> values(bytes.size() / dtype_size(dtype));
        for (size_t i = 0; i < values.size(); ++i) values[i] = testing::load_element(bytes.data(), dtype, i);
        result.push_back(std::move(values));
      }
      return result;
    };
    const auto want = gradients(k_finite, v_finite);
    const auto got = gradients(upload(k, seq_k, true), upload(v, seq_k, true));
    const char* names[] = {"dq", "dk", "dv"};
    for (int g = 0; g < 3; ++g)
      for (size_t i = 0; i < got[g].size(); ++i) {
        const bool unseen = g > 0 && int(i / head_dim) < poisoned;
        ASSERT_TRUE(std::isfinite(got[g][i]) && (unseen ? got[g][i] == 0.0f : got[g][i] == want[g][i]))
            << to_string(dtype) << (with_key_length ? " with a key length" : "") << ": " << names[g] << "[" << i << "] is " << got[g][i] << " with NaN keys outside the "
            << "window, " << want[g][i] << " with them finite" << (unseen ? " (a key no row sees: expected 0)" : "");
      }
  }
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

// Batch 1 of the bias starts 2^31 elements after batch 0: bias offsets need 64 bits.
TEST_P(ScoreMods, BiasOffsetsPast32Bits) {
  Context ctx;
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

// ---- arguments the options must reject: InvalidArgument naming the option, out untouched.
class ScoreModsArguments : public ::testing::Test {
 protected:
  Context ctx;
  DeviceBuffer<float> q{ctx, 2 * 3 * 4, "q"}, k{ctx, 2 * 5 * 4, "k"}, v{ctx, 2 * 5 * 4, "v"}, out{ctx, 2 * 3 * 4, "out"};
  DeviceBuffer<float> slopes{ctx, 4, "slopes"}, bias{ctx, 2 * 2 * 3 * 5, "bias"};
  TensorView qv = TensorView::bhsd(q.data(), DType::f32, 1, 2, 3, 4);
  TensorView kv = TensorView::bhsd(k.data(), DType::f32, 1, 2, 5, 4);
  TensorView vv = TensorView::bhsd(v.data(), DType::f32, 1, 2, 5, 4);
  TensorView ov = TensorView::bhsd(out.data(), DType::f32, 1, 2, 3, 4);

  ScoreModsArguments() {
    out.fill_bytes(0x5A);
    q.fill_bytes(0);
    k.fill_bytes(0);
    v.fill_bytes(0);
    slopes.fill_bytes(0);
    bias.fill_bytes(0);
  }
  TensorView full_bias() const {
    TensorView b = TensorView::bhsd(bias.data(), DType::f32, 1, 2, 3, 5);
    return b;
  }
  // The call throws InvalidArgument whose message names `what`, and out keeps its bytes.
  void expect_rejected(const AttentionOptions& options, const std::string& what) {
    try {
      attention(ctx, qv, kv, vv, ov, options);
      ADD_FAILURE() << "expected InvalidArgument naming " << what;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
    for (float x : out.to_host()) {
      uint32_t bits;
      std::memcpy(&bits, &x, 4);
      ASSERT_EQ(bits, 0x5A5A5A5Au) << "out was written";
    }
  }
};

TEST_F(ScoreModsArguments, Window) {
  AttentionOptions o;
  o.window_left = -2;
  expect_rejected(o, "options.window_left");
  o = {};
  o.window_right = -7;
  expect_rejected(o, "options.window_right");
}

TEST_F(ScoreModsArguments, Softcap) {
  AttentionOptions o;
  for (float bad : {0.0f, -1.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    o.softcap = bad;
    expect_rejected(o, "options.softcap");
  }
}

TEST_F(ScoreModsArguments, AlibiSlopes) {
  AttentionOptions o;
  o.alibi_slopes = slopes.data();
  o.alibi_slopes_count = 3;  // heads is 2, batch * heads is 2
  expect_rejected(o, "options.alibi_slopes_count");
  o.alibi_slopes = nullptr;
  o.alibi_slopes_count = 2;
  expect_rejected(o, "options.alibi_slopes");
  o.alibi_slopes = reinterpret_cast<const float*>(reinterpret_cast<const char*>(slopes.data()) + 1);
  expect_rejected(o, "options.alibi_slopes");
  o.alibi_slopes = out.data();  // read while out is written
  expect_rejected(o, "options.alibi_slopes");
}

TEST_F(ScoreModsArguments, Bias) {
  AttentionOptions o;
  TensorView b = full_bias();
  b.shape[3] = 4;  // neither seq_k 5 nor 1
  o.bias = b;
  expect_rejected(o, "options.bias.shape[3]");
  b = full_bias();
  b.shape[1] = 3;
  o.bias = b;
  expect_rejected(o, "options.bias.shape[1]");
  b = full_bias();
  b.dtype = DType::f16;  // q is f32: only f32 is accepted
  o.bias = b;
  expect_rejected(o, "options.bias.dtype");
  b = full_bias();
  b.strides[2] = -5;
  o.bias = b;
  expect_rejected(o, "options.bias.strides[2]");
  b = full_bias();
  b.data = nullptr;
  o.bias = b;
  expect_rejected(o, "options.bias.data");
  b = full_bias();
  b.data = out.data();  // one broadcast element, read while out's first element is written
  b.shape = {1, 1, 1, 1};
  o.bias = b;
  expect_rejected(o, "options.bias expected not to overlap out");
  // A bias that broadcasts through stride 0 over a full shape is fine (and valid stride 0 on seq_k).
  b = full_bias();
  b.strides = {0, 0, 0, 0};
  o.bias = b;
  EXPECT_NO_THROW(attention(ctx, qv, kv, vv, ov, o));
}

}  // namespace
}  // namespace selfattn
