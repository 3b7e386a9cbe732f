// FP8 inputs to attention() and attention_varlen() (AttentionOptions::q_descale) on every path, on
// the sim: q, k and v stored in e4m3 or e5m2 with descales per (batch, kv head) that differ along
// batch, kv head and input (support/attention_harness.h: fp8_descale), out in f16, bf16 or f32. Each
// case against the double reference fed the real values (stored x descale), judged by the shared
// rule: the paths run on copies dequantized into out's dtype, exact there (the descales have few
// significant bits), so a descale read for the wrong batch, head or input, or one not applied,
// fails by a whole factor. Then the argument checks, nothing written on a throw, and the backward
// refusing FP8 inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "attention_harness.h"
#include "score_mods_fixture.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

class Fp8Forward : public ScoreMods {
 protected:
  AttentionCase fp8(DType format, DType out, int batch, int heads, int kv_heads, int seq_q, int seq_k, int head_dim,
                    Causal causal, std::vector<int32_t> key_lengths = {}, Layout layout = Layout::bhsd) const {
    AttentionCase c = make(out, batch, heads, kv_heads, seq_q, seq_k, head_dim, causal, std::move(key_lengths), layout);
    c.fp8 = format;
    return c;
  }
};

// Odd and round sizes, both formats, each out dtype, GQA and MQA, each causal alignment, key
// lengths with 0 (the keys past them are NaN in FP8), both layouts.
TEST_P(Fp8Forward, Shapes) {
  Context ctx;
  testing::expect_all_pass(ctx, {
      fp8(DType::e4m3, DType::bf16, 2, 4, 2, 113, 203, 64, bottom_right, {203, 77}),
      fp8(DType::e4m3, DType::f16, 1, 2, 1, 64, 128, 128, none, {}, Layout::bshd),
      fp8(DType::e5m2, DType::bf16, 3, 2, 2, 7, 64, 128, top_left, {0, 64, 5}),
      fp8(DType::e5m2, DType::f16, 1, 1, 1, 1, 7, 7, none),
      fp8(DType::e4m3, DType::f32, 2, 3, 1, 37, 113, 32, bottom_right, {}, Layout::bshd),
      fp8(DType::e4m3, DType::bf16, 1, 8, 1, 1, 257, 256, none),
      fp8(DType::e5m2, DType::f32, 1, 1, 1, 113, 1, 1, top_left),
  });
}

// Beside every modifier, a bias in out's dtype, and sinks.
TEST_P(Fp8Forward, Modifiers) {
  Context ctx;
  ScoreModsCase bias_in_out_dtype = every_modifier();
  bias_in_out_dtype.bias_in_input_dtype = true;
  ScoreModsCase sinks;
  sinks.sinks = true;
  testing::expect_all_pass(ctx, {
      with(fp8(DType::e4m3, DType::bf16, 2, 2, 1, 64, 113, 64, bottom_right), bias_in_out_dtype),
      with(fp8(DType::e5m2, DType::f16, 1, 3, 3, 7, 64, 32, none), sinks),
  });
}

// Packed sequences: each sequence its own descales (one row per sequence), rows no sequence owns
// NaN in the inputs and unwritten in out.
TEST_P(Fp8Forward, Varlen) {
  Context ctx;
  for (DType format : {DType::e4m3, DType::e5m2}) {
    VarlenCase c = make_varlen(format == DType::e4m3 ? DType::bf16 : DType::f16, 4, 2, 64);
    c.fp8 = format;
    c.unowned_q_rows = 3;
    c.unowned_k_rows = 5;
    EXPECT_TRUE(testing::check_attention_varlen(ctx, c)) << c.name();
  }
}

// The Hopper FP8 kernel (the sim is a 9.0 device): e4m3 at head_dim 128 and 256 with f16/bf16 out
// and every row on 16 bytes (shared strides: FP8 rows with the distinct layouts' gaps are off 16
// bytes and dequantized). The judge's allowed computation rounds P to e4m3 there
// (set_probability_rounding); around the 128-row and 128- or 64-key tiles, GQA, each causal
// alignment, key lengths with NaN past them.
TEST(Fp8ForwardHopper, AroundTheTiles) {
  Context ctx;
  const auto native = [](DType out, int batch, int heads, int kv_heads, int seq_q, int seq_k, int head_dim,
                         Causal causal, std::vector<int32_t> key_lengths = {}) {
    AttentionCase c = testing::make_case(out, batch, heads, kv_heads, seq_q, seq_k, head_dim, causal, Layout::bhsd,
                                         true, std::move(key_lengths), Path::fused);
    c.fp8 = DType::e4m3;
    c.strides = testing::Strides::shared;
    return c;
  };
  testing::expect_all_pass(ctx, {
                                    native(DType::f16, 1, 2, 1, 64, 128, 128, none),
                                    native(DType::bf16, 2, 4, 2, 113, 300, 128, bottom_right, {300, 77}),
                                    native(DType::bf16, 1, 8, 1, 1, 257, 256, none),
                                    native(DType::f16, 2, 2, 1, 130, 700, 256, top_left, {700, 200}),
                                    native(DType::bf16, 1, 1, 1, 300, 1000, 128, bottom_right),
                                });
  // (That attention() hands exactly these calls to the kernel, by the launch log:
  // FusedHopperFp8.AttentionHandsItTheCallsItTakes.)
}

// (automatic picks fused here: Fp8ForwardCalls.ResolvePath checks that, not another run of it.)
INSTANTIATE_TEST_SUITE_P(Paths, Fp8Forward, ::testing::Values(Path::naive, Path::cublas, Path::fused),
                         [](const auto& info) { return std::string(to_string(info.param)); });

// ---- What no path sees: descales left null, the argument checks, the backward.

struct Fp8Call {
  Context ctx;
  static constexpr int kBatch = 2, kHeads = 2, kSeq = 7;
  int dim;
  DeviceBuffer<uint8_t> q, k, v;
  DeviceBuffer<uint16_t> out;
  DeviceBuffer<float> descales;
  explicit Fp8Call(int head_dim = 32)
      : dim(head_dim),
        q(ctx, size_t(kBatch) * kHeads * kSeq * head_dim, "q"),
        k(ctx, q.size(), "k"),
        v(ctx, q.size(), "v"),
        out(ctx, q.size(), "out"),
        descales(ctx, 3 * kBatch * kHeads, "descales") {
    // Codes 0x30..0x3f (e4m3: 0.5 up to 0.9375) and their negatives, in a pattern that differs by row.
    std::vector<uint8_t> codes(q.size());
    for (size_t i = 0; i < codes.size(); ++i) codes[i] = uint8_t(0x30 + (i * 7) % 16) | uint8_t(i % 3 == 0 ? 0x80 : 0);
    q.copy_from_host(codes);
    k.copy_from_host(codes);
    v.copy_from_host(codes);
    descales.copy_from_host(std::vector<float>(descales.size(), 1.0f));
    out.fill_bytes(0xFF);
  }
  TensorView view(void* data, DType dtype) const { return TensorView::bhsd(data, dtype, kBatch, kHeads, kSeq, dim); }
  TensorView q_view(DType dtype = DType::e4m3) { return view(q.data(), dtype); }
  TensorView k_view(DType dtype = DType::e4m3) { return view(k.data(), dtype); }
  TensorView v_view(DType dtype = DType::e4m3) { return view(v.data(), dtype); }
  TensorView out_view(DType dtype = DType::bf16) { return view(out.data(), dtype); }
  std::vector<uint16_t> out_host() { return out.to_host(); }
};

// Null descales are 1: the same output as descales of 1.0, bit for bit, on every path (at head_dim
// 128 the fused path runs the Hopper FP8 kernel).
TEST(Fp8ForwardCalls, NullDescalesAreOne) {
  for (const auto& [path, head_dim] : {std::pair{Path::naive, 32}, std::pair{Path::cublas, 32},
                                       std::pair{Path::fused, 32}, std::pair{Path::fused, 128}}) {
    Fp8Call call(head_dim);
    AttentionOptions options;
    options.path = path;
    attention(call.ctx, call.q_view(), call.k_view(), call.v_view(), call.out_view(), options);
    const std::vector<uint16_t> without = call.out_host();
    options.q_descale = call.descales.data();
    options.k_descale = call.descales.data() + 4;
    options.v_descale = call.descales.data() + 8;
    call.out.fill_bytes(0xFF);
    attention(call.ctx, call.q_view(), call.k_view(), call.v_view(), call.out_view(), options);
    EXPECT_EQ(without, call.out_host()) << to_string(path) << " d" << head_dim;
  }
}

void expect_throws(const std::function<void()>& run, const std::string& message) {
  try {
    run();
    ADD_FAILURE() << "no throw; expected: " << message;
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(message, e.what());
  }
}

TEST(Fp8ForwardCalls, ArgumentsAreCheckedAndNothingIsWritten) {
  Fp8Call call;
  const std::vector<uint16_t> poison = call.out_host();
  DeviceBuffer<uint16_t> out_e4m3_storage(call.ctx, call.out.size(), "out e4m3");
  expect_throws([&] { attention(call.ctx, call.q_view(), call.k_view(), call.v_view(), call.out_view(DType::e4m3)); },
                "attention: out.dtype expected f32, f16 or bf16, got e4m3 (FP8 is for a KV cache's K and V and for "
                "attention()'s q, k and v)");
  expect_throws([&] { attention(call.ctx, call.q_view(), call.k_view(DType::e5m2), call.v_view(), call.out_view()); },
                "attention: k.dtype expected e4m3 (q.dtype), got e5m2");
  AttentionOptions descaled;
  descaled.q_descale = call.descales.data();
  DeviceBuffer<uint16_t> q16(call.ctx, call.q.size(), "q16"), k16(call.ctx, call.q.size(), "k16"),
      v16(call.ctx, call.q.size(), "v16");
  expect_throws(
      [&] {
        attention(call.ctx, call.view(q16.data(), DType::bf16), call.view(k16.data(), DType::bf16),
                  call.view(v16.data(), DType::bf16), call.out_view(), descaled);
      },
      "attention: options.q_descale expected null (descales scale FP8 inputs; q.dtype is bf16), got a pointer");
  AttentionOptions misaligned;
  misaligned.v_descale = reinterpret_cast<const float*>(reinterpret_cast<const char*>(call.descales.data()) + 2);
  expect_throws([&] { attention(call.ctx, call.q_view(), call.k_view(), call.v_view(), call.out_view(), misaligned); },
                "attention: options.v_descale expected 4-byte alignment, got a misaligned pointer");
  AttentionOptions in_out;
  in_out.k_descale = reinterpret_cast<const float*>(call.out.data());
  try {
    attention(call.ctx, call.q_view(), call.k_view(), call.v_view(), call.out_view(), in_out);
    ADD_FAILURE() << "a descale inside out was taken";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("attention: options.k_descale expected not to overlap out"), std::string::npos)
        << e.what();
  }
  // A bias in "q's dtype" is in out's for FP8 inputs.
  DeviceBuffer<uint8_t> bias(call.ctx, size_t(Fp8Call::kSeq) * Fp8Call::kSeq, "bias");
  AttentionOptions with_bias;
  with_bias.bias = TensorView::bhsd(bias.data(), DType::e4m3, 1, 1, Fp8Call::kSeq, Fp8Call::kSeq);
  expect_throws([&] { attention(call.ctx, call.q_view(), call.k_view(), call.v_view(), call.out_view(), with_bias); },
                "attention: options.bias.dtype expected f32, b8 (a boolean mask) or out.dtype (bf16), got value 4");
  EXPECT_EQ(poison, call.out_host()) << "out was written by a call that threw";
}

TEST(Fp8ForwardCalls, BackwardRefusesFp8Inputs) {
  Fp8Call call;
  DeviceBuffer<uint16_t> dout(call.ctx, call.out.size(), "dout"), dq(call.ctx, call.out.size(), "dq"),
      dk(call.ctx, call.out.size(), "dk"), dv(call.ctx, call.out.size(), "dv");
  DeviceBuffer<float> lse(call.ctx, size_t(Fp8Call::kBatch) * Fp8Call::kHeads * Fp8Call::kSeq, "lse");
  expect_throws(
      [&] {
        attention_backward(call.ctx, call.q_view(), call.k_view(), call.v_view(), call.out_view(),
                           call.view(dout.data(), DType::bf16), lse.data(), call.view(dq.data(), DType::bf16),
                           call.view(dk.data(), DType::bf16), call.view(dv.data(), DType::bf16));
      },
      "attention_backward: q.dtype expected f32, f16 or bf16, got e4m3 (the backward does not take FP8 inputs)");
}

// resolve_path answers for FP8 inputs (as giving bf16 out) with the path the copies run on.
TEST(Fp8ForwardCalls, ResolvePath) {
  Fp8Call call;
  AttentionOptions options;
  options.path = Path::naive;
  EXPECT_EQ(Path::naive, resolve_path(call.ctx, call.q_view(), call.k_view(), call.v_view(), options));
  options.path = Path::automatic;
  EXPECT_EQ(Path::fused, resolve_path(call.ctx, call.q_view(), call.k_view(), call.v_view(), options));
}

}  // namespace
}  // namespace selfattn
