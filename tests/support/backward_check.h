#pragma once
// The check of attention_backward() every backward path's tests share (tests/backward/test_backward_*.cpp):
// fresh random inputs in the case's dtype, the forward run on the device for out and the LSE,
// gradients poisoned (0xFF: NaN in every dtype) before the backward. Requires every element finite,
// exact zeros for rows that see no key (dq) and keys no row sees (dk, dv), decided by the mask rule,
// and each gradient within judge.h's rule: against reference::attention_backward from the rounded
// inputs, at most 2x the error of backward_expected.h's allowed computation (fp32, P and dS rounded
// to the input dtype for f16/bf16, from the forward's stored out and LSE) at every element, row and
// overall, plus a floor. With sinks, dsinks is judged by the same rule against an allowed computation
// from the stored out and LSE (fp32 D and sums). Each of q, k, v, out, dout, dq, dk, dv sits in its
// own layout with its own row gaps (tensor_layouts.h; NaN in the inputs' gaps), and the outputs'
// gaps must stay unwritten. SELFATTN_TEST_REPORT=1 prints how close each gradient came to its bounds.
// The case (backward_check_case.h), the reference side (backward_check_reference.h) and the case
// lists (backward_check_sweeps.h) are in headers of their own, included here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "attention_expected.h"
#include "attention_harness.h"
#include "backward_check_case.h"
#include "backward_check_reference.h"
#include "backward_check_sweeps.h"
#include "backward_expected.h"
#include "selfattn/selfattn.h"

namespace selfattn::backward_check {

// Runs the case; returns the gradients read back (logical layout) through `got` when given.
inline ::testing::AssertionResult check(Context& ctx, const Case& c, Gradients* got = nullptr) {
  const bool varlen = !c.varlen_q.empty();
  const int batch = varlen ? int(c.varlen_q.size()) : c.batch;
  std::vector<int32_t> cu_q(1, 0), cu_k(1, 0);
  for (size_t b = 0; varlen && b < c.varlen_q.size(); ++b) {
    cu_q.push_back(cu_q.back() + c.varlen_q[b]);
    cu_k.push_back(cu_k.back() + c.varlen_k[b]);
  }
  const int max_q = varlen ? *std::max_element(c.varlen_q.begin(), c.varlen_q.end()) : c.seq_q;
  const int max_k = varlen ? *std::max_element(c.varlen_k.begin(), c.varlen_k.end()) : c.seq_k;
  // The views' extents: [vb, heads, rows] with vb = 1 and rows = total for varlen.
  const int vb = varlen ? 1 : batch;
  const int owned_q = varlen ? cu_q.back() : c.seq_q, owned_k = varlen ? cu_k.back() : c.seq_k;
  const int rows_q = owned_q + (varlen ? c.unowned_q_rows : 0), rows_k = owned_k + (varlen ? c.unowned_k_rows : 0);
  const int d = c.head_dim, dv = c.v_dim();  // q, k, dq, dk rows; v, out, dout, dv rows
  const DType gdt = c.grad_f32 ? DType::f32 : c.dtype;
  const double scale = 1.0 / std::sqrt(double(d));

  std::mt19937_64 rng(testing::input_seed(c.name));
  std::normal_distribution<double> normal(0.0, 1.0);
  const auto row_length = [&](testing::Role role) {
    using testing::Role;
    return role == Role::v || role == Role::out || role == Role::dout || role == Role::dv ? dv : d;
  };
  const auto view_of = [&](void* data, DType dtype, int heads, int rows, testing::Role role) {
    return testing::strided_view(data, dtype, vb, heads, rows, row_length(role),
                                 testing::tensor_layout(c.bshd ? testing::Layout::bshd : testing::Layout::bhsd,
                                                        c.row_gap, c.strides, role));
  };
  const size_t nq = size_t(vb) * c.heads * rows_q * d, nk = size_t(vb) * c.kv_heads * rows_k * d;
  const size_t nq_v = size_t(vb) * c.heads * rows_q * dv, nk_v = size_t(vb) * c.kv_heads * rows_k * dv;
  // Logical BHSD host values, rounded to the dtype.
  const auto draw = [&](size_t n) {
    std::vector<double> x(n);
    for (double& e : x) e = to_double_rounded(c.dtype, normal(rng));
    return x;
  };
  const std::vector<double> q = draw(nq), k = draw(nk), v = draw(nk_v), dout = draw(nq_v);
  // Rows no sequence owns hold NaN in every input (the gaps hold it in any case).
  const int owned_rows[2] = {owned_q, owned_k};
  const auto unowned_query_row = [](const void* owned, int64_t, int64_t, int64_t s) {
    return s >= static_cast<const int*>(owned)[0];
  };
  const auto unowned_key_row = [](const void* owned, int64_t, int64_t, int64_t s) {
    return s >= static_cast<const int*>(owned)[1];
  };
  const auto upload = [&](DeviceBuffer<unsigned char>& buf, const TensorView& view, const std::vector<double>& x,
                          bool query_rows) {
    const std::vector<unsigned char> host =
        testing::strided_image(view, x, query_rows ? +unowned_query_row : +unowned_key_row, owned_rows);
    buf.copy_from_host(host.data(), host.size());
  };
  // Each output's elements in logical order, after checking that its gaps still hold their poison.
  ::testing::AssertionResult gaps = ::testing::AssertionSuccess();
  const auto download = [&](const DeviceBuffer<unsigned char>& buf, const TensorView& view, testing::Role role) {
    std::vector<unsigned char> host(buf.size());
    buf.copy_to_host(host.data(), host.size());
    if (gaps) gaps = testing::gaps_untouched(host, view, testing::to_string(role));
    return testing::logical_values(host, view);
  };
  // Buffers as long as their views reach, bytes from the views (filled in below).
  const auto buffer_for = [&](DType dtype, int heads, int rows, testing::Role role) {
    return DeviceBuffer<unsigned char>(
        ctx, std::max<size_t>(testing::span_elements(view_of(nullptr, dtype, heads, rows, role)), 1) * dtype_size(dtype));
  };
  using testing::Role;
  DeviceBuffer<unsigned char> qb = buffer_for(c.dtype, c.heads, rows_q, Role::q),
                              kb = buffer_for(c.dtype, c.kv_heads, rows_k, Role::k),
                              vb_ = buffer_for(c.dtype, c.kv_heads, rows_k, Role::v),
                              ob = buffer_for(c.dtype, c.heads, rows_q, Role::out),
                              dob = buffer_for(c.dtype, c.heads, rows_q, Role::dout),
                              dqb = buffer_for(gdt, c.heads, rows_q, Role::dq),
                              dkb = buffer_for(gdt, c.kv_heads, rows_k, Role::dk),
                              dvb = buffer_for(gdt, c.kv_heads, rows_k, Role::dv);
  const TensorView qv = view_of(qb.data(), c.dtype, c.heads, rows_q, Role::q),
                   kv = view_of(kb.data(), c.dtype, c.kv_heads, rows_k, Role::k),
                   vv = view_of(vb_.data(), c.dtype, c.kv_heads, rows_k, Role::v),
                   ov = view_of(ob.data(), c.dtype, c.heads, rows_q, Role::out),
                   dov = view_of(dob.data(), c.dtype, c.heads, rows_q, Role::dout),
                   dqv = view_of(dqb.data(), gdt, c.heads, rows_q, Role::dq),
                   dkv = view_of(dkb.data(), gdt, c.kv_heads, rows_k, Role::dk),
                   dvv = view_of(dvb.data(), gdt, c.kv_heads, rows_k, Role::dv);
  upload(qb, qv, q, true);
  upload(kb, kv, k, false);
  upload(vb_, vv, v, false);
  upload(dob, dov, dout, true);
  // out's rows no sequence owns are not written by the forward: they keep this NaN for the backward.
  ob.fill_bytes(0xFF);

  DeviceBuffer<float> lse(ctx, size_t(vb) * c.heads * rows_q + 1);
  lse.fill_bytes(0xFF);  // NaN: the rows no sequence owns keep it
  // dL/d(lse) in lse's layout, fp32 values (NaN in the rows no sequence owns).
  std::vector<float> dlse_f(c.dlse ? size_t(vb) * c.heads * rows_q : 0);
  for (size_t i = 0; i < dlse_f.size(); ++i) dlse_f[i] = int(i % size_t(rows_q)) < owned_q ? float(normal(rng)) : NAN;
  DeviceBuffer<float> dlse_b(ctx, std::max<size_t>(dlse_f.size(), 1));
  if (c.dlse) dlse_b.copy_from_host(dlse_f.data(), dlse_f.size());
  DeviceBuffer<int32_t> lengths(ctx, std::max<size_t>(c.key_lengths.size(), 1)), cuq(ctx, cu_q.size()), cuk(ctx, cu_k.size());
  if (!c.key_lengths.empty()) lengths.copy_from_host(c.key_lengths.data(), c.key_lengths.size());
  DeviceBuffer<int32_t> key_start(ctx, std::max<size_t>(c.key_start.size(), 1)),
      q_offset(ctx, std::max<size_t>(c.q_offset.size(), 1));
  if (!c.key_start.empty()) key_start.copy_from_host(c.key_start.data(), c.key_start.size());
  if (!c.q_offset.empty()) q_offset.copy_from_host(c.q_offset.data(), c.q_offset.size());
  cuq.copy_from_host(cu_q.data(), cu_q.size());
  cuk.copy_from_host(cu_k.data(), cu_k.size());
  std::vector<double> slopes;
  std::vector<float> slopes_f;
  for (int h = 0; c.alibi && h < c.heads; ++h) {
    slopes_f.push_back(std::pow(2.0f, -8.0f * float(h + 1) / float(c.heads)));
    slopes.push_back(slopes_f.back());
  }
  DeviceBuffer<float> slopes_b(ctx, std::max<size_t>(slopes_f.size(), 1));
  if (c.alibi) slopes_b.copy_from_host(slopes_f.data(), slopes_f.size());
  std::vector<double> bias;
  std::vector<float> bias_f;
  if (c.bias) {
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    bias_f.resize(size_t(batch) * c.heads * max_q * max_k);
    for (float& x : bias_f) x = unit(rng) < 0.1 ? -INFINITY : c.bias_bool ? 0.0f : float(normal(rng));
    // Row 0 of (batch 0, head 0): every key masked, so it sees no key at all.
    for (int j = 0; j < max_k; ++j) bias_f[j] = -INFINITY;
    bias.assign(bias_f.begin(), bias_f.end());
  }
  DeviceBuffer<float> bias_b(ctx, std::max<size_t>(bias_f.size(), 1));
  if (c.bias) bias_b.copy_from_host(bias_f.data(), bias_f.size());
  std::vector<uint8_t> bias_bytes(bias_f.size());  // as a boolean mask: 1 may attend
  for (size_t i = 0; i < bias_f.size(); ++i) bias_bytes[i] = bias_f[i] == -INFINITY ? 0 : 1;
  DeviceBuffer<uint8_t> bias_bool(ctx, std::max<size_t>(bias_bytes.size(), 1));
  if (c.bias_bool) bias_bool.copy_from_host(bias_bytes.data(), bias_bytes.size());
  std::vector<float> sinks_f;
  std::normal_distribution<double> sink_logit(std::log(double(std::max(max_k, 1))), 1.5);
  for (int h = 0; c.sinks && h < c.heads; ++h) sinks_f.push_back(h % 3 == 2 ? -INFINITY : float(sink_logit(rng)));
  const std::vector<double> sinks(sinks_f.begin(), sinks_f.end());
  DeviceBuffer<float> sinks_b(ctx, std::max<size_t>(sinks_f.size(), 1)), dsinks_b(ctx, sinks_b.size());
  if (c.sinks) sinks_b.copy_from_host(sinks_f.data(), sinks_f.size());

  AttentionOptions options;
  options.path = Path::naive;
  options.causal = c.causal;
  options.key_lengths = c.key_lengths.empty() ? nullptr : lengths.data();
  options.key_start = c.key_start.empty() ? nullptr : key_start.data();
  options.q_offset = c.q_offset.empty() ? nullptr : q_offset.data();
  options.window_left = c.window_left;
  options.window_right = c.window_right;
  if (c.softcap > 0) options.softcap = c.softcap;
  if (c.alibi) {
    options.alibi_slopes = slopes_b.data();
    options.alibi_slopes_count = c.heads;
  }
  if (c.bias) {
    options.bias = c.bias_bool ? TensorView::bhsd(bias_bool.data(), DType::b8, batch, c.heads, max_q, max_k)
                               : TensorView::bhsd(bias_b.data(), DType::f32, batch, c.heads, max_q, max_k);
  }
  if (c.sinks) options.sinks = sinks_b.data();
  options.dropout_p = c.dropout_p;
  options.dropout_seed = c.dropout_seed;
  options.dropout_offset = c.dropout_offset;
  options.lse = lse.data();
  if (varlen) attention_varlen(ctx, qv, kv, vv, ov, cuq.data(), cuk.data(), batch, max_q, max_k, options);
  else attention(ctx, qv, kv, vv, ov, options);
  options.lse = nullptr;
  options.path = c.path;

  BackwardOptions backward;
  backward.deterministic = c.deterministic;
  if (c.dlse) backward.dlse = dlse_b.data();
  if (c.sinks) backward.dsinks = dsinks_b.data();
  const auto run_backward = [&]() {
    dqb.fill_bytes(0xFF);  // NaN in every dtype: an element not written fails
    dkb.fill_bytes(0xFF);
    dvb.fill_bytes(0xFF);
    dsinks_b.fill_bytes(0xFF);
    if (varlen)
      attention_varlen_backward(ctx, qv, kv, vv, ov, dov, lse.data(), dqv, dkv, dvv, cuq.data(), cuk.data(), batch,
                                max_q, max_k, options, backward);
    else
      attention_backward(ctx, qv, kv, vv, ov, dov, lse.data(), dqv, dkv, dvv, options, backward);
    ctx.synchronize();
    std::vector<float> dsinks(sinks_f.size());
    if (c.sinks) dsinks_b.copy_to_host(dsinks.data(), dsinks.size());
    return Gradients{download(dqb, dqv, Role::dq), download(dkb, dkv, Role::dk), download(dvb, dvv, Role::dv), dsinks};
  };
  const Gradients g = run_backward();
  if (!gaps) return ::testing::AssertionFailure() << c.name << ": " << gaps.message();
  if (got) *got = g;
  if (c.deterministic_rerun) {
    const Gradients again = run_backward();
    const auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
    };
    if (!same_bits(g.dq, again.dq) || !same_bits(g.dk, again.dk) || !same_bits(g.dv, again.dv) ||
        !same_bits(g.dsinks, again.dsinks))
      return ::testing::AssertionFailure() << c.name << ": two runs gave different gradient bits";
  }

  // The kernels' own inputs from the forward: out as stored, the fp32 LSE.
  const std::vector<float> out_stored = download(ob, ov, Role::out);
  if (!gaps) return ::testing::AssertionFailure() << c.name << ": " << gaps.message();
  const std::vector<double> out_all(out_stored.begin(), out_stored.end());
  std::vector<float> lse_host(lse.size());
  lse.copy_to_host(lse_host.data(), lse_host.size());
  const auto widen = [](const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); };
  const std::vector<double> got_dq = widen(g.dq), got_dk = widen(g.dk), got_dv = widen(g.dv);
  ::testing::AssertionResult judged = ::testing::AssertionSuccess();

  // The expected gradients, problem by problem (each varlen sequence as a batch-1 problem).
  Expected e;
  e.dq.assign(nq, 0.0);
  e.dk.assign(nk, 0.0);
  e.dv.assign(nk_v, 0.0);
  e.dq_zero.assign(nq / d, 1);
  e.dkv_zero.assign(nk / d, 1);
  e.dsinks.assign(sinks.size(), 0.0);
  for (int b = 0; b < (varlen ? batch : 1); ++b) {
    Dense p;
    p.heads = c.heads;
    p.kv_heads = c.kv_heads;
    p.head_dim = d;
    p.head_dim_v = dv;
    p.slopes = slopes;
    p.sinks = sinks;
    const int q0 = varlen ? cu_q[b] : 0, k0 = varlen ? cu_k[b] : 0;
    p.batch = varlen ? 1 : batch;
    p.seq_q = varlen ? c.varlen_q[b] : c.seq_q;
    p.seq_k = varlen ? c.varlen_k[b] : c.seq_k;
    if (!c.key_lengths.empty()) p.key_lengths = varlen ? std::vector<int32_t>{c.key_lengths[size_t(b)]} : c.key_lengths;
    if (!c.key_start.empty()) p.key_start = varlen ? std::vector<int32_t>{c.key_start[size_t(b)]} : c.key_start;
    if (!c.q_offset.empty()) p.q_offset = varlen ? std::vector<int32_t>{c.q_offset[size_t(b)]} : c.q_offset;
    if (c.dropout_p > 0) {
      p.dropout_keep = reference::dropout_keep_mask(c.dropout_p, c.dropout_seed, c.dropout_offset, p.batch, p.heads,
                                                    p.seq_q, p.seq_k, /*first_batch=*/varlen ? b : 0);
    }
    // Gathers rows [r0, r0 + n) of each (batch, head) of a logical [vb, heads, rows, cols] array.
    const auto rows_of = [&](const std::vector<double>& x, int heads, int rows, int r0, int n, int cols) {
      std::vector<double> out;
      for (int bb = 0; bb < p.batch; ++bb)
        for (int h = 0; h < heads; ++h)
          for (int r = r0; r < r0 + n; ++r)
            for (int e2 = 0; e2 < cols; ++e2) out.push_back(x[((size_t(bb) * heads + h) * rows + r) * cols + e2]);
      return out;
    };
    p.q = rows_of(q, c.heads, rows_q, q0, p.seq_q, d);
    p.dout = rows_of(dout, c.heads, rows_q, q0, p.seq_q, dv);
    p.k = rows_of(k, c.kv_heads, rows_k, k0, p.seq_k, d);
    p.v = rows_of(v, c.kv_heads, rows_k, k0, p.seq_k, dv);
    if (c.bias) {
      for (int bb = 0; bb < p.batch; ++bb)
        for (int h = 0; h < c.heads; ++h)
          for (int i = 0; i < p.seq_q; ++i)
            for (int j = 0; j < p.seq_k; ++j)
              p.bias.push_back(bias[((size_t(varlen ? b : bb) * c.heads + h) * max_q + i) * max_k + j]);
    }
    // This problem's rows of lse (and dlse), in its own [batch, heads, seq_q] layout.
    std::vector<double> lse_p;
    for (int bb = 0; bb < p.batch; ++bb)
      for (int h = 0; h < c.heads; ++h)
        for (int i = 0; i < p.seq_q; ++i) {
          const size_t at = varlen ? size_t(h) * rows_q + q0 + i : (size_t(bb) * c.heads + h) * rows_q + i;
          lse_p.push_back(lse_host[at]);
          if (c.dlse) p.dlse.push_back(dlse_f[at]);
        }
    const Expected part = reference_gradients(p, c, scale);
    for (size_t h = 0; h < part.dsinks.size(); ++h) e.dsinks[h] += part.dsinks[h];
    // The allowed computation below starts from the forward's out and LSE as stored (what the
    // kernels read), so those are judged first: a wrong LSE row would otherwise widen the
    // tolerance of every gradient element.
    const std::string where = varlen ? " of sequence " + std::to_string(b) : "";
    {
      const testing::AttentionExpected forward = testing::expected_attention(
          problem_of(p, c, scale), p.q, p.k, p.v, testing::AttentionArithmetic{c.dtype, c.dtype != DType::f32});
      for (const auto& [what, got_x, want] :
           {std::tuple<const char*, std::vector<double>, const testing::Expected*>{
                "the forward's out", rows_of(out_all, c.heads, rows_q, q0, p.seq_q, dv), &forward.out},
            {"the forward's lse", lse_p, &forward.lse}}) {
        if (auto r = testing::judge(std::string(what) + where, got_x, *want); !r)
          return ::testing::AssertionFailure() << c.name << ": the backward's input is wrong: " << r.message();
      }
    }
    // judge.h's rule on this problem's part of each gradient.
    {
      const testing::BackwardArithmetic arithmetic{c.dtype, gdt, c.dtype != DType::f32};
      const testing::BackwardExpected be =
          testing::expected_backward(problem_of(p, c, scale), p.q, p.k, p.v, p.dout,
                                     rows_of(out_all, c.heads, rows_q, q0, p.seq_q, dv), lse_p, arithmetic, p.dlse);
      const std::pair<const char*, std::pair<const std::vector<double>*, const testing::Expected*>> parts[] = {
          {"dq", {&got_dq, &be.dq}}, {"dk", {&got_dk, &be.dk}}, {"dv", {&got_dv, &be.dv}}};
      for (const auto& [what, pair] : parts) {
        const bool is_q = pair.second == &be.dq;
        const std::vector<double> got_part =
            rows_of(*pair.first, is_q ? c.heads : c.kv_heads, is_q ? rows_q : rows_k, is_q ? q0 : k0,
                    is_q ? p.seq_q : p.seq_k, pair.second == &be.dv ? dv : d);
        testing::Judgement judgement;
        ::testing::AssertionResult r = testing::judge(std::string(what) + where, got_part, *pair.second, &judgement);
        if (std::getenv("SELFATTN_TEST_REPORT"))
          std::printf("%s %s%s: judge element %.2f row %.2f all %.2f\n", c.name.c_str(), what, where.c_str(),
                      judgement.element, judgement.row, judgement.all);
        if (!r && judged) judged = ::testing::AssertionFailure() << c.name << ": " << r.message();
      }
    }
    // Scatter back.
    const auto put = [&](std::vector<double>& dst, std::vector<char>& zero, const std::vector<double>& src,
                         const std::vector<char>& src_zero, int heads, int rows, int r0, int n, int cols) {
      size_t idx = 0, row_idx = 0;
      for (int bb = 0; bb < p.batch; ++bb)
        for (int h = 0; h < heads; ++h)
          for (int r = r0; r < r0 + n; ++r, ++row_idx) {
            const size_t row = (size_t(bb) * heads + h) * rows + r;
            zero[row] = src_zero[row_idx];
            for (int e2 = 0; e2 < cols; ++e2) dst[row * cols + e2] = src[idx++];
          }
    };
    put(e.dq, e.dq_zero, part.dq, part.dq_zero, c.heads, rows_q, q0, p.seq_q, d);
    std::vector<char> dk_zero = e.dkv_zero;
    put(e.dk, e.dkv_zero, part.dk, part.dkv_zero, c.kv_heads, rows_k, k0, p.seq_k, d);
    put(e.dv, dk_zero, part.dv, part.dkv_zero, c.kv_heads, rows_k, k0, p.seq_k, dv);
  }

  // Every element finite, and exactly 0 where the mask rule leaves nothing; the values themselves
  // are judged above by judge.h's rule.
  const auto compare = [&](const char* what, const std::vector<float>& got_x, int cols,
                           const std::vector<char>& zero) -> ::testing::AssertionResult {
    for (size_t i = 0; i < got_x.size(); ++i) {
      if (!std::isfinite(got_x[i]))
        return ::testing::AssertionFailure() << c.name << ": " << what << "[" << i << "] = " << got_x[i] << " (not finite)";
      if (zero[i / size_t(cols)] && got_x[i] != 0.0f)
        return ::testing::AssertionFailure() << c.name << ": " << what << "[" << i << "] = " << got_x[i]
                                             << ", expected exactly 0 (a row or key that sees nothing)";
    }
    return ::testing::AssertionSuccess();
  };
  if (auto r = compare("dq", g.dq, d, e.dq_zero); !r) return r;
  if (auto r = compare("dk", g.dk, d, e.dkv_zero); !r) return r;
  if (auto r = compare("dv", g.dv, dv, e.dkv_zero); !r) return r;
  if (c.sinks) {
    // dsinks[h] = -sum_i exp(sink - lse_i) (D_i - dlse_i), allowed as the kernels compute it: D_i
    // an fp32 sum over the stored out and dout, the terms summed in fp32. Scale: the sum of the
    // terms' magnitudes; floor: fp32 roundings of D (sqrt(d)) and of the sum (sqrt(rows)).
    testing::Expected want;
    want.row_length = c.heads;
    want.exact = e.dsinks;
    want.allowed.assign(sinks.size(), 0.0);
    want.scale.assign(sinks.size(), 0.0);
    want.floor.assign(sinks.size(), 0.0);
    const double u32 = testing::unit_roundoff(DType::f32);
    for (int h = 0; h < c.heads; ++h) {
      if (sinks_f[size_t(h)] == -INFINITY) continue;  // exactly 0
      float sum = 0;
      double magnitude = 0;
      int rows = 0;
      for (int bb = 0; bb < vb; ++bb)
        for (int i = 0; i < owned_q; ++i, ++rows) {  // the rows no sequence owns take no part
          const size_t row = (size_t(bb) * c.heads + h) * rows_q + i;
          float dot = 0;
          double abs_dot = 0;
          for (int e2 = 0; e2 < dv; ++e2) {
            dot += float(dout[row * dv + e2]) * float(out_stored[row * dv + e2]);
            abs_dot += std::abs(dout[row * dv + e2] * out_stored[row * dv + e2]);
          }
          const float dlse_i = c.dlse ? dlse_f[row] : 0.0f;
          const float prob = std::exp(sinks_f[size_t(h)] - lse_host[row]);
          sum += prob * (dot - dlse_i);
          magnitude += double(prob) * (abs_dot + std::abs(dlse_i));
        }
      want.allowed[size_t(h)] = -sum;
      want.scale[size_t(h)] = magnitude;
      want.floor[size_t(h)] = u32 * (4 + std::sqrt(double(dv)) + std::sqrt(double(rows))) * magnitude;
    }
    const std::vector<double> got_dsinks(g.dsinks.begin(), g.dsinks.end());
    if (auto r = testing::judge("dsinks", got_dsinks, want); !r && judged)
      judged = ::testing::AssertionFailure() << c.name << ": " << r.message();
  }
  return judged;
}

}  // namespace selfattn::backward_check
