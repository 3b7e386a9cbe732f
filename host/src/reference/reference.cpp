// The CPU reference: attention in double precision, one row at a time, written for clarity.
#include "selfattn/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include "kernels/common/dropout.cuh"
#include "selfattn/error.h"

namespace selfattn::reference {

int visible_keys(int row, int seq_q, int len_k, Causal causal) {
  switch (causal) {
    case Causal::none: return len_k;
    case Causal::top_left: return std::clamp(row + 1, 0, len_k);
    case Causal::bottom_right: return std::clamp(row + 1 + (len_k - seq_q), 0, len_k);
  }
  return len_k;
}

int aligned_row(int row, int seq_q, int len_k, Causal causal) {
  return causal == Causal::top_left ? row : row + (len_k - seq_q);
}

double alibi_slope(const Problem& p, int batch, int head) {
  if (p.alibi_slopes.empty()) return 0.0;
  return p.alibi_slopes[p.alibi_slopes.size() == size_t(p.heads) ? size_t(head) : size_t(batch) * p.heads + head];
}

double limit_score(double score) {
  if (score <= -kScoreLimit) return -std::numeric_limits<double>::infinity();
  return score > kScoreLimit ? kScoreLimit : score;
}

double sink_logit(const Problem& p, int head) {
  return p.sinks.empty() ? -std::numeric_limits<double>::infinity() : p.sinks[size_t(head)];
}

KeyRange visible_key_range(int row, int seq_q, int len_k, Causal causal, int window_left, int window_right) {
  const int64_t i = aligned_row(row, seq_q, len_k, causal);
  int64_t end = visible_keys(row, seq_q, len_k, causal);
  int64_t begin = 0;
  if (window_right >= 0) end = std::min(end, i + window_right + 1);
  if (window_left >= 0) begin = std::max<int64_t>(0, i - window_left);
  end = std::max<int64_t>(end, 0);
  begin = std::min(begin, end);
  return {int(begin), int(end)};
}

RowKeys row_keys(const Problem& p, int batch, int row) {
  const int length = p.key_lengths.empty() ? p.seq_k : std::clamp(int(p.key_lengths[batch]), 0, p.seq_k);
  if (p.key_start.empty() && p.q_offset.empty()) {
    return {visible_key_range(row, p.seq_q, length, p.causal, p.window_left, p.window_right),
            aligned_row(row, p.seq_q, length, p.causal)};
  }
  const int64_t start = p.key_start.empty() ? 0 : std::clamp(int64_t(p.key_start[batch]), int64_t(0), int64_t(length));
  int64_t aligned;
  if (!p.q_offset.empty()) {
    aligned = start + std::clamp(int64_t(p.q_offset[batch]), int64_t(0), int64_t(2147418112)) + row;
  } else {
    aligned = p.causal == Causal::top_left ? start + row : int64_t(length) - p.seq_q + row;
  }
  int64_t begin = start, end = length;
  if (p.causal != Causal::none) end = std::min(end, aligned + 1);
  if (p.window_right >= 0) end = std::min(end, aligned + p.window_right + 1);
  if (p.window_left >= 0) begin = std::max(begin, aligned - p.window_left);
  end = std::max(end, start);
  begin = std::min(begin, end);
  return {{int(begin), int(end)}, aligned};
}

double dropout_factor(const Problem& p, size_t row, int key) {
  if (p.dropout_keep.empty()) return 1.0;
  return p.dropout_keep[row * size_t(p.seq_k) + size_t(key)] != 0 ? 1.0 / (1.0 - p.dropout_p) : 0.0;
}

std::vector<uint8_t> dropout_keep_mask(double dropout_p, uint64_t seed, uint64_t offset, int batch, int heads,
                                       int seq_q, int seq_k, int first_batch) {
  std::vector<uint8_t> keep(size_t(batch) * heads * seq_q * seq_k, 1);
  const uint32_t threshold = kernels::dropout_threshold(dropout_p);
  if (threshold == 0) return keep;
  size_t at = 0;
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < heads; ++h) {
      const uint32_t stream = kernels::dropout_stream(first_batch + b, heads, h);
      for (int i = 0; i < seq_q; ++i)
        for (int j = 0; j < seq_k; ++j) keep[at++] = kernels::dropout_keep(seed, offset, threshold, stream, i, j);
    }
  return keep;
}

namespace {

// v_size: none where v is not an input (attention_probabilities).
void check_problem(const Problem& p, size_t q_size, size_t k_size, std::optional<size_t> v_size) {
  auto fail = [](const std::string& what) { throw InvalidArgument("reference::attention: " + what); };
  if (p.batch < 0 || p.heads < 0 || p.kv_heads < 0 || p.seq_q < 0 || p.seq_k < 0 || p.head_dim < 0 ||
      p.head_dim_v < 0) {
    fail("sizes expected >= 0");
  }
  if (p.heads > 0 && (p.kv_heads == 0 || p.heads % p.kv_heads != 0)) {
    fail("kv_heads expected to divide heads " + std::to_string(p.heads) + ", got " + std::to_string(p.kv_heads));
  }
  const size_t q_expected = size_t(p.batch) * p.heads * p.seq_q * p.head_dim;
  const size_t k_expected = size_t(p.batch) * p.kv_heads * p.seq_k * p.head_dim;
  const size_t v_expected = size_t(p.batch) * p.kv_heads * p.seq_k * p.v_dim();
  if (q_size != q_expected) fail("q expected " + std::to_string(q_expected) + " elements, got " + std::to_string(q_size));
  if (k_size != k_expected) fail("k expected " + std::to_string(k_expected) + " elements, got " + std::to_string(k_size));
  if (v_size && *v_size != v_expected) {
    fail("v expected " + std::to_string(v_expected) + " elements, got " + std::to_string(*v_size));
  }
  if (!p.key_lengths.empty() && p.key_lengths.size() != size_t(p.batch)) {
    fail("key_lengths expected empty or " + std::to_string(p.batch) + " entries, got " +
         std::to_string(p.key_lengths.size()));
  }
  if (p.window_left < -1 || p.window_right < -1) fail("window sides expected -1 or >= 0");
  if (!(p.softcap >= 0) || !std::isfinite(p.softcap)) fail("softcap expected 0 (none) or a finite number > 0");
  const size_t heads = size_t(p.heads), pairs = size_t(p.batch) * p.heads;
  if (!p.alibi_slopes.empty() && p.alibi_slopes.size() != heads && p.alibi_slopes.size() != pairs) {
    fail("alibi_slopes expected empty, " + std::to_string(heads) + " or " + std::to_string(pairs) + " entries, got " +
         std::to_string(p.alibi_slopes.size()));
  }
  if (!p.sinks.empty() && p.sinks.size() != heads) {
    fail("sinks expected empty or " + std::to_string(heads) + " entries, got " + std::to_string(p.sinks.size()));
  }
  for (const double sink : p.sinks) {
    if (std::isnan(sink) || sink == std::numeric_limits<double>::infinity()) fail("sinks expected finite or -inf");
  }
  const size_t bias_expected = pairs * p.seq_q * p.seq_k;
  if (!p.bias.empty() && p.bias.size() != bias_expected) {
    fail("bias expected empty or " + std::to_string(bias_expected) + " entries, got " + std::to_string(p.bias.size()));
  }
  if (!(p.dropout_p >= 0 && p.dropout_p < 1)) fail("dropout_p expected a number in [0, 1)");
  if (!p.dropout_keep.empty() && p.dropout_keep.size() != bias_expected) {
    fail("dropout_keep expected empty or " + std::to_string(bias_expected) + " entries, got " +
         std::to_string(p.dropout_keep.size()));
  }
}

}  // namespace

namespace {

// The softmax of every row (attention.h's rule: the masks, the modifiers, the sink; before
// dropout): visit(row, b, h, keys, weights, lse) for each row that sees a key or has a sink, with
// row the flat [batch, heads, seq_q] index and weights[j] the weight of key j for j in keys. Rows
// with neither are not visited (they give 0 and LSE -inf).
template <class Visit>
void for_each_softmax_row(const Problem& p, const std::vector<double>& q, const std::vector<double>& k, Visit visit) {
  const double scale = p.scale != 0 ? p.scale : 1.0 / std::sqrt(double(std::max(p.head_dim, 1)));
  const int group = p.kv_heads > 0 ? p.heads / p.kv_heads : 1;  // query heads per kv head
  const size_t d = size_t(p.head_dim);
  std::vector<double> scores(size_t(p.seq_k));
  for (int b = 0; b < p.batch; ++b) {
    for (int h = 0; h < p.heads; ++h) {
      const int kv_h = h / group;
      const double* k_head = k.data() + (size_t(b) * p.kv_heads + kv_h) * p.seq_k * d;
      const double slope = alibi_slope(p, b, h);
      for (int i = 0; i < p.seq_q; ++i) {
        const size_t row = (size_t(b) * p.heads + h) * p.seq_q + i;
        const double* q_row = q.data() + row * d;
        const RowKeys row_keys_i = row_keys(p, b, i);
        const KeyRange keys = row_keys_i.keys;
        const double aligned = double(row_keys_i.aligned);

        // The scores of the visible keys, after the modifiers (attention.h): softcap, ALiBi, bias.
        double max_score = -std::numeric_limits<double>::infinity();
        for (int j = keys.begin; j < keys.end; ++j) {
          double dot = 0;
          for (size_t e = 0; e < d; ++e) dot += q_row[e] * k_head[size_t(j) * d + e];
          double s = scale * dot;
          if (p.softcap > 0) s = p.softcap * std::tanh(s / p.softcap);
          s -= slope * std::abs(aligned - double(j));
          if (!p.bias.empty()) s += p.bias[row * p.seq_k + j];
          scores[j] = s = limit_score(s);
          max_score = std::max(max_score, s);
        }
        // The sink joins the softmax as one more score whose value row is 0.
        const double sink = sink_logit(p, h);
        max_score = std::max(max_score, sink);
        // No key (or only keys the bias masks) and no sink: output 0, LSE -inf.
        if (max_score == -std::numeric_limits<double>::infinity()) continue;
        // Subtracting the row maximum keeps exp() in range; it cancels in the normalisation.
        double sum = std::exp(sink - max_score);
        for (int j = keys.begin; j < keys.end; ++j) {
          scores[j] = std::exp(scores[j] - max_score);
          sum += scores[j];
        }
        for (int j = keys.begin; j < keys.end; ++j) scores[j] /= sum;
        visit(row, b, h, keys, scores, max_score + std::log(sum));
      }
    }
  }
}

}  // namespace

Result attention(const Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                 const std::vector<double>& v) {
  check_problem(p, q.size(), k.size(), v.size());
  const int group = p.kv_heads > 0 ? p.heads / p.kv_heads : 1;
  const size_t d = size_t(p.v_dim());  // the output's columns: v's head dim
  Result result;
  result.out.assign(size_t(p.batch) * p.heads * p.seq_q * d, 0.0);
  result.lse.assign(size_t(p.batch) * p.heads * p.seq_q, -std::numeric_limits<double>::infinity());
  for_each_softmax_row(p, q, k, [&](size_t row, int b, int h, KeyRange keys, const std::vector<double>& weights,
                                    double lse) {
    const double* v_head = v.data() + (size_t(b) * p.kv_heads + h / group) * p.seq_k * d;
    double* out_row = result.out.data() + row * d;
    for (int j = keys.begin; j < keys.end; ++j) {
      const double weight = weights[j] * dropout_factor(p, row, j);
      for (size_t e = 0; e < d; ++e) out_row[e] += weight * v_head[size_t(j) * d + e];
    }
    result.lse[row] = lse;
  });
  return result;
}

std::vector<double> attention_probabilities(const Problem& p, const std::vector<double>& q,
                                            const std::vector<double>& k) {
  check_problem(p, q.size(), k.size(), /*v_size=*/std::nullopt);
  std::vector<double> probs(size_t(p.batch) * p.heads * p.seq_q * p.seq_k, 0.0);
  for_each_softmax_row(p, q, k, [&](size_t row, int, int, KeyRange keys, const std::vector<double>& weights, double) {
    for (int j = keys.begin; j < keys.end; ++j) probs[row * p.seq_k + j] = weights[j];
  });
  return probs;
}

}  // namespace selfattn::reference

// ---- KV cache semantics ----------------------------------------------------------------------
namespace selfattn::reference {

int KvCacheImage::length(int b) const { return std::clamp(int(lengths[size_t(b)]), 0, capacity()); }

int KvCacheImage::page_of(int b, int t) const {
  if (t < 0 || t >= capacity()) return -1;
  if (block_table.empty()) {
    const int row = batch_index.empty() ? b : batch_index[size_t(b)];
    return row >= 0 && row < num_pages ? row : -1;
  }
  const int page = block_table[size_t(b) * max_pages_per_seq + size_t(t / page_size)];
  return page >= 0 && page < num_pages ? page : -1;
}

size_t KvCacheImage::offset(int page, int head, int t) const {
  return ((size_t(page) * kv_heads + head) * page_size + size_t(t % page_size)) * head_dim;
}
size_t KvCacheImage::v_offset(int page, int head, int t) const {
  return ((size_t(page) * kv_heads + head) * page_size + size_t(t % page_size)) * v_dim();
}

void rotate_row(double* whole_row, int head_dim, int position, const RotaryTable& rotary) {
  if (rotary.rotary_dim % 2 != 0 || rotary.first_dim < 0 || rotary.first_dim + rotary.rotary_dim > head_dim ||
      rotary.max_position < 1) {
    throw InvalidArgument("reference::rotate_row: rotary_dim expected even and first_dim + rotary_dim <= head_dim " +
                          std::to_string(head_dim) + " with max_position >= 1, got rotary_dim " +
                          std::to_string(rotary.rotary_dim) + ", first_dim " + std::to_string(rotary.first_dim) +
                          ", max_position " + std::to_string(rotary.max_position));
  }
  double* row = whole_row + rotary.first_dim;  // pairs count from first_dim
  const int half = rotary.rotary_dim / 2;
  const int table_row = std::clamp(position, 0, rotary.max_position - 1);
  for (int pair = 0; pair < half; ++pair) {
    const int a = rotary.interleaved ? 2 * pair : pair;
    const int b = rotary.interleaved ? 2 * pair + 1 : pair + half;
    const double c = rotary.cos[size_t(table_row) * half + pair], s = rotary.sin[size_t(table_row) * half + pair];
    const double x = row[a], y = row[b];
    row[a] = x * c - y * s;
    row[b] = x * s + y * c;
  }
}

namespace {

// The formats' constants: mantissa bits, exponent bias, largest finite value.
struct Fp8Format {
  int mantissa_bits, bias;
  double max_finite;
};
Fp8Format fp8_format(DType format) {
  if (format == DType::e5m2) return {2, 15, 57344.0};
  return {3, 7, 448.0};
}

}  // namespace

double fp8_value(DType format, uint8_t bits) {
  const Fp8Format f = fp8_format(format);
  const int exponent_bits = 7 - f.mantissa_bits;
  const int exponent = (bits >> f.mantissa_bits) & ((1 << exponent_bits) - 1);
  const int mantissa = bits & ((1 << f.mantissa_bits) - 1);
  const double sign = (bits & 0x80) ? -1.0 : 1.0;
  const int top = (1 << exponent_bits) - 1;
  if (format == DType::e4m3 && exponent == top && mantissa == (1 << f.mantissa_bits) - 1) {
    return std::numeric_limits<double>::quiet_NaN();
  }
  if (format == DType::e5m2 && exponent == top) {
    return mantissa == 0 ? sign * std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  }
  if (exponent == 0) return sign * std::ldexp(double(mantissa), 1 - f.bias - f.mantissa_bits);  // subnormal
  return sign * std::ldexp(double((1 << f.mantissa_bits) + mantissa), exponent - f.bias - f.mantissa_bits);
}

uint8_t fp8_code(DType format, double x) {
  const Fp8Format f = fp8_format(format);
  if (std::isnan(x)) return 0x7f;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  double a = std::min(std::abs(x), f.max_finite);  // saturation (infinities too)
  const int min_exponent = 1 - f.bias;             // of the normal numbers; subnormals share its quantum
  int exponent = a > 0 ? std::ilogb(a) : min_exponent;
  if (exponent < min_exponent) exponent = min_exponent;
  const double quantum = std::ldexp(1.0, exponent - f.mantissa_bits);
  // a / quantum is exact (a power of two); rounding half to even in integers.
  const double scaled = a / quantum, low = std::floor(scaled), fraction = scaled - low;
  double units = low;
  if (fraction > 0.5 || (fraction == 0.5 && std::fmod(low, 2.0) != 0.0)) units = low + 1;
  a = std::min(units * quantum, f.max_finite);  // rounding up past the largest finite value saturates
  if (a == 0) return sign;
  int e = std::ilogb(a);
  if (e < min_exponent) {  // subnormal: exponent field 0
    return uint8_t(sign | int(a / std::ldexp(1.0, min_exponent - f.mantissa_bits)));
  }
  const int mantissa = int(a / std::ldexp(1.0, e - f.mantissa_bits)) - (1 << f.mantissa_bits);
  return uint8_t(sign | ((e + f.bias) << f.mantissa_bits) | mantissa);
}

double fp8_round(DType format, double x) { return fp8_value(format, fp8_code(format, x)); }

void append_kv(KvCacheImage& cache, const std::vector<double>& k_new, const std::vector<double>& v_new, int seq_new,
               const RotaryTable* rotary, const KvQuantization* fp8) {
  // What the library stores for x with `scale`: fp32 quotient, FP8 code, image value code x scale.
  const auto quantized = [&](double x, double scale) {
    const float quotient = float(x) / float(scale);
    return fp8_value(fp8->format, fp8_code(fp8->format, quotient)) * scale;
  };
  const size_t d = size_t(cache.head_dim), dv = size_t(cache.v_dim());
  std::vector<double> row(d);
  for (int b = 0; b < cache.batch; ++b) {
    const int start = cache.length(b);
    for (int h = 0; h < cache.kv_heads; ++h) {
      for (int t = 0; t < seq_new; ++t) {
        const int page = cache.page_of(b, start + t);
        if (page < 0) continue;  // past the capacity or a page outside the pool: dropped
        const size_t token = (size_t(b) * cache.kv_heads + h) * seq_new + t;
        std::copy(k_new.begin() + long(token * d), k_new.begin() + long(token * d + d), row.begin());
        if (rotary) rotate_row(row.data(), cache.head_dim, int(rotary->position(b, start, t)), *rotary);
        const size_t target = cache.offset(page, h, start + t), v_target = cache.v_offset(page, h, start + t);
        std::copy(row.begin(), row.end(), cache.k.begin() + long(target));
        std::copy(v_new.begin() + long(token * dv), v_new.begin() + long(token * dv + dv),
                  cache.v.begin() + long(v_target));
        if (fp8) {
          for (size_t e = 0; e < d; ++e) cache.k[target + e] = quantized(cache.k[target + e], fp8->k_scale[size_t(h)]);
          for (size_t e = 0; e < dv; ++e)
            cache.v[v_target + e] = quantized(cache.v[v_target + e], fp8->v_scale[size_t(h)]);
        }
      }
    }
  }
}

void gather_kv(const KvCacheImage& cache, int b, std::vector<double>& k, std::vector<double>& v) {
  const int length = cache.length(b);
  const size_t d = size_t(cache.head_dim), dv = size_t(cache.v_dim());
  k.assign(size_t(cache.kv_heads) * length * d, 0.0);
  v.assign(size_t(cache.kv_heads) * length * dv, 0.0);
  for (int h = 0; h < cache.kv_heads; ++h) {
    for (int t = 0; t < length; ++t) {
      const int page = cache.page_of(b, t);
      if (page < 0) continue;
      const size_t source = cache.offset(page, h, t), v_source = cache.v_offset(page, h, t);
      const size_t row = size_t(h) * length + t;
      std::copy(cache.k.begin() + long(source), cache.k.begin() + long(source + d), k.begin() + long(row * d));
      std::copy(cache.v.begin() + long(v_source), cache.v.begin() + long(v_source + dv), v.begin() + long(row * dv));
    }
  }
}

Problem kv_sequence_problem(const Problem& problem, int b, int length) {
  Problem one = problem;
  one.batch = 1;
  one.seq_k = length;
  one.key_lengths.clear();
  if (!problem.key_start.empty()) one.key_start = {problem.key_start[size_t(b)]};
  if (!problem.q_offset.empty()) one.q_offset = {problem.q_offset[size_t(b)]};
  const size_t heads = size_t(problem.heads);
  if (problem.alibi_slopes.size() == size_t(problem.batch) * heads && problem.batch > 1) {
    one.alibi_slopes.assign(problem.alibi_slopes.begin() + long(b * heads), problem.alibi_slopes.begin() + long((b + 1) * heads));
  }
  if (!problem.bias.empty()) {
    const size_t rows = heads * size_t(problem.seq_q), capacity = size_t(problem.seq_k);
    if (problem.bias.size() != size_t(problem.batch) * rows * capacity || size_t(length) > capacity) {
      throw InvalidArgument("reference::kv_sequence_problem: bias expected [batch, heads, seq_q, seq_k = capacity] with "
                            "every length <= seq_k");
    }
    one.bias.resize(rows * size_t(length));
    for (size_t row = 0; row < rows; ++row) {
      const auto from = problem.bias.begin() + long((size_t(b) * rows + row) * capacity);
      std::copy(from, from + length, one.bias.begin() + long(row * size_t(length)));
    }
  }
  return one;
}

Result attention_with_kv_cache(const Problem& problem, const std::vector<double>& q, const KvCacheImage& cache,
                               const RotaryTable* rotary) {
  const size_t d = size_t(problem.head_dim), dv = size_t(cache.v_dim());
  const size_t rows_per_sequence = size_t(problem.heads) * problem.seq_q;
  Result result;
  result.out.assign(size_t(problem.batch) * rows_per_sequence * dv, 0.0);
  result.lse.assign(size_t(problem.batch) * rows_per_sequence, 0.0);
  for (int b = 0; b < problem.batch; ++b) {
    Problem one = kv_sequence_problem(problem, b, cache.length(b));
    one.head_dim_v = int(dv);
    std::vector<double> q_b(q.begin() + long(b * rows_per_sequence * d), q.begin() + long((b + 1) * rows_per_sequence * d));
    if (rotary) {
      for (size_t row = 0; row < rows_per_sequence; ++row) {
        const int i = int(row % size_t(problem.seq_q));
        rotate_row(q_b.data() + row * d, problem.head_dim,
                   int(rotary->position(b, int64_t(cache.lengths[size_t(b)]) - problem.seq_q, i)), *rotary);
      }
    }
    std::vector<double> k, v;
    gather_kv(cache, b, k, v);
    const Result part = attention(one, q_b, k, v);
    std::copy(part.out.begin(), part.out.end(), result.out.begin() + long(b * rows_per_sequence * dv));
    std::copy(part.lse.begin(), part.lse.end(), result.lse.begin() + long(b * rows_per_sequence));
  }
  return result;
}

Result merge_states(const Result& a, const Result& b, int head_dim) {
  if (a.out.size() != b.out.size() || a.lse.size() != b.lse.size() || a.out.size() != a.lse.size() * size_t(head_dim)) {
    throw InvalidArgument("reference::merge_states: a and b expected the same shape with head_dim " +
                          std::to_string(head_dim) + " values per LSE row");
  }
  Result merged;
  merged.out.assign(a.out.size(), 0.0);
  merged.lse.assign(a.lse.size(), -std::numeric_limits<double>::infinity());
  const size_t d = size_t(head_dim);
  for (size_t row = 0; row < a.lse.size(); ++row) {
    const double m = std::max(a.lse[row], b.lse[row]);
    if (m == -std::numeric_limits<double>::infinity()) continue;
    const double w_a = std::exp(a.lse[row] - m), w_b = std::exp(b.lse[row] - m);
    for (size_t e = 0; e < d; ++e) {
      merged.out[row * d + e] = (w_a * a.out[row * d + e] + w_b * b.out[row * d + e]) / (w_a + w_b);
    }
    merged.lse[row] = m + std::log(w_a + w_b);
  }
  return merged;
}

}  // namespace selfattn::reference
