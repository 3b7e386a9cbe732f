// The Hopper FP8 forward (kernels/hopper/flash_fwd_hopper_fp8.cuh with its V^T pre-pass,
// transpose_v_fp8.cuh) on the sim, which reports compute capability 9.0: which calls it takes
// (detail::fused_takes_fp8) and what it computes, around its tiles (128 query rows, 128-key tiles
// at head_dim 128 and 64-key ones at 256, 64-key pre-pass blocks, 16-key permutation groups),
// under every causal mode, GQA, key lengths whose padding rows of K and V hold NaN, the LSE, and
// descales per (batch, kv head).
//
// The test drives the fused path itself (detail::run_fused with fused_workspace_bytes of
// workspace, as attention() does once it takes FP8 calls), and checks the launch log: the
// pre-pass and the FP8 kernel ran, nothing else.
//
// Judge: selfattn::reference::attention (double) on the dequantized inputs (stored e4m3 x
// descale), with a bound derived from what the kernel is allowed to round, per output element c of
// a row with probabilities P_j = exp(x_j - m) / l over its visible keys:
//   - P rounded to e4m3 for P V (RN: unit roundoff 2^-4 relative for a normal p, and 2^-10
//     absolute below e4m3's smallest normal 2^-6, where the spacing is 2^-9). The kernel rounds
//     exp(x_j - m_run) <= 1 at the running maximum m_run <= m and later multiplies by
//     exp(m_run - m) <= 1, so in final units |dp_j| <= 2^-4 p_j + 2^-10 with p_j = exp(x_j - m),
//     and l (from the fp32 P, not the rounded one) >= 1: |d out_c| <= 2^-4 sum_j P_j |v_jc| +
//     2^-10 sum_j |v_jc| / l.
//   - the fp32 scores, softmax and P V sums (every product of e4m3 values is exact in fp32): 2^-16
//     relative of sum_j P_j |v_jc| covers a few ulps of scores up to 2^6 in size.
//   - out's own rounding to bf16 / f16: 2^-8 / 2^-11 of |out_c| (plus that of the error above).
// The LSE takes no FP8 rounding (l is summed from the fp32 P): within 2^-16 of |lse| + 1.
// NaN never passes; rows that see no key must be exactly 0 with LSE -inf.
// (On a GPU the FP8 wgmma is known to accumulate with fewer bits than fp32; this program is sim
// only, where the sim's wgmma rounds as fp32.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cuda_fp8.h>

#include "attention_harness.h"
#include "forward/paths.h"
#include "runtime/device.h"
#include "selfattn/reference.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

constexpr Causal none = Causal::none, top_left = Causal::top_left, bottom_right = Causal::bottom_right;
constexpr uint8_t kE4m3NaN = 0x7f;

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
  bool descales = true;              // per (batch, kv head) descales, else null (1)
  int head_dim = 128;
  // Masks and modifiers the kernel shares with the 16-bit ones (flash_fwd_softmax.cuh): they act on
  // the descaled scores.
  int window_left = -1, window_right = -1;
  float softcap = 0;
  bool sinks = false;
  bool alibi = false;              // slopes [heads]
  std::vector<int32_t> q_offset;   // empty or [batch]
  std::string name() const {
    std::string n = "d" + std::to_string(head_dim) + " " + std::to_string(batch) + "x" + std::to_string(heads) +
                    "/" + std::to_string(kv_heads) + " q" + std::to_string(seq_q) + " k" + std::to_string(seq_k) +
                    " " + to_string(causal) + " " + to_string(out_dtype) + (lse ? " lse" : "") +
                    (descales ? " descales" : "");
    for (int32_t len : key_lengths) n += " len" + std::to_string(len);
    if (window_left >= 0 || window_right >= 0)
      n += " window" + std::to_string(window_left) + "," + std::to_string(window_right);
    if (softcap > 0) n += " softcap" + std::to_string(softcap);
    for (int32_t offset : q_offset) n += " q_offset" + std::to_string(offset);
    return n + (sinks ? " sinks" : "") + (alibi ? " alibi" : "");
  }
};

uint8_t to_e4m3(float x) { return uint8_t(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)); }
double from_e4m3(uint8_t bits) {
  __nv_fp8_e4m3 x;
  x.__x = bits;
  return double(float(x));
}

// A [batch, heads, seq, d] e4m3 tensor with its own layout: order (bhsd or bshd) and a row gap of
// `gap` bytes (a multiple of 16) that holds NaN, as every element the call must not read does.
struct Fp8Tensor {
  int batch, heads, seq, d;
  bool bshd;
  int gap;
  std::vector<uint8_t> bytes;
  int64_t row_stride() const { return (bshd ? int64_t(heads) : 1) * (d + gap); }
  int64_t head_stride() const { return bshd ? d + gap : int64_t(seq) * (d + gap); }
  int64_t batch_stride() const { return int64_t(heads) * seq * (d + gap); }
  int64_t at(int b, int h, int s, int c) const {
    return b * batch_stride() + h * head_stride() + s * row_stride() + c;
  }
  Fp8Tensor(int b, int h, int s, int dim, bool order, int g)
      : batch(b), heads(h), seq(s), d(dim), bshd(order), gap(g), bytes(size_t(b) * h * s * (dim + g), kE4m3NaN) {}
  TensorView view(void* data) const {
    TensorView v = bshd ? TensorView::bshd(data, DType::e4m3, batch, heads, seq, d)
                        : TensorView::bhsd(data, DType::e4m3, batch, heads, seq, d);
    v.strides = {batch_stride(), head_stride(), row_stride(), 1};
    return v;
  }
};

struct Outcome {
  bool ran_fp8 = false;
  std::vector<float> out, lse;
};

// Draws e4m3 inputs (N(0, 1) times 4, rounded; rows past a batch's key length stay NaN), runs the
// fused path, and judges it. `plant` lets a caller change the kernel's inputs' description (the
// mutants below). Returns whether every check passed.
bool check_fp8(const Fp8Case& c) {
  SCOPED_TRACE(c.name());
  Context ctx = sim_context();
  const int D = c.head_dim;
  std::mt19937_64 rng(testing::input_seed("fp8 " + c.name()));
  std::normal_distribution<float> normal(0.0f, 4.0f);
  Fp8Tensor q(c.batch, c.heads, c.seq_q, D, false, 16), k(c.batch, c.kv_heads, c.seq_k, D, true, 32),
      v(c.batch, c.kv_heads, c.seq_k, D, false, 48);
  auto key_len = [&](int b) {
    return c.key_lengths.empty() ? c.seq_k : std::max(0, std::min(c.key_lengths[size_t(b)], c.seq_k));
  };
  for (int b = 0; b < c.batch; ++b) {
    for (int h = 0; h < c.heads; ++h)
      for (int s = 0; s < c.seq_q; ++s)
        for (int e = 0; e < D; ++e) q.bytes[size_t(q.at(b, h, s, e))] = to_e4m3(normal(rng));
    for (int g = 0; g < c.kv_heads; ++g)
      for (int s = 0; s < key_len(b); ++s)
        for (int e = 0; e < D; ++e) {
          k.bytes[size_t(k.at(b, g, s, e))] = to_e4m3(normal(rng));
          v.bytes[size_t(v.at(b, g, s, e))] = to_e4m3(normal(rng));
        }
  }
  // Descales with few significant bits, different per (batch, kv head) and per tensor.
  const float kDescales[] = {0.375f, 1.25f, 0.5f, 2.0f, 0.75f, 1.5f, 0.625f};
  std::vector<float> q_descale, k_descale, v_descale;
  for (int i = 0; i < c.batch * c.kv_heads; ++i) {
    q_descale.push_back(c.descales ? kDescales[i % 7] : 1.0f);
    k_descale.push_back(c.descales ? kDescales[(i + 3) % 7] : 1.0f);
    v_descale.push_back(c.descales ? kDescales[(i + 5) % 7] : 1.0f);
  }

  DeviceBuffer<uint8_t> dq(ctx, q.bytes.size(), "q"), dk(ctx, k.bytes.size(), "k"), dv(ctx, v.bytes.size(), "v");
  dq.copy_from_host(q.bytes);
  dk.copy_from_host(k.bytes);
  dv.copy_from_host(v.bytes);
  const size_t out_elements = size_t(c.batch) * c.heads * c.seq_q * D;
  DeviceBuffer<unsigned char> out(ctx, out_elements * 2, "out");
  DeviceBuffer<float> lse(ctx, size_t(c.batch) * c.heads * c.seq_q, "lse");
  out.fill_bytes(0xff);  // NaN in bf16 and f16
  lse.fill_bytes(0xff);
  DeviceBuffer<float> qs(ctx, q_descale.size(), "q_descale"), ks(ctx, k_descale.size(), "k_descale"),
      vs(ctx, v_descale.size(), "v_descale");
  qs.copy_from_host(q_descale);
  ks.copy_from_host(k_descale);
  vs.copy_from_host(v_descale);
  std::vector<float> sinks;
  for (int h = 0; h < c.heads; ++h) sinks.push_back(h % 2 == 0 ? 1.5f : -INFINITY);
  DeviceBuffer<float> sinks_device(ctx, sinks.size(), "sinks");
  sinks_device.copy_from_host(sinks);
  std::vector<float> slopes;
  for (int h = 0; h < c.heads; ++h) slopes.push_back(0.25f / float(1 << h));
  DeviceBuffer<float> slopes_device(ctx, slopes.size(), "alibi_slopes");
  slopes_device.copy_from_host(slopes);
  DeviceBuffer<int32_t> q_offset;
  if (!c.q_offset.empty()) {
    q_offset = DeviceBuffer<int32_t>(ctx, c.q_offset.size(), "q_offset");
    q_offset.copy_from_host(c.q_offset);
  }
  DeviceBuffer<int32_t> lengths;
  if (!c.key_lengths.empty()) {
    lengths = DeviceBuffer<int32_t>(ctx, c.key_lengths.size(), "key_lengths");
    lengths.copy_from_host(c.key_lengths);
  }

  detail::AttentionCall call;
  call.q = q.view(dq.data());
  call.k = k.view(dk.data());
  call.v = v.view(dv.data());
  call.out = TensorView::bhsd(out.data(), c.out_dtype, c.batch, c.heads, c.seq_q, D);
  call.dtype = DType::e4m3;
  call.batch = c.batch;
  call.heads = c.heads;
  call.kv_heads = c.kv_heads;
  call.seq_q = c.seq_q;
  call.seq_k = c.seq_k;
  call.head_dim = D;
  call.causal = c.causal;
  call.scale = float(1.0 / std::sqrt(double(D)));
  call.key_lengths = c.key_lengths.empty() ? nullptr : lengths.data();
  call.lse = c.lse ? lse.data() : nullptr;
  call.window_left = c.window_left;
  call.window_right = c.window_right;
  call.softcap = c.softcap;
  call.sinks = c.sinks ? sinks_device.data() : nullptr;
  call.alibi_slopes = c.alibi ? slopes_device.data() : nullptr;
  call.alibi_stride_batch = 0;  // [heads]
  call.q_offset = c.q_offset.empty() ? nullptr : q_offset.data();
  if (c.descales) {
    call.q_descale = qs.data();
    call.k_descale = ks.data();
    call.v_descale = vs.data();
  }
  detail::ContextState& state = ctx.state();
  if (!detail::fused_takes_fp8(state, call)) {
    ADD_FAILURE() << "fused_takes_fp8 refused the call";
    return false;
  }
  EXPECT_EQ(detail::fused_unsupported(state, call), nullptr);
  const size_t workspace_bytes = detail::fused_workspace_bytes(call);
  DeviceBuffer<unsigned char> workspace(ctx, workspace_bytes, "workspace");
  workspace.fill_bytes(0xff);  // the pre-pass must write every byte the kernel reads
  detail::sim_launch_log().clear();
  detail::run_fused(state, call, workspace.data());
  ctx.synchronize();
  const std::vector<std::string> log = detail::sim_launch_log();
  EXPECT_EQ(log, (std::vector<std::string>{"transpose_v_fp8_kernel", "flash_fwd_hopper_fp8_kernel"}));

  // The reference on the dequantized inputs, contiguous BHSD.
  reference::Problem problem;
  problem.batch = c.batch;
  problem.heads = c.heads;
  problem.kv_heads = c.kv_heads;
  problem.seq_q = c.seq_q;
  problem.seq_k = c.seq_k;
  problem.head_dim = D;
  problem.causal = c.causal;
  problem.scale = double(call.scale);
  problem.key_lengths = c.key_lengths;
  problem.window_left = c.window_left;
  problem.window_right = c.window_right;
  problem.softcap = double(c.softcap);
  if (c.sinks) problem.sinks.assign(sinks.begin(), sinks.end());
  if (c.alibi) problem.alibi_slopes.assign(slopes.begin(), slopes.end());
  problem.q_offset = c.q_offset;
  const int group = c.heads / c.kv_heads;
  std::vector<double> rq(size_t(c.batch) * c.heads * c.seq_q * D), rk(size_t(c.batch) * c.kv_heads * c.seq_k * D, 0.0),
      rv(rk.size(), 0.0);
  for (int b = 0; b < c.batch; ++b) {
    for (int h = 0; h < c.heads; ++h)
      for (int s = 0; s < c.seq_q; ++s)
        for (int e = 0; e < D; ++e)
          rq[((size_t(b) * c.heads + h) * c.seq_q + s) * D + e] =
              from_e4m3(q.bytes[size_t(q.at(b, h, s, e))]) * q_descale[size_t(b * c.kv_heads + h / group)];
    for (int g = 0; g < c.kv_heads; ++g)
      for (int s = 0; s < key_len(b); ++s)  // past the length: 0 in the reference (it never reads them)
        for (int e = 0; e < D; ++e) {
          const size_t i = ((size_t(b) * c.kv_heads + g) * c.seq_k + s) * D + e;
          rk[i] = from_e4m3(k.bytes[size_t(k.at(b, g, s, e))]) * k_descale[size_t(b * c.kv_heads + g)];
          rv[i] = from_e4m3(v.bytes[size_t(v.at(b, g, s, e))]) * v_descale[size_t(b * c.kv_heads + g)];
        }
  }
  const reference::Result expected = reference::attention(problem, rq, rk, rv);

  const std::vector<unsigned char> out_bytes = out.to_host();
  const std::vector<float> lse_got = lse.to_host();
  const double out_unit = c.out_dtype == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  int bad = 0;
  double worst = 0;  // the largest error / bound (SELFATTN_TEST_REPORT=1 prints it)
  for (int b = 0; b < c.batch; ++b)
    for (int h = 0; h < c.heads; ++h)
      for (int row = 0; row < c.seq_q; ++row) {
        const size_t r = (size_t(b) * c.heads + h) * c.seq_q + row;
        // The row's visible keys and probabilities, for the bound (the reference's mask rule; the
        // sink left out of l, which only makes P_j and the bound larger).
        const reference::RowKeys placed = reference::row_keys(problem, b, row);
        const reference::KeyRange keys = placed.keys;
        const int seen = keys.end - keys.begin;
        std::vector<double> x(size_t(c.seq_k), -INFINITY);
        double m = -INFINITY;
        for (int j = keys.begin; j < keys.end; ++j) {
          double dot = 0;
          for (int e = 0; e < D; ++e)
            dot += rq[r * D + e] * rk[((size_t(b) * c.kv_heads + h / group) * c.seq_k + j) * D + e];
          double score = dot * problem.scale;
          if (c.softcap > 0) score = c.softcap * std::tanh(score / c.softcap);
          if (c.alibi) score -= double(slopes[size_t(h)]) * std::fabs(double(placed.aligned) - double(j));
          x[size_t(j)] = score;
          m = std::max(m, score);
        }
        double l = 0;
        for (int j = keys.begin; j < keys.end; ++j) l += std::exp(x[size_t(j)] - m);
        for (int e = 0; e < D; ++e) {
          const double got = testing::load_element(out_bytes.data(), c.out_dtype, r * D + e);
          const double want = expected.out[r * D + e];
          double weighted = 0, plain = 0;  // sum_j P_j |v_jc|, sum_j |v_jc|
          for (int j = keys.begin; j < keys.end; ++j) {
            const double vj = std::fabs(rv[((size_t(b) * c.kv_heads + h / group) * c.seq_k + j) * D + e]);
            weighted += std::exp(x[size_t(j)] - m) / l * vj;
            plain += vj;
          }
          const double fp8_p = std::ldexp(weighted, -4) + (seen > 0 ? std::ldexp(plain / l, -10) : 0.0);
          const double bound = fp8_p + std::ldexp(weighted, -16) + out_unit * (std::fabs(want) + fp8_p);
          const bool ok = seen == 0 ? got == 0.0 : std::fabs(got - want) <= bound;  // NaN fails both
          if (seen > 0) worst = std::max(worst, std::fabs(got - want) / bound);
          if (!ok && bad++ < 5)
            ADD_FAILURE() << "out[" << b << "," << h << "," << row << "," << e << "] = " << got << ", reference "
                          << want << ", bound " << bound;
        }
        if (c.lse) {
          const double got = lse_got[r], want = expected.lse[r];
          const bool no_sink = !c.sinks || h % 2 != 0;
          const bool ok = seen == 0 && no_sink ? (std::isinf(got) && got < 0)
                                               : std::fabs(got - want) <= std::ldexp(std::fabs(want) + 1, -16);
          if (!ok && bad++ < 5)
            ADD_FAILURE() << "lse[" << b << "," << h << "," << row << "] = " << got << ", reference " << want;
        }
      }
  if (std::getenv("SELFATTN_TEST_REPORT") != nullptr)
    std::printf("%s: largest out error %.3f of its bound\n", c.name().c_str(), worst);
  return bad == 0 && !::testing::Test::HasFailure();
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
  call.head_dim = 128;
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
  EXPECT_TRUE(refused([](detail::AttentionCall& x) { x.head_dim = 64; }));
  detail::AttentionCall d256 = call;
  d256.head_dim = 256;
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
  EXPECT_TRUE(check_fp8({1, 1, 1, 65, 1000, top_left, f16, true, {}, /*descales=*/false}));
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
