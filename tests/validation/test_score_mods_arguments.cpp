// The arguments the score-modifier options must reject (window, softcap, ALiBi slopes, bias, dropout_p):
// InvalidArgument naming the option, out untouched. The modifiers themselves: test_score_mods.cpp.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <string>

#include "attention_harness.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

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

// dropout_p: a finite rate in [0, 1); 1 (everything dropped: 1 / (1 - p) is inf) and NaN refused.
TEST_F(ScoreModsArguments, DropoutRate) {
  AttentionOptions o;
  for (float bad : {-0.1f, 1.0f, 1.5f, -1e-30f, std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    o.dropout_p = bad;
    expect_rejected(o, "options.dropout_p");
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
