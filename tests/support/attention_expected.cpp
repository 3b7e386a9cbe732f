#include "attention_expected.h"

#include <algorithm>
#include <cmath>

#include "attention_harness.h"
#include "common/sim_math.h"

namespace selfattn::testing {

namespace {

// fp32 sum of values[0, n) by halves: the error of a tree of partial sums, as a kernel's per-thread
// partials and its reductions make (no kernel adds a whole row's exponentials in one chain; one
// chain of n near-equal positive terms would err by up to n u / 2, far more than any kernel).
float pairwise_sum(const float* values, int n) {
  if (n <= 2) return n == 0 ? 0.0f : n == 1 ? values[0] : values[0] + values[1];
  const int half = n / 2;
  return pairwise_sum(values, half) + pairwise_sum(values + half, n - half);
}

// exp and log as a GPU may compute them: within the error CUDA documents (expf 2 ulp, logf 1 ulp;
// kernels/common/sim_math.h), where glibc's are within half an ulp. Every path is allowed that error
// in its exponentials and logarithms, so the allowed computation makes it too.
float documented_exp(float x) { return sim::math::expf(x); }
float documented_log(float x) { return sim::math::logf(x); }

}  // namespace

AttentionExpected expected_attention(const reference::Problem& p, const std::vector<double>& q,
                                     const std::vector<double>& k, const std::vector<double>& v,
                                     const AttentionArithmetic& arithmetic) {
  const reference::Result exact = reference::attention(p, q, k, v);
  const size_t d = size_t(p.head_dim), dv = size_t(p.v_dim());  // q/k's head dim, v/out's
  const size_t rows = size_t(p.batch) * p.heads * p.seq_q;
  // The scale as the library holds it: a float.
  const float scale = p.scale != 0 ? float(p.scale) : 1.0f / std::sqrt(float(std::max(p.head_dim, 1)));
  const double u32 = unit_roundoff(DType::f32);
  const int group = p.kv_heads > 0 ? p.heads / p.kv_heads : 1;

  AttentionExpected e;
  e.out.row_length = std::max(p.v_dim(), 1);
  e.out.exact = exact.out;
  e.out.allowed.assign(exact.out.size(), 0.0);
  e.out.scale.assign(exact.out.size(), 0.0);
  e.out.floor.assign(exact.out.size(), 0.0);
  e.lse.exact = exact.lse;
  e.lse.allowed = exact.lse;  // rows without keys keep -inf
  e.lse.scale.assign(rows, 0.0);
  e.lse.floor.assign(rows, 0.0);

  std::vector<float> x(size_t(p.seq_k)), probs(size_t(p.seq_k));
  std::vector<double> magnitude(size_t(p.seq_k));  // a_j = scale * sum_e |q_e k_je|, plus what the modifiers add
  for (int b = 0; b < p.batch; ++b) {
    for (int h = 0; h < p.heads; ++h) {
      const size_t kv = size_t(b) * p.kv_heads + size_t(h / group);
      const double* k_head = k.data() + kv * p.seq_k * d;
      const double* v_head = v.data() + kv * p.seq_k * dv;
      const double slope = reference::alibi_slope(p, b, h);
      const float sink = float(reference::sink_logit(p, h));
      for (int i = 0; i < p.seq_q; ++i) {
        const size_t row = (size_t(b) * p.heads + h) * p.seq_q + i;
        const double* q_row = q.data() + row * d;
        // The keys the mask rule leaves (causal and window), then the score modifiers in fp32 as the
        // kernels apply them (kernels/common/score_mods.cuh): softcap, ALiBi, bias. A key the bias masks
        // (-inf) gets probability 0; a row with no key left is 0 and -inf exactly (scale 0).
        const reference::RowKeys row_keys = reference::row_keys(p, b, i);
        const reference::KeyRange keys = row_keys.keys;
        const int64_t aligned = row_keys.aligned;
        if (!std::isfinite(exact.lse[row])) continue;  // no key, no sink: 0 and -inf exactly

        float max_score = -INFINITY;
        double max_magnitude = 0;
        int n = 0;  // keys with a finite score
        for (int j = keys.begin; j < keys.end; ++j) {
          float dot = 0;
          double abs_dot = 0;
          for (size_t c = 0; c < d; ++c) {
            dot += float(q_row[c]) * float(k_head[j * d + c]);
            abs_dot += std::abs(q_row[c] * k_head[j * d + c]);
          }
          float score = dot * scale;
          double added = 0;  // magnitudes the modifiers add to the score (their own roundings)
          if (p.softcap > 0) {
            const float cap = float(p.softcap);
            score = cap * std::tanh(score / cap);
            added += p.softcap;
          }
          if (slope != 0) {
            const float distance_term = float(slope) * std::abs(float(aligned - j));
            score -= distance_term;
            added += distance_term;
          }
          if (!p.bias.empty()) {
            const double bias = p.bias[row * p.seq_k + j];
            score += float(bias);
            if (std::isfinite(bias)) added += std::abs(bias);
          }
          score = float(reference::limit_score(score));
          x[j] = score;
          magnitude[j] = double(scale) * abs_dot + added;
          if (score == -INFINITY) continue;
          ++n;
          max_score = std::max(max_score, x[j]);
          max_magnitude = std::max(max_magnitude, magnitude[j]);
        }
        if (n == 0) {
          // Only the sink (the exact LSE is finite): out is 0 exactly, the LSE its logit up to
          // the few roundings of the units the kernel keeps it in.
          e.lse.allowed[row] = sink;
          e.lse.scale[row] = std::abs(exact.lse[row]) + 1;
          e.lse.floor[row] = u32 * (std::abs(exact.lse[row]) + 4);
          continue;
        }
        for (int j = keys.begin; j < keys.end; ++j) probs[j] = documented_exp(x[j] - max_score);
        float sum = pairwise_sum(probs.data() + keys.begin, keys.end - keys.begin);
        // A sink ends the row's softmax as softmax_row_end does: the keys' sum shifted to
        // max(max_score, sink), plus the sink's own term (kernels/common/score_mods.cuh).
        float inverse = 1.0f / sum, lse_shift = max_score;
        if (sink != -INFINITY) {
          lse_shift = std::max(max_score, sink);
          const float keys_share = documented_exp(max_score - lse_shift);
          sum = sum * keys_share + documented_exp(sink - lse_shift);
          inverse = keys_share / sum;
        }
        double weighted_magnitude = 0;
        for (int j = keys.begin; j < keys.end; ++j) {
          // FP8 P: the unnormalised probability is what the kernel rounds (the normalised ones of a
          // long row would mostly be subnormal in e4m3).
          if (arithmetic.p_fp8) probs[j] = round_to(*arithmetic.p_fp8, probs[j]);
          probs[j] = sink != -INFINITY ? probs[j] * inverse : probs[j] / sum;
          weighted_magnitude += double(probs[j]) * magnitude[j];
          // Dropout after the softmax (its LSE is the one before): kept ones times the library's
          // float 1 / (1 - p), the others 0 (kernels/common/dropout.cuh).
          probs[j] *= float(reference::dropout_factor(p, row, j));
          if (arithmetic.p_rounded && !arithmetic.p_fp8) probs[j] = round_to(arithmetic.dtype, probs[j]);
        }
        // FP8 P's absolute error below the smallest normal, in normalised units (per key: half the
        // subnormal step of the unnormalised value, over the row's l).
        const double p_fp8_unit = arithmetic.p_fp8 ? unit_roundoff(*arithmetic.p_fp8) : 0.0;
        const double p_fp8_subnormal =
            arithmetic.p_fp8 ? reference::fp8_value(*arithmetic.p_fp8, 1) / 2 * (sink != -INFINITY ? inverse : 1 / sum)
                             : 0.0;
        const double fp32_steps = 4 + std::sqrt(double(n)) + 2 * max_magnitude;

        const float lse = lse_shift + documented_log(sum);
        e.lse.allowed[row] = lse;
        e.lse.scale[row] = std::abs(exact.lse[row]) + weighted_magnitude + 1;
        e.lse.floor[row] = u32 * (std::abs(exact.lse[row]) + fp32_steps);

        for (size_t c = 0; c < dv; ++c) {
          float acc = 0;
          double terms2 = 0, values2 = 0;
          for (int j = keys.begin; j < keys.end; ++j) {
            acc += probs[j] * float(v_head[j * dv + c]);
            const double term = double(probs[j]) * v_head[j * dv + c];
            terms2 += term * term;
            values2 += v_head[j * dv + c] * v_head[j * dv + c];
          }
          const size_t at = row * dv + c;
          e.out.allowed[at] = round_to(arithmetic.dtype, acc);
          e.out.scale[at] = std::abs(exact.out[at]) + std::sqrt(terms2);
          e.out.floor[at] = rounding_floor(arithmetic.dtype, fp32_steps, e.out.scale[at]) +
                            p_fp8_unit * std::sqrt(terms2) + p_fp8_subnormal * std::sqrt(values2);
        }
      }
    }
  }
  return e;
}

}  // namespace selfattn::testing
