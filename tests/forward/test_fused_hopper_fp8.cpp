// The Hopper FP8 forward (kernels/hopper/flash_fwd_hopper_fp8.cuh with its V^T pre-pass,
// transpose_v_fp8.cuh) on the sim, which reports compute capability 9.0: which calls it takes
// (detail::fused_takes_fp8), that attention() hands it those and dequantizes the rest, and what it
// computes around its tiles (128 query rows, 128-key tiles at d128 and 64-key ones at d256, 64-key
// pre-pass blocks, 16-key permutation groups), under every causal mode, GQA, key lengths whose
// padding rows of K and V hold NaN, the LSE, descales per (batch, kv head), and the masks and
// modifiers, which act on the descaled scores.
//
// Each case runs through attention() with the shared harness (support/attention_harness.h: fresh
// e4m3 inputs and descales, poisoned outputs) and is judged by the shared rule, whose allowed
// computation rounds each unnormalised probability to e4m3 as the kernel does (tests/README.md,
// AttentionArithmetic::p_fp8); the launch log shows the pre-pass and the FP8 kernel ran, nothing
// else. (On a GPU the FP8 wgmma is known to accumulate with fewer bits than fp32; this program is
// sim only, where the sim's wgmma rounds as fp32.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "attention_harness.h"
#include "forward/paths.h"
#include "runtime/device.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

constexpr Causal none = Causal::none, top_left = Causal::top_left, bottom_right = Causal::bottom_right;

Context sim_context(bool hopper = true) {
  ContextOptions options;
  options.backend = Backend::sim;
  options.hopper_kernels = hopper;
  return Context(options);
}

struct Fp8Case {
  int batch, heads, kv_heads, seq_q, seq_k;
  Causal causal;
  DType out_dtype;
  bool lse;
  std::vector<int32_t> key_lengths;  // empty or [batch]
  int head_dim = 128;
  // Masks and modifiers the kernel shares with the 16-bit ones (flash_fwd_softmax.cuh).
  int window_left = -1, window_right = -1;
  float softcap = 0;
  bool sinks = false;
  bool alibi = false;             // slopes [heads]
  std::vector<int32_t> q_offset;  // empty or [batch]
};

// Runs the case through attention() on the fused path of a sim context with the Hopper kernels and
// judges it (every tensor in one BHSD layout with a 16-byte row gap: rows on 16 bytes, as the
// kernel takes them; the gaps hold NaN and must stay unwritten).
bool check_fp8(const Fp8Case& f) {
  testing::AttentionCase c = testing::make_case(f.out_dtype, f.batch, f.heads, f.kv_heads, f.seq_q, f.seq_k, f.head_dim,
                                                f.causal, testing::Layout::bhsd, f.lse, f.key_lengths, Path::fused);
  c.fp8 = DType::e4m3;
  c.strides = testing::Strides::shared;
  c.row_gap = 16;
  c.q_offset = f.q_offset;
  c.mods.window_left = f.window_left;
  c.mods.window_right = f.window_right;
  if (f.softcap > 0) c.mods.softcap = f.softcap;
  c.mods.sinks = f.sinks;
  c.mods.alibi = f.alibi ? testing::AlibiSlopes::heads : testing::AlibiSlopes::none;
  Context ctx = sim_context();
  detail::sim_launch_log().clear();
  const ::testing::AssertionResult verdict = testing::check_attention(ctx, c);
  EXPECT_TRUE(verdict) << c.name();
  const std::vector<std::string> log = detail::sim_launch_log();
  EXPECT_EQ(log, (std::vector<std::string>{"transpose_v_fp8_kernel", "flash_fwd_hopper_fp8_kernel"})) << c.name();
  return bool(verdict);
}

// Which calls the FP8 kernel takes: e4m3 at head_dim 128 with f16/bf16 out on a 9.0 device that
// allows the Hopper kernels; not varlen, key_start or dropout calls, nor e5m2 or other head dims.
TEST(FusedHopperFp8, TakesTheCallsItRunsAndOnlyThose) {
  Context hopper = sim_context(true), off = sim_context(false);
  std::vector<uint8_t> host(64 * 1024, 0);
  DeviceBuffer<uint8_t> buffer(hopper, host.size(), "buffer");
  detail::AttentionCall call;
  call.q = TensorView::bhsd(buffer.data(), DType::e4m3, 1, 1, 7, 128);
  call.k = call.v = TensorView::bhsd(buffer.data(), DType::e4m3, 1, 1, 9, 128);
  call.out = TensorView::bhsd(buffer.data(), DType::bf16, 1, 1, 7, 128);
  call.dtype = DType::e4m3;
  call.batch = call.heads = call.kv_heads = 1;
  call.seq_q = 7;
  call.seq_k = 9;
  call.head_dim_qk = call.head_dim_v = 128;
  EXPECT_TRUE(detail::fused_takes_fp8(hopper.state(), call));
  EXPECT_EQ(detail::fused_unsupported(hopper.state(), call), nullptr);
  EXPECT_FALSE(detail::fused_takes_fp8(off.state(), call));
  EXPECT_NE(detail::fused_unsupported(off.state(), call), nullptr);
  // The V^T buffer: [batch, kv_heads, head_dim, keys padded to 64].
  EXPECT_GE(detail::fused_workspace_bytes(call), size_t(128) * 64);
  auto refused = [&](auto change) {
    detail::AttentionCall other = call;
    change(other);
    return !detail::fused_takes_fp8(hopper.state(), other) &&
           detail::fused_unsupported(hopper.state(), other) != nullptr;
  };
  const int32_t zero = 0;
  EXPECT_TRUE(refused([](detail::AttentionCall& x) { x.dtype = x.q.dtype = x.k.dtype = x.v.dtype = DType::e5m2; }));
  EXPECT_TRUE(refused([](detail::AttentionCall& x) { x.out.dtype = DType::f32; }));
  EXPECT_TRUE(refused([](detail::AttentionCall& x) { x.head_dim_qk = x.head_dim_v = 64; }));
  EXPECT_TRUE(refused([](detail::AttentionCall& x) { x.head_dim_v = 64; }));  // keyed by both head dims
  detail::AttentionCall d256 = call;
  d256.head_dim_qk = d256.head_dim_v = 256;
  d256.q.shape[3] = d256.k.shape[3] = d256.v.shape[3] = d256.out.shape[3] = 256;
  EXPECT_TRUE(detail::fused_takes_fp8(hopper.state(), d256));
  EXPECT_TRUE(refused([&](detail::AttentionCall& x) { x.key_start = &zero; }));
  EXPECT_TRUE(refused([](detail::AttentionCall& x) { x.dropout_p = 0.1f; }));
  EXPECT_TRUE(refused([&](detail::AttentionCall& x) { x.cu_seqlens_q = x.cu_seqlens_k = &zero; }));
  EXPECT_TRUE(refused([](detail::AttentionCall& x) { x.v.strides[2] = 137; }));  // rows off 16 bytes
  // Not FP8: not this function's business.
  detail::AttentionCall bf16 = call;
  bf16.dtype = bf16.q.dtype = bf16.k.dtype = bf16.v.dtype = DType::bf16;
  EXPECT_FALSE(detail::fused_takes_fp8(hopper.state(), bf16));
}

// attention() hands the FP8 calls the kernel takes to it as they are (automatic and fused; the
// workspace fused_workspace_bytes gives) and dequantizes the others (attention.cpp,
// fp8_inputs.cpp): the launch log says which ran. Both give the same output to e4m3 P's rounding
// (test_fp8_forward judges each against the reference).
std::vector<std::string> kernels_of_call(bool hopper, Path path, int head_dim, std::vector<float>* out_values) {
  Context ctx = sim_context(hopper);
  const int batch = 2, heads = 2, kv_heads = 1, seq_q = 70, seq_k = 150;
  std::vector<uint8_t> q(size_t(batch) * heads * seq_q * head_dim), kv(size_t(batch) * kv_heads * seq_k * head_dim);
  for (size_t i = 0; i < q.size(); ++i) q[i] = uint8_t(0x30 + (i * 7) % 16) | uint8_t(i % 3 == 0 ? 0x80 : 0);
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = uint8_t(0x28 + (i * 5) % 24) | uint8_t(i % 4 == 1 ? 0x80 : 0);
  DeviceBuffer<uint8_t> dq(ctx, q.size(), "q"), dk(ctx, kv.size(), "k"), dv(ctx, kv.size(), "v");
  dq.copy_from_host(q);
  dk.copy_from_host(kv);
  dv.copy_from_host(kv);
  DeviceBuffer<float> descales(ctx, 6, "descales");
  descales.copy_from_host(std::vector<float>{0.375f, 1.25f, 0.5f, 2.0f, 0.75f, 1.5f});
  DeviceBuffer<uint16_t> out(ctx, size_t(batch) * heads * seq_q * head_dim, "out");
  out.fill_bytes(0xff);
  AttentionOptions options;
  options.path = path;
  options.causal = bottom_right;
  options.q_descale = descales.data();
  options.k_descale = descales.data() + 2;
  options.v_descale = descales.data() + 4;
  detail::sim_launch_log().clear();
  attention(ctx, TensorView::bhsd(dq.data(), DType::e4m3, batch, heads, seq_q, head_dim),
            TensorView::bhsd(dk.data(), DType::e4m3, batch, kv_heads, seq_k, head_dim),
            TensorView::bhsd(dv.data(), DType::e4m3, batch, kv_heads, seq_k, head_dim),
            TensorView::bhsd(out.data(), DType::bf16, batch, heads, seq_q, head_dim), options);
  ctx.synchronize();
  const std::vector<uint16_t> bits = out.to_host();
  out_values->clear();
  for (size_t i = 0; i < bits.size(); ++i) out_values->push_back(testing::load_element(bits.data(), DType::bf16, i));
  return detail::sim_launch_log();
}

TEST(FusedHopperFp8, AttentionHandsItTheCallsItTakes) {
  const std::vector<std::string> native = {"transpose_v_fp8_kernel", "flash_fwd_hopper_fp8_kernel"};
  for (int head_dim : {128, 256}) {
    std::vector<float> fp8, dequantized;
    EXPECT_EQ(kernels_of_call(true, Path::automatic, head_dim, &fp8), native) << head_dim;
    EXPECT_EQ(kernels_of_call(true, Path::fused, head_dim, &fp8), native) << head_dim;
    // Without the Hopper kernels, or on another path: dequantized first, never the FP8 kernel.
    for (const auto& [hopper, path] : {std::pair{false, Path::fused}, std::pair{true, Path::naive}}) {
      const std::vector<std::string> log = kernels_of_call(hopper, path, head_dim, &dequantized);
      EXPECT_EQ(std::count(log.begin(), log.end(), "flash_fwd_hopper_fp8_kernel"), 0) << head_dim;
      EXPECT_EQ(std::count(log.begin(), log.end(), "transpose_v_fp8_kernel"), 0) << head_dim;
      ASSERT_EQ(fp8.size(), dequantized.size());
      int bad = 0;
      // A coarse agreement (e4m3 P moves an output by up to 2^-4 of sum P|v|): routing is what this
      // test is about; the values are judged by the other tests here and by test_fp8_forward.
      for (size_t i = 0; i < fp8.size() && bad < 5; ++i)
        if (!(std::fabs(fp8[i] - dequantized[i]) <= 0.1 * std::fabs(dequantized[i]) + 0.05))
          ADD_FAILURE() << "d" << head_dim << " out[" << i << "] FP8 kernel " << fp8[i] << ", dequantized "
                        << dequantized[i] << " (bad " << ++bad << ")";
    }
  }
}

// Sizes around the tiles: 1 and 7 rows, 113, a block of 128 rows and more; keys 1, 7, 16 + 1
// (a permutation group and one), 128 (one tile), 300 (a partial third tile, and a pre-pass block
// boundary inside a tile), 1000 (8 tiles: four rounds of the two-stage ring).
TEST(FusedHopperFp8, SizesAroundTheTiles) {
  const DType bf16 = DType::bf16, f16 = DType::f16;
  EXPECT_TRUE(check_fp8({1, 1, 1, 1, 1, none, bf16, true, {}}));
  EXPECT_TRUE(check_fp8({1, 2, 1, 7, 17, none, f16, true, {}}));
  EXPECT_TRUE(check_fp8({1, 1, 1, 113, 128, top_left, bf16, true, {}}));
  EXPECT_TRUE(check_fp8({2, 1, 1, 128, 300, bottom_right, f16, true, {}}));
  EXPECT_TRUE(check_fp8({1, 1, 1, 129, 7, none, bf16, false, {}}));
  EXPECT_TRUE(check_fp8({1, 1, 1, 300, 1000, bottom_right, bf16, true, {}}));
  EXPECT_TRUE(check_fp8({1, 1, 1, 65, 1000, top_left, f16, true, {}}));
}

// GQA with descales per (batch, kv head), key lengths whose K and V rows past the length are NaN
// (the pre-pass must not read them; P V must add zeros there), a batch with no keys, every mask.
TEST(FusedHopperFp8, GqaKeyLengthsWithNaNPaddingAndDescales) {
  const DType bf16 = DType::bf16, f16 = DType::f16;
  EXPECT_TRUE(check_fp8({3, 4, 2, 33, 300, none, bf16, true, {300, 0, 129}}));
  EXPECT_TRUE(check_fp8({2, 2, 1, 200, 256, bottom_right, f16, true, {1, 255}}));
  EXPECT_TRUE(check_fp8({2, 3, 3, 64, 130, top_left, bf16, true, {65, 17}}));
  EXPECT_TRUE(check_fp8({2, 4, 1, 128, 128, none, f16, true, {127, 128}}));
}

// Head dim 256: 64-key tiles (V^T in 64-byte swizzled rows, P in 2 k32 steps), two 128-byte
// column blocks per Q and K row.
TEST(FusedHopperFp8, HeadDim256) {
  auto d256 = [](Fp8Case c) {
    c.head_dim = 256;
    return c;
  };
  EXPECT_TRUE(check_fp8(d256({1, 1, 1, 7, 9, none, DType::bf16, true, {}})));
  EXPECT_TRUE(check_fp8(d256({2, 2, 1, 129, 300, bottom_right, DType::f16, true, {300, 65}})));
  EXPECT_TRUE(check_fp8(d256({1, 2, 2, 65, 130, top_left, DType::bf16, false, {}})));
}

// Sliding windows (tiles skipped before a window, masked inside), softcap, sinks and ALiBi act on
// the descaled scores; q_offset places the rows.
TEST(FusedHopperFp8, WindowSoftcapSinksAlibiAndQOffsetOnTheTrueScores) {
  Fp8Case windowed{2, 2, 1, 150, 700, bottom_right, DType::bf16, true, {700, 401}};
  windowed.window_left = 200;
  windowed.window_right = 30;
  EXPECT_TRUE(check_fp8(windowed));
  Fp8Case capped{1, 2, 2, 70, 300, none, DType::f16, true, {}};
  capped.softcap = 5.0f;
  capped.sinks = true;
  EXPECT_TRUE(check_fp8(capped));
  Fp8Case sinks_without_keys{2, 2, 1, 9, 140, top_left, DType::bf16, true, {0, 140}};
  sinks_without_keys.sinks = true;
  EXPECT_TRUE(check_fp8(sinks_without_keys));
  // ALiBi's distances and q_offset's placement of the rows (a chunk of a longer sequence).
  Fp8Case offset_alibi{2, 2, 1, 60, 400, bottom_right, DType::f16, true, {400, 333}};
  offset_alibi.alibi = true;
  offset_alibi.q_offset = {130, 0};
  EXPECT_TRUE(check_fp8(offset_alibi));
  offset_alibi.head_dim = 256;
  offset_alibi.window_left = 90;
  EXPECT_TRUE(check_fp8(offset_alibi));
}

}  // namespace
}  // namespace selfattn
