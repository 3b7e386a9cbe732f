// The Hopper fused forward (kernels/hopper/flash_fwd_hopper.cuh) on the sim, which reports
// compute capability 9.0: which kernel a call runs, sizes around its tiles (128 query rows per
// block, 128- or 64-key tiles, the head_dim / 64 TMA boxes of a tile), the last key tile whose V
// rows past the keys must be zeroed (key lengths and varlen), MLA's prefill pair (q and k of 192,
// v of 128: three Q/K boxes, two V boxes), and agreement with the mma.sync kernel on the same
// inputs. The shared fused sweeps (test_fused*.cpp) run on this kernel too, and once more with
// SELFATTN_HOPPER_KERNELS=0 on the mma.sync kernel (tests/forward/CMakeLists.txt).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "attention_harness.h"
#include "runtime/device.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

using testing::AttentionCase;
using testing::Layout;
using testing::make_case;

constexpr DType f16 = DType::f16, bf16 = DType::bf16;
constexpr Causal none = Causal::none, top_left = Causal::top_left, bottom_right = Causal::bottom_right;
constexpr Layout bhsd = Layout::bhsd, bshd = Layout::bshd;

Context sim_context(bool hopper) {
  ContextOptions options;
  options.backend = Backend::sim;
  options.hopper_kernels = hopper;
  return Context(options);
}

AttentionCase hopper_case(DType dtype, int batch, int heads, int kv_heads, int seq_q, int seq_k, int head_dim,
                          Causal causal, Layout layout, bool lse, std::vector<int32_t> key_lengths = {}) {
  return make_case(dtype, batch, heads, kv_heads, seq_q, seq_k, head_dim, causal, layout, lse, std::move(key_lengths),
                   Path::fused);
}
// MLA's prefill pair: q and k of 192 columns, v and out of 128.
AttentionCase mla_case(DType dtype, int batch, int heads, int kv_heads, int seq_q, int seq_k, Causal causal,
                       Layout layout, bool lse, std::vector<int32_t> key_lengths = {}) {
  AttentionCase c = hopper_case(dtype, batch, heads, kv_heads, seq_q, seq_k, 192, causal, layout, lse,
                                std::move(key_lengths));
  c.head_dim_v = 128;
  return c;
}

// The kernel the last attention() call launched on this thread's sim.
std::string kernel_of(Context& ctx, const AttentionCase& c) {
  detail::sim_launch_log().clear();
  EXPECT_TRUE(testing::check_attention(ctx, c));
  const std::vector<std::string>& log = detail::sim_launch_log();
  return log.empty() ? "" : log.back();
}

TEST(FusedHopper, RunsWhereItTakesTheCallAndOnlyThere) {
  Context hopper = sim_context(true), mma_sync = sim_context(false);
  for (int head_dim : {64, 128, 256}) {
    EXPECT_EQ(kernel_of(hopper, hopper_case(f16, 1, 1, 1, 7, 9, head_dim, none, bhsd, true)), "flash_fwd_hopper_kernel");
    EXPECT_EQ(kernel_of(mma_sync, hopper_case(bf16, 1, 1, 1, 7, 9, head_dim, none, bhsd, true)), "flash_fwd_kernel");
  }
  EXPECT_EQ(kernel_of(hopper, mla_case(bf16, 1, 1, 1, 7, 9, none, bhsd, true)), "flash_fwd_hopper_kernel");
  EXPECT_EQ(kernel_of(mma_sync, mla_case(f16, 1, 1, 1, 7, 9, none, bhsd, true)), "flash_fwd_kernel");
  // Head dims it does not take, fp32, and rows off 16 bytes stay on the other kernels.
  EXPECT_EQ(kernel_of(hopper, hopper_case(f16, 1, 1, 1, 7, 9, 32, none, bhsd, true)), "flash_fwd_kernel");
  EXPECT_EQ(kernel_of(hopper, hopper_case(f16, 1, 1, 1, 7, 9, 96, none, bhsd, true)), "flash_fwd_kernel");
  EXPECT_NE(kernel_of(hopper, hopper_case(DType::f32, 1, 1, 1, 7, 9, 64, none, bhsd, true)), "flash_fwd_hopper_kernel");
  AttentionCase misaligned = hopper_case(bf16, 1, 1, 1, 7, 9, 64, none, bhsd, true);
  misaligned.misalign = 1;
  EXPECT_NE(kernel_of(hopper, misaligned), "flash_fwd_hopper_kernel");
}

// Sizes around the tiles: 1 and 7 rows, a block of 128 rows and one more, key tiles of 128 (d64,
// d128) and 64 (d256) and a bit, several rounds of the two-stage ring (1000 keys: 8 or 16 tiles).
TEST(FusedHopper, SizesAroundTheTiles) {
  Context ctx = sim_context(true);
  testing::expect_all_pass(
      ctx, {
               hopper_case(f16, 1, 1, 1, 1, 1, 64, none, bhsd, true),
               hopper_case(bf16, 1, 2, 1, 7, 1000, 64, none, bshd, true),
               hopper_case(f16, 1, 1, 1, 129, 128, 64, top_left, bhsd, true),
               hopper_case(bf16, 2, 1, 1, 113, 257, 128, bottom_right, bhsd, true),
               hopper_case(f16, 1, 2, 2, 128, 129, 128, none, bshd, false),
               hopper_case(bf16, 1, 1, 1, 1000, 7, 128, bottom_right, bhsd, true),
               hopper_case(f16, 1, 1, 1, 65, 1000, 256, top_left, bhsd, true),
               hopper_case(bf16, 1, 4, 2, 130, 65, 256, none, bshd, true),
               mla_case(f16, 1, 1, 1, 1, 1, bottom_right, bhsd, true),
               mla_case(bf16, 1, 2, 1, 129, 129, top_left, bshd, true),
               mla_case(f16, 2, 2, 2, 127, 1000, bottom_right, bhsd, false),
               mla_case(bf16, 1, 1, 1, 1000, 128, none, bhsd, true),
           });
}

// GQA groups and key lengths, whose padding rows past the key length are NaN (the harness): the
// last tile's V rows beyond the keys lie inside the tensor and must be zeroed before P V.
TEST(FusedHopper, KeyLengthsWithNaNPaddingAndGqa) {
  Context ctx = sim_context(true);
  testing::expect_all_pass(
      ctx, {
               hopper_case(f16, 3, 4, 2, 33, 300, 64, none, bhsd, true, {300, 0, 129}),
               hopper_case(bf16, 2, 2, 1, 200, 256, 128, bottom_right, bshd, true, {1, 255}),
               hopper_case(f16, 2, 3, 1, 64, 130, 256, top_left, bhsd, true, {65, 64}),
               hopper_case(bf16, 2, 1, 1, 128, 128, 128, none, bhsd, true, {127, 128}),
               mla_case(f16, 3, 4, 2, 70, 300, bottom_right, bshd, true, {1, 0, 257}),
           });
}

TEST(FusedHopper, VarlenPackedSequences) {
  Context ctx = sim_context(true);
  const std::vector<testing::VarlenCase> cases = {
      {f16, 2, 1, 64, {7, 0, 200, 1}, {130, 5, 0, 203}, none, bhsd, true, Path::fused},
      {bf16, 4, 2, 128, {129, 64, 0}, {33, 300, 7}, bottom_right, bshd, true, Path::fused},
      {f16, 2, 2, 256, {17, 140}, {150, 8}, top_left, bhsd, true, Path::fused},
  };
  for (const testing::VarlenCase& c : cases) EXPECT_TRUE(testing::check_attention_varlen(ctx, c)) << c.name();
  testing::VarlenCase mla = {bf16, 4, 1, 192, {5, 0, 130, 1}, {129, 3, 40, 0}, bottom_right, bshd, true, Path::fused};
  mla.head_dim_v = 128;
  mla.unowned_q_rows = 2, mla.unowned_k_rows = 3;
  EXPECT_TRUE(testing::check_attention_varlen(ctx, mla)) << mla.name();
}

struct Outputs {
  std::vector<float> out, lse;
};

Outputs run_fused(bool hopper, DType dtype, int head_dim, Causal causal, int seq_q, int seq_k) {
  Context ctx = sim_context(hopper);
  const int batch = 2, heads = 2, kv_heads = 1;
  std::mt19937_64 rng(testing::input_seed("hopper agreement " + std::to_string(head_dim)));
  auto operand = [&](size_t count) { return testing::random_device_values(ctx, dtype, count, rng, "agreement operand"); };
  DeviceBuffer<unsigned char> q = operand(size_t(batch) * heads * seq_q * head_dim);
  DeviceBuffer<unsigned char> k = operand(size_t(batch) * kv_heads * seq_k * head_dim);
  DeviceBuffer<unsigned char> v = operand(size_t(batch) * kv_heads * seq_k * head_dim);
  DeviceBuffer<unsigned char> out(ctx, size_t(batch) * heads * seq_q * head_dim * dtype_size(dtype), "out");
  DeviceBuffer<float> lse(ctx, size_t(batch) * heads * seq_q, "lse");
  out.fill_bytes(0xff);
  lse.fill_bytes(0xff);
  AttentionOptions options;
  options.path = Path::fused;
  options.causal = causal;
  options.lse = lse.data();
  attention(ctx, TensorView::bhsd(q.data(), dtype, batch, heads, seq_q, head_dim),
            TensorView::bhsd(k.data(), dtype, batch, kv_heads, seq_k, head_dim),
            TensorView::bhsd(v.data(), dtype, batch, kv_heads, seq_k, head_dim),
            TensorView::bhsd(out.data(), dtype, batch, heads, seq_q, head_dim), options);
  ctx.synchronize();
  Outputs result;
  const std::vector<unsigned char> bytes = out.to_host();
  for (size_t i = 0; i < bytes.size() / dtype_size(dtype); ++i) result.out.push_back(testing::load_element(bytes.data(), dtype, i));
  result.lse = lse.to_host();
  return result;
}

// The two kernels compute the same thing in a different order (key tiles of 128 or 64 against 32
// or 64, so other online-softmax rescales and other roundings of P): their outputs agree to the
// dtype's rounding, element by element (2 units in the last place of the larger, plus half a unit of
// the row's largest output), and their LSEs to 1e-5 relative. A layout or fragment bug is off by O(1).
TEST(FusedHopper, AgreesWithTheMmaSyncKernel) {
  for (DType dtype : {f16, bf16}) {
    for (int head_dim : {64, 128, 256}) {
      for (Causal causal : {none, bottom_right}) {
        const Outputs a = run_fused(true, dtype, head_dim, causal, 150, 301);
        const Outputs b = run_fused(false, dtype, head_dim, causal, 150, 301);
        const double ulp = dtype == f16 ? std::ldexp(1.0, -10) : std::ldexp(1.0, -7);
        ASSERT_EQ(a.out.size(), b.out.size());
        int bad = 0;
        for (size_t i = 0; i < a.out.size() && bad < 5; ++i) {
          // P is rounded to the dtype in both, at different running maxima: an output is a sum of
          // such products, so its difference is measured against its row's scale.
          double row_scale = 0;
          for (size_t j = i / head_dim * head_dim; j < (i / head_dim + 1) * head_dim; ++j)
            row_scale = std::max(row_scale, double(std::fabs(b.out[j])));
          const double bound = 2 * ulp * std::max(std::fabs(a.out[i]), std::fabs(b.out[i])) + ulp / 2 * row_scale;
          if (!(std::fabs(double(a.out[i]) - b.out[i]) <= bound)) {
            ++bad;
            ADD_FAILURE() << to_string(dtype) << " d" << head_dim << " " << to_string(causal) << ": out[" << i
                          << "] hopper " << a.out[i] << " mma.sync " << b.out[i];
          }
        }
        for (size_t i = 0; i < a.lse.size(); ++i)
          ASSERT_NEAR(a.lse[i], b.lse[i], 1e-5 * std::max(1.0, double(std::fabs(b.lse[i])))) << "lse[" << i << "]";
      }
    }
  }
}

}  // namespace
}  // namespace selfattn
