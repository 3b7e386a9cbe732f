// check_backward_ignores_key_padding (attention_harness.h): the backward's gradients with NaN in the
// key rows past the key lengths (and before a key_start) against those with finite values there.
#include "attention_harness.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "harness_tensors.h"

namespace selfattn::testing {

using namespace harness;

namespace {

// One case of check_backward_ignores_key_padding.
::testing::AssertionResult check_backward_padding_case(Context& ctx, const AttentionCase& c, bool grad_f32,
                                                       double tolerance) {
  // The same seed twice gives the same values; make_operand puts NaN past the key lengths when asked.
  struct Inputs {
    Operand q, k, v, dout;
  };
  const auto inputs = [&](bool nan_padding) {
    std::mt19937_64 rng(input_seed(c));
    Operand q = make_operand(ctx, c, Role::q, c.heads, c.seq_q, rng, "test q");
    Operand k = make_operand(ctx, c, Role::k, c.kv_heads, c.seq_k, rng, "test k", Keys::random, nan_padding);
    Operand v = make_operand(ctx, c, Role::v, c.kv_heads, c.seq_k, rng, "test v", Keys::random, nan_padding);
    Operand dout = make_operand(ctx, c, Role::dout, c.heads, c.seq_q, rng, "test dout");
    return Inputs{std::move(q), std::move(k), std::move(v), std::move(dout)};
  };
  const Inputs finite = inputs(false), poisoned = inputs(true);

  DeviceBuffer<int32_t> key_lengths(ctx, c.key_lengths.size(), "test key_lengths");
  key_lengths.copy_from_host(c.key_lengths);
  DeviceBuffer<float> lse(ctx, size_t(c.batch) * c.heads * c.seq_q, "test lse");
  DeviceTensor out = make_tensor(ctx, c, Role::out, c.heads, c.seq_q, "test out");
  AttentionOptions options;
  options.path = c.path;
  options.causal = c.causal;
  options.key_lengths = key_lengths.data();
  DeviceBuffer<int32_t> key_start(ctx, std::max<size_t>(c.key_start.size(), 1), "test key_start");
  DeviceBuffer<int32_t> q_offset(ctx, std::max<size_t>(c.q_offset.size(), 1), "test q_offset");
  if (!c.key_start.empty()) {
    key_start.copy_from_host(c.key_start);
    options.key_start = key_start.data();
  }
  if (!c.q_offset.empty()) {
    q_offset.copy_from_host(c.q_offset);
    options.q_offset = q_offset.data();
  }
  options.lse = lse.data();
  AttentionCase gradient_case = c;
  if (grad_f32) gradient_case.dtype = DType::f32;
  DeviceTensor dq = make_tensor(ctx, gradient_case, Role::dq, c.heads, c.seq_q, "test dq");
  DeviceTensor dk = make_tensor(ctx, gradient_case, Role::dk, c.kv_heads, c.seq_k, "test dk");
  DeviceTensor dv = make_tensor(ctx, gradient_case, Role::dv, c.kv_heads, c.seq_k, "test dv");
  // Gradients [dq, dk, dv] of one input set, in the reference's order ([b, h, s, d]).
  const auto gradients = [&](const Inputs& in) {
    for (DeviceTensor* g : {&dq, &dk, &dv}) g->device.fill_bytes(0xFF);  // NaN: an element not written fails
    attention_backward(ctx, in.q.tensor.view, in.k.tensor.view, in.v.tensor.view, out.view, in.dout.tensor.view,
                       lse.data(), dq.view, dk.view, dv.view, options);
    ctx.synchronize();
    std::vector<std::vector<double>> values;
    for (const auto& [g, heads, rows, what] : {std::tuple{&dq, c.heads, c.seq_q, "dq"},
                                               std::tuple{&dk, c.kv_heads, c.seq_k, "dk"},
                                               std::tuple{&dv, c.kv_heads, c.seq_k, "dv"}}) {
      const std::vector<unsigned char> host = download(*g, c.batch);
      if (::testing::AssertionResult gaps = gaps_untouched(host, g->view, what); !gaps)
        throw std::runtime_error(gaps.message());
      values.push_back(out_values(*g, host, c.batch, heads, 0, rows));
    }
    return values;
  };
  std::vector<std::vector<double>> want, got;
  try {
    // out and the LSE from the finite inputs: the forward's own handling of the padding is not on trial.
    attention(ctx, finite.q.tensor.view, finite.k.tensor.view, finite.v.tensor.view, out.view, options);
    options.lse = nullptr;
    want = gradients(finite);
    got = gradients(poisoned);
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << c.name() << ": threw: " << e.what();
  }

  const char* names[] = {"dq", "dk", "dv"};
  for (int which = 0; which < 3; ++which) {
    const bool query = which == 0;
    const int heads = query ? c.heads : c.kv_heads, rows = query ? c.seq_q : c.seq_k;
    double largest = 0;
    for (double x : want[size_t(which)]) largest = std::max(largest, std::abs(x));
    for (size_t i = 0; i < got[size_t(which)].size(); ++i) {
      const size_t row = i / size_t(c.head_dim);
      const int b = int(row / (size_t(heads) * rows)), r = int(row % size_t(rows));
      const double x = got[size_t(which)][i], expected = want[size_t(which)][i];
      const bool padding = !query && (r >= std::clamp(c.key_lengths[size_t(b)], 0, c.seq_k) ||
                                      (!c.key_start.empty() && r < c.key_start[size_t(b)]));
      const bool wrong = !std::isfinite(x) || (padding ? x != 0.0 : std::abs(x - expected) > tolerance * largest);
      if (wrong)
        return ::testing::AssertionFailure()
               << c.name() << (grad_f32 ? " grad f32" : "") << ": " << names[which] << " at batch " << b << " head "
               << row / size_t(rows) % size_t(heads) << " row " << r << " column " << i % size_t(c.head_dim) << " is "
               << x << " with NaN key padding, " << expected << " with finite padding"
               << (padding ? " (a key row past the length: expected exactly 0)" : "");
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace

::testing::AssertionResult check_backward_ignores_key_padding(Context& ctx, Path path, double tolerance) {
  // GQA and not, both layouts, every causal mode, gradients in the input dtype and in f32, key
  // lengths full, partial and 0.
  // Left padding too: key_start (NaN before it) with a q_offset, and key_start alone.
  AttentionCase left_padded =
      make_case(DType::f16, 2, 2, 1, 5, 70, 64, Causal::bottom_right, Layout::bhsd, true, {70, 45}, path);
  left_padded.key_start = {37, 3};
  left_padded.q_offset = {20, 41};
  AttentionCase left_padded_f32 =
      make_case(DType::f32, 2, 2, 2, 7, 30, 16, Causal::none, Layout::bshd, true, {30, 30}, path);
  left_padded_f32.key_start = {29, 11};
  const std::pair<AttentionCase, bool> cases[] = {
      {make_case(DType::f32, 3, 4, 2, 9, 21, 16, Causal::none, Layout::bhsd, true, {21, 8, 0}, path), false},
      {make_case(DType::f16, 2, 2, 1, 13, 40, 32, Causal::bottom_right, Layout::bshd, true, {17, 40}, path), false},
      {make_case(DType::bf16, 2, 3, 3, 6, 33, 64, Causal::top_left, Layout::bhsd, true, {0, 5}, path), true},
      {left_padded, false},
      {left_padded_f32, true},
  };
  for (const auto& [c, grad_f32] : cases)
    if (::testing::AssertionResult verdict = check_backward_padding_case(ctx, c, grad_f32, tolerance); !verdict)
      return verdict;
  return ::testing::AssertionSuccess();
}

}  // namespace selfattn::testing
