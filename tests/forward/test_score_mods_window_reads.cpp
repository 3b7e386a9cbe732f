// No path, forward or backward, reads keys outside every row's window: those keys hold NaN in K and
// V, on every path, on the sim (score_mods_fixture.h's ScoreMods: one run per path). The other
// score-modifier tests: test_score_mods.cpp, test_score_mods_arguments.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attention_harness.h"
#include "score_mods_fixture.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

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
INSTANTIATE_TEST_SUITE_P(EveryPath, ScoreMods, ::testing::Values(Path::naive, Path::cublas, Path::fused),
                         [](const ::testing::TestParamInfo<Path>& info) { return std::string(to_string(info.param)); });

}  // namespace
}  // namespace selfattn
