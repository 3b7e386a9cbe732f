#pragma once
// What KV-cache attention and merge_states are judged against (kv_cache_check.h includes this).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "attention_expected.h"
#include "attention_harness.h"
#include "selfattn/reference.h"

namespace selfattn::kv_test {

using testing::round_to;

// Sequence b of `image` alone: a batch of one over the same pool (a packed call's sequences are
// judged one by one).
inline reference::KvCacheImage sequence_image(const reference::KvCacheImage& image, int b) {
  reference::KvCacheImage one = image;
  one.batch = 1;
  one.lengths = {image.lengths[size_t(b)]};
  if (!image.block_table.empty()) {
    const auto row = image.block_table.begin() + ptrdiff_t(b) * image.max_pages_per_seq;
    one.block_table.assign(row, row + image.max_pages_per_seq);
  } else {
    one.batch_index = {image.batch_index.empty() ? b : image.batch_index[size_t(b)]};
  }
  return one;
}

// What attention_with_kv_cache's out and lse are judged against: sequence b attends to its first
// length(b) cache rows, bottom-right aligned, with q rotated at its positions first when `rotary` is
// given (the library stores the rotated q in its dtype: the allowed computation rounds it, the
// exact one does not). Rows in [batch, heads, seq_q] order, as out and lse are laid out.
inline testing::AttentionExpected expected_kv_attention(const reference::Problem& problem, const std::vector<double>& q,
                                                        const reference::KvCacheImage& cache, DType dtype,
                                                        const reference::RotaryTable* rotary = nullptr) {
  const size_t d = size_t(problem.head_dim), per_batch = size_t(problem.heads) * problem.seq_q * d;
  std::vector<double> q_stored = q;
  if (rotary) {
    for (int b = 0; b < problem.batch; ++b)
      for (int row = 0; row < problem.heads * problem.seq_q; ++row) {
        double* values = q_stored.data() + size_t(b) * per_batch + size_t(row) * d;
        reference::rotate_row(values, problem.head_dim,
                              int(rotary->position(b, cache.length(b) - problem.seq_q, row % problem.seq_q)), *rotary);
        for (size_t e = 0; e < d; ++e) values[e] = round_to(dtype, float(values[e]));
      }
  }
  testing::AttentionArithmetic arithmetic;
  arithmetic.dtype = dtype;
  arithmetic.p_rounded = dtype != DType::f32;  // the tensor-core kernels (split-KV, or fused after a gather)
  testing::AttentionExpected expected;
  expected.out.row_length = cache.v_dim();
  for (int b = 0; b < problem.batch; ++b) {
    reference::Problem one = reference::kv_sequence_problem(problem, b, cache.length(b));
    one.head_dim_v = cache.v_dim();
    std::vector<double> k, v;
    reference::gather_kv(cache, b, k, v);
    const std::vector<double> q_b(q_stored.begin() + ptrdiff_t(b * per_batch), q_stored.begin() + ptrdiff_t((b + 1) * per_batch));
    const testing::AttentionExpected part = testing::expected_attention(one, q_b, k, v, arithmetic);
    expected.out.append(part.out);
    expected.lse.append(part.lse);
  }
  // The exact result rotates q in double and never rounds it.
  const reference::Result exact = reference::attention_with_kv_cache(problem, q, cache, rotary);
  expected.out.exact = exact.out;
  expected.lse.exact = exact.lse;
  return expected;
}

// merge_states of two results judged against: the exact merge of the exact parts; allowed, the merge
// computed in fp32 from the parts as the library may have stored them (out in its dtype).
inline testing::AttentionExpected expected_merge(const testing::AttentionExpected& a, const testing::AttentionExpected& b,
                                                 DType dtype) {
  const size_t d = size_t(a.out.row_length), rows = a.lse.size();
  reference::Result exact_a{a.out.exact, a.lse.exact}, exact_b{b.out.exact, b.lse.exact};
  const reference::Result exact = reference::merge_states(exact_a, exact_b, int(d));
  testing::AttentionExpected e;
  e.out.row_length = int(d);
  e.out.exact = exact.out;
  e.lse.exact = exact.lse;
  e.out.allowed.assign(rows * d, 0.0);
  e.out.scale.assign(rows * d, 0.0);
  e.out.floor.assign(rows * d, 0.0);
  e.lse.allowed = exact.lse;
  e.lse.scale.assign(rows, 0.0);
  e.lse.floor.assign(rows, 0.0);
  const double u32 = testing::unit_roundoff(DType::f32);
  for (size_t row = 0; row < rows; ++row) {
    const float lse_a = float(a.lse.allowed[row]), lse_b = float(b.lse.allowed[row]);
    const float m = std::max(lse_a, lse_b);
    if (m == -INFINITY) continue;  // both parts saw no key: 0 and -inf exactly
    const float w_a = std::exp(lse_a - m), w_b = std::exp(lse_b - m), sum = w_a + w_b;
    const double share_a = double(w_a) / sum, share_b = double(w_b) / sum;
    e.lse.allowed[row] = m + std::log(sum);
    e.lse.scale[row] = share_a * a.lse.scale[row] + share_b * b.lse.scale[row] + 1;
    e.lse.floor[row] = share_a * a.lse.floor[row] + share_b * b.lse.floor[row] + u32 * (std::abs(exact.lse[row]) + 4);
    for (size_t c = 0; c < d; ++c) {
      const size_t at = row * d + c;
      const float o_a = float(round_to(dtype, float(a.out.allowed[at]))), o_b = float(round_to(dtype, float(b.out.allowed[at])));
      e.out.allowed[at] = round_to(dtype, (w_a * o_a + w_b * o_b) / sum);
      e.out.scale[at] = share_a * a.out.scale[at] + share_b * b.out.scale[at] + std::abs(exact.out[at]);
      e.out.floor[at] = share_a * a.out.floor[at] + share_b * b.out.floor[at] +
                        testing::rounding_floor(dtype, 4, e.out.scale[at]);
    }
  }
  return e;
}

}  // namespace selfattn::kv_test
