#pragma once
// The backward check's reference side (backward_check.h): one problem in double, the exact gradients
// from reference::attention_backward, and which rows and keys must be exactly 0.
#include <algorithm>
#include <cmath>
#include <vector>

#include "attention_harness.h"
#include "backward_check_case.h"
#include "selfattn/reference.h"

namespace selfattn::backward_check {

inline double to_double_rounded(DType dtype, double x) { return double(testing::round_to(dtype, float(x))); }

// One (sequence) problem in double: q [h, sq, d], k [kvh, sk, d], v [kvh, sk, dv] and dout
// [h, sq, dv] per batch entry, contiguous BHSD (d = head_dim, dv = head_dim_v).
struct Dense {
  int batch, heads, kv_heads, seq_q, seq_k, head_dim, head_dim_v;
  std::vector<double> q, k, v, dout, bias;  // bias [batch, heads, seq_q, seq_k] or empty
  std::vector<double> slopes;               // [heads] or empty
  std::vector<int32_t> key_lengths;
  std::vector<int32_t> key_start, q_offset;  // [batch] or empty
  std::vector<double> dlse;                 // [batch, heads, seq_q] or empty
  std::vector<double> sinks;                // [heads] or empty
  std::vector<uint8_t> dropout_keep;        // [batch, heads, seq_q, seq_k] or empty (no dropout)
};

// dq/dk/dv and which rows/keys must be exactly 0.
struct Expected {
  std::vector<double> dq, dk, dv;
  std::vector<char> dq_zero, dkv_zero;  // per row of dq; per key row of dk/dv
  std::vector<double> dsinks;           // [heads] with sinks
};

// The expected gradients of one padded problem: reference::attention_backward (itself checked against
// finite differences of the forward reference), and which rows and keys must be exactly 0 - decided by
// the mask rule alone (a row with no visible, unmasked key; a key no such row sees), never by a
// computed value (a row with one key has dS = 0 in exact arithmetic but not in a kernel's).
inline reference::Problem problem_of(const Dense& p, const Case& c, double scale) {
  reference::Problem problem;
  problem.batch = p.batch;
  problem.heads = p.heads;
  problem.kv_heads = p.kv_heads;
  problem.seq_q = p.seq_q;
  problem.seq_k = p.seq_k;
  problem.head_dim = p.head_dim;
  problem.head_dim_v = p.head_dim_v;
  problem.causal = c.causal;
  problem.scale = scale;
  problem.key_lengths = p.key_lengths;
  problem.key_start = p.key_start;
  problem.q_offset = p.q_offset;
  problem.window_left = c.window_left;
  problem.window_right = c.window_right;
  problem.softcap = c.softcap;
  problem.alibi_slopes = p.slopes;
  problem.bias = p.bias;
  problem.sinks = p.sinks;
  problem.dropout_p = c.dropout_p;
  problem.dropout_keep = p.dropout_keep;
  return problem;
}

inline Expected reference_gradients(const Dense& p, const Case& c, double scale) {
  const reference::Gradients g =
      reference::attention_backward(problem_of(p, c, scale), p.q, p.k, p.v, p.dout, p.dlse);
  Expected e;
  e.dq = g.dq;
  e.dk = g.dk;
  e.dv = g.dv;
  e.dsinks = g.dsinks;
  e.dq_zero.assign(size_t(p.batch) * p.heads * p.seq_q, 1);
  e.dkv_zero.assign(size_t(p.batch) * p.kv_heads * p.seq_k, 1);
  const int hpk = p.heads / p.kv_heads;
  const reference::Problem problem = problem_of(p, c, scale);
  for (int b = 0; b < p.batch; ++b) {
    for (int h = 0; h < p.heads; ++h)
      for (int i = 0; i < p.seq_q; ++i) {
        const size_t row = (size_t(b) * p.heads + h) * p.seq_q + i;
        const reference::KeyRange range = reference::row_keys(problem, b, i).keys;
        for (int j = range.begin; j < range.end; ++j) {
          if (!p.bias.empty() && p.bias[row * p.seq_k + j] == -INFINITY) continue;
          e.dq_zero[row] = 0;
          e.dkv_zero[(size_t(b) * p.kv_heads + h / hpk) * p.seq_k + j] = 0;
        }
      }
  }
  return e;
}

}  // namespace selfattn::backward_check
