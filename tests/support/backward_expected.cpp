#include "backward_expected.h"

#include <algorithm>
#include <cmath>

#include "attention_harness.h"

namespace selfattn::testing {

BackwardExpected expected_backward(const reference::Problem& p, const std::vector<double>& q,
                                   const std::vector<double>& k, const std::vector<double>& v,
                                   const std::vector<double>& dout, const std::vector<double>& out,
                                   const std::vector<double>& lse, const BackwardArithmetic& arithmetic,
                                   const std::vector<double>& dlse) {
  const reference::Gradients exact = reference::attention_backward(p, q, k, v, dout, dlse);
  const size_t d = size_t(p.head_dim), dv_dim = size_t(p.v_dim());  // q/k/dq/dk rows; v/out/dout/dv rows
  const float scale = p.scale != 0 ? float(p.scale) : 1.0f / std::sqrt(float(std::max(p.head_dim, 1)));
  const int group = p.heads / p.kv_heads;
  const auto rounded = [&](float x) { return arithmetic.rounded ? round_to(arithmetic.dtype, x) : x; };

  // fp32 accumulators and the sums behind scales and floors.
  std::vector<float> dq(q.size(), 0.0f), dk(k.size(), 0.0f), dv(v.size(), 0.0f);
  std::vector<double> dq_terms2(q.size(), 0.0), dk_terms2(k.size(), 0.0), dv_terms2(v.size(), 0.0);
  std::vector<double> q_steps(q.size() / std::max<size_t>(d, 1), 0.0), kv_terms(k.size() / std::max<size_t>(d, 1), 0.0),
      kv_magnitude(kv_terms.size(), 0.0);
  std::vector<float> x(size_t(p.seq_k)), t(size_t(p.seq_k));
  std::vector<double> a(size_t(p.seq_k));

  for (int b = 0; b < p.batch; ++b) {
    for (int h = 0; h < p.heads; ++h) {
      const size_t kv_row0 = (size_t(b) * p.kv_heads + h / group) * p.seq_k;
      const double slope = reference::alibi_slope(p, b, h);
      for (int i = 0; i < p.seq_q; ++i) {
        const size_t row = (size_t(b) * p.heads + h) * p.seq_q + i;
        if (!std::isfinite(lse[row])) continue;  // no key: the kernels write 0
        const reference::RowKeys row_keys = reference::row_keys(p, b, i);
        const reference::KeyRange keys = row_keys.keys;
        const int64_t aligned = row_keys.aligned;
        const double* q_row = &q[row * d];
        const double* do_row = &dout[row * dv_dim];
        float D = 0;
        double D_magnitude = 0;
        for (size_t c = 0; c < dv_dim; ++c) {
          D += float(do_row[c]) * float(out[row * dv_dim + c]);
          D_magnitude += std::abs(do_row[c] * out[row * dv_dim + c]);
        }
        if (!dlse.empty()) {  // what backward_dot does: D_i - dlse_i, one more fp32 rounding
          D -= float(dlse[row]);
          D_magnitude += std::abs(dlse[row]);
        }
        double max_a = 0;
        int n = 0;
        for (int j = keys.begin; j < keys.end; ++j) {
          const double* k_row = &k[(kv_row0 + j) * d];
          float dot = 0;
          double abs_dot = 0;
          for (size_t c = 0; c < d; ++c) {
            dot += float(q_row[c]) * float(k_row[c]);
            abs_dot += std::abs(q_row[c] * k_row[c]);
          }
          float s = dot * scale;
          t[j] = 0;
          double added = 0;
          if (p.softcap > 0) {
            const float cap = float(p.softcap);
            t[j] = std::tanh(s / cap);
            s = cap * t[j];
            added += p.softcap;
          }
          if (slope != 0) {
            const float distance = float(slope) * std::abs(float(aligned - j));
            s -= distance;
            added += distance;
          }
          if (!p.bias.empty()) {
            const double bias = p.bias[row * p.seq_k + j];
            s += float(bias);
            if (std::isfinite(bias)) added += std::abs(bias);
          }
          s = float(reference::limit_score(s));
          x[j] = s;
          a[j] = double(scale) * abs_dot + added;
          if (s != -INFINITY) {
            ++n;
            max_a = std::max(max_a, a[j]);
          }
        }
        q_steps[row] = 4 + std::sqrt(double(n)) + 2 * max_a;
        for (int j = keys.begin; j < keys.end; ++j) {
          if (x[j] == -INFINITY) continue;
          const size_t key_row = kv_row0 + j;
          const double* k_row = &k[key_row * d];
          const double* v_row = &v[key_row * dv_dim];
          const float prob = std::exp(x[j] - float(lse[row]));
          float dp = 0;
          double dp_magnitude = 0;
          for (size_t c = 0; c < dv_dim; ++c) {
            dp += float(do_row[c]) * float(v_row[c]);
            dp_magnitude += std::abs(do_row[c] * v_row[c]);
          }
          // Dropout: dV takes the forward's dropped P, dP goes through the same mask and scale.
          const float dropout = float(reference::dropout_factor(p, row, j));
          dp *= dropout;
          dp_magnitude *= dropout;
          const float dropped_prob = prob * dropout;
          float ds = prob * (dp - D);
          if (p.softcap > 0) ds *= 1.0f - t[j] * t[j];
          const float p_in = rounded(dropped_prob), ds_in = rounded(ds * scale);
          const double m = double(scale) * double(prob) * (dp_magnitude + D_magnitude);
          kv_terms[key_row] += 1;
          kv_magnitude[key_row] = std::max(kv_magnitude[key_row], a[j]);
          for (size_t c = 0; c < d; ++c) {
            dq[row * d + c] += ds_in * float(k_row[c]);
            dk[key_row * d + c] += ds_in * float(q_row[c]);
            dq_terms2[row * d + c] += (m * k_row[c]) * (m * k_row[c]);
            dk_terms2[key_row * d + c] += (m * q_row[c]) * (m * q_row[c]);
          }
          for (size_t c = 0; c < dv_dim; ++c) {
            dv[key_row * dv_dim + c] += p_in * float(do_row[c]);
            dv_terms2[key_row * dv_dim + c] +=
                (double(dropped_prob) * do_row[c]) * (double(dropped_prob) * do_row[c]);
          }
        }
      }
    }
  }

  BackwardExpected e;
  const auto fill = [&](Expected& x_out, const std::vector<double>& exact_values, const std::vector<float>& allowed,
                        const std::vector<double>& terms2, size_t cols, const auto& steps_of) {
    x_out.row_length = int(cols);
    x_out.exact = exact_values;
    x_out.allowed.resize(allowed.size());
    x_out.scale.resize(allowed.size());
    x_out.floor.resize(allowed.size());
    for (size_t i = 0; i < allowed.size(); ++i) {
      x_out.allowed[i] = round_to(arithmetic.grad_dtype, allowed[i]);
      x_out.scale[i] = std::abs(exact_values[i]) + std::sqrt(terms2[i]);
      x_out.floor[i] = rounding_floor(arithmetic.grad_dtype, steps_of(i / cols), x_out.scale[i]);
    }
  };
  fill(e.dq, exact.dq, dq, dq_terms2, d, [&](size_t row) { return q_steps[row]; });
  const auto kv_steps = [&](size_t key_row) {
    return 4 + std::sqrt(kv_terms[key_row]) + 2 * kv_magnitude[key_row];
  };
  fill(e.dk, exact.dk, dk, dk_terms2, d, kv_steps);
  fill(e.dv, exact.dv, dv, dv_terms2, dv_dim, kv_steps);
  return e;
}

}  // namespace selfattn::testing
