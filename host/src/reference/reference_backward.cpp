// The CPU reference of the backward pass (reference.h): the gradients of reference::attention() in
// double precision, one (batch, head, query row) at a time, written for clarity.
//
// For row i with visible keys j (the mask rule of visible_key_range), raw score r_ij = scale q_i.k_j,
// modified score x_ij = mods(r_ij), P_ij = softmax_j(x_ij), out_i = sum_j P_ij v_j:
//   dv_j  += P_ij dout_i
//   dP_ij  = dout_i . v_j,  D_i = sum_j P_ij dP_ij,  dx_ij = P_ij (dP_ij - D_i)
//   dr_ij  = dx_ij * dmods/dr  (softcap: 1 - tanh^2(r / softcap); ALiBi and bias add constants)
//   dq_i  += scale dr_ij k_j,  dk_j += scale dr_ij q_i
// With dropout (keep mask M, rate p) out_i = sum_j P_ij M_ij / (1 - p) v_j: dv_j takes that weight,
// dP_ij = dout_i . v_j M_ij / (1 - p), and D_i, dx and the rest keep their form (D_i = dout_i.out_i).
// A sink is a key whose value is 0 and whose score is its logit: it takes probability P_i,sink in
// the softmax (and so in D_i) and gets dsink += P_i,sink (0 - D_i).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "selfattn/error.h"
#include "selfattn/reference.h"

namespace selfattn::reference {

Gradients attention_backward(const Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                             const std::vector<double>& v, const std::vector<double>& dout,
                             const std::vector<double>& dlse) {
  // The forward's own checks (shapes, options) first; then dout's and dlse's sizes.
  (void)attention(p, q, k, v);
  const size_t rows = size_t(p.batch) * p.heads * p.seq_q;
  if (dout.size() != rows * size_t(p.v_dim())) {
    throw InvalidArgument("reference::attention_backward: dout expected " + std::to_string(rows * size_t(p.v_dim())) +
                          " elements (out's), got " + std::to_string(dout.size()));
  }
  if (!dlse.empty() && dlse.size() != rows) {
    throw InvalidArgument("reference::attention_backward: dlse expected " + std::to_string(rows) +
                          " elements (batch * heads * seq_q) or none, got " + std::to_string(dlse.size()));
  }
  const double scale = p.scale != 0 ? p.scale : 1.0 / std::sqrt(double(std::max(p.head_dim, 1)));
  const int group = p.kv_heads > 0 ? p.heads / p.kv_heads : 1;
  const size_t d = size_t(p.head_dim), dv_cols = size_t(p.v_dim());  // q/k's head dim, v/out's

  Gradients g;
  g.dq.assign(q.size(), 0.0);
  g.dk.assign(k.size(), 0.0);
  g.dv.assign(v.size(), 0.0);
  if (!p.sinks.empty()) g.dsinks.assign(size_t(p.heads), 0.0);
  std::vector<double> x(size_t(p.seq_k)), tanh_r(size_t(p.seq_k)), dp(size_t(p.seq_k));

  for (int b = 0; b < p.batch; ++b) {
    for (int h = 0; h < p.heads; ++h) {
      const size_t kv_head = size_t(b) * p.kv_heads + h / group;
      const size_t k_offset = kv_head * p.seq_k * d, v_offset = kv_head * p.seq_k * dv_cols;
      const double slope = alibi_slope(p, b, h);
      for (int i = 0; i < p.seq_q; ++i) {
        const size_t row = (size_t(b) * p.heads + h) * p.seq_q + i;
        const double* q_row = q.data() + row * d;
        const double* do_row = dout.data() + row * dv_cols;
        const RowKeys row_keys_i = row_keys(p, b, i);
        const KeyRange keys = row_keys_i.keys;
        const double aligned = double(row_keys_i.aligned);

        // The forward's probabilities for this row (as reference::attention computes them).
        double max_x = -std::numeric_limits<double>::infinity();
        for (int j = keys.begin; j < keys.end; ++j) {
          const double* k_row = k.data() + k_offset + size_t(j) * d;
          double dot = 0;
          for (size_t e = 0; e < d; ++e) dot += q_row[e] * k_row[e];
          double s = scale * dot;
          if (p.softcap > 0) {
            tanh_r[j] = std::tanh(s / p.softcap);
            s = p.softcap * tanh_r[j];
          }
          s -= slope * std::abs(aligned - double(j));
          if (!p.bias.empty()) s += p.bias[row * p.seq_k + j];
          x[j] = s = limit_score(s);  // the clamp's own derivative is taken as 1, as the kernels do
          max_x = std::max(max_x, s);
        }
        const double sink = sink_logit(p, h);
        max_x = std::max(max_x, sink);
        if (max_x == -std::numeric_limits<double>::infinity()) continue;  // no key, no sink: every gradient 0
        double sum = std::exp(sink - max_x);
        for (int j = keys.begin; j < keys.end; ++j) sum += (x[j] = std::exp(x[j] - max_x));
        for (int j = keys.begin; j < keys.end; ++j) x[j] /= sum;  // x is now P
        const double sink_prob = std::exp(sink - max_x) / sum;

        // D_i = sum_j P_ij dP_ij, less the LSE's gradient: d lse_i / d s_ij = P_ij adds dlse_i P_ij to dS_ij.
        double dsum = dlse.empty() ? 0.0 : -dlse[row];
        for (int j = keys.begin; j < keys.end; ++j) {
          const double* v_row = v.data() + v_offset + size_t(j) * dv_cols;
          double dot = 0;
          for (size_t e = 0; e < dv_cols; ++e) dot += do_row[e] * v_row[e];
          dp[j] = dot * dropout_factor(p, row, j);  // dP of the dropped P the forward used
          dsum += x[j] * dot;
        }
        if (!g.dsinks.empty()) g.dsinks[size_t(h)] -= sink_prob * dsum;
        double* dq_row = g.dq.data() + row * d;
        for (int j = keys.begin; j < keys.end; ++j) {
          const double prob = x[j];
          double dr = prob * (dp[j] - dsum);
          if (p.softcap > 0) dr *= 1.0 - tanh_r[j] * tanh_r[j];
          const double* k_row = k.data() + k_offset + size_t(j) * d;
          double* dk_row = g.dk.data() + k_offset + size_t(j) * d;
          double* dv_row = g.dv.data() + v_offset + size_t(j) * dv_cols;
          for (size_t e = 0; e < d; ++e) {
            dq_row[e] += scale * dr * k_row[e];
            dk_row[e] += scale * dr * q_row[e];
          }
          for (size_t e = 0; e < dv_cols; ++e) dv_row[e] += prob * dropout_factor(p, row, j) * do_row[e];
        }
      }
    }
  }
  return g;
}

}  // namespace selfattn::reference
