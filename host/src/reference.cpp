// The CPU reference: attention in double precision, one row at a time, written for clarity.
#include "selfattn/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

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

namespace {

void check_problem(const Problem& p, size_t q_size, size_t k_size, size_t v_size) {
  auto fail = [](const std::string& what) { throw InvalidArgument("reference::attention: " + what); };
  if (p.batch < 0 || p.heads < 0 || p.kv_heads < 0 || p.seq_q < 0 || p.seq_k < 0 || p.head_dim < 0) {
    fail("sizes expected >= 0");
  }
  if (p.heads > 0 && (p.kv_heads == 0 || p.heads % p.kv_heads != 0)) {
    fail("kv_heads expected to divide heads " + std::to_string(p.heads) + ", got " + std::to_string(p.kv_heads));
  }
  const size_t q_expected = size_t(p.batch) * p.heads * p.seq_q * p.head_dim;
  const size_t kv_expected = size_t(p.batch) * p.kv_heads * p.seq_k * p.head_dim;
  if (q_size != q_expected) fail("q expected " + std::to_string(q_expected) + " elements, got " + std::to_string(q_size));
  if (k_size != kv_expected) fail("k expected " + std::to_string(kv_expected) + " elements, got " + std::to_string(k_size));
  if (v_size != kv_expected) fail("v expected " + std::to_string(kv_expected) + " elements, got " + std::to_string(v_size));
  if (!p.key_lengths.empty() && p.key_lengths.size() != size_t(p.batch)) {
    fail("key_lengths expected empty or " + std::to_string(p.batch) + " entries, got " +
         std::to_string(p.key_lengths.size()));
  }
}

}  // namespace

Result attention(const Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                 const std::vector<double>& v) {
  check_problem(p, q.size(), k.size(), v.size());
  const double scale = p.scale != 0 ? p.scale : 1.0 / std::sqrt(double(std::max(p.head_dim, 1)));
  const int group = p.kv_heads > 0 ? p.heads / p.kv_heads : 1;  // query heads per kv head
  const size_t d = size_t(p.head_dim);

  Result result;
  result.out.assign(size_t(p.batch) * p.heads * p.seq_q * d, 0.0);
  result.lse.assign(size_t(p.batch) * p.heads * p.seq_q, -std::numeric_limits<double>::infinity());
  std::vector<double> scores(size_t(p.seq_k));

  for (int b = 0; b < p.batch; ++b) {
    const int len_k = p.key_lengths.empty() ? p.seq_k : std::clamp(int(p.key_lengths[b]), 0, p.seq_k);
    for (int h = 0; h < p.heads; ++h) {
      const int kv_h = h / group;
      const double* k_head = k.data() + (size_t(b) * p.kv_heads + kv_h) * p.seq_k * d;
      const double* v_head = v.data() + (size_t(b) * p.kv_heads + kv_h) * p.seq_k * d;
      for (int i = 0; i < p.seq_q; ++i) {
        const size_t row = (size_t(b) * p.heads + h) * p.seq_q + i;
        const double* q_row = q.data() + row * d;
        const int n = visible_keys(i, p.seq_q, len_k, p.causal);
        if (n == 0) continue;  // a row that sees no key: output 0, LSE -inf (already there)

        double max_score = -std::numeric_limits<double>::infinity();
        for (int j = 0; j < n; ++j) {
          double dot = 0;
          for (size_t e = 0; e < d; ++e) dot += q_row[e] * k_head[size_t(j) * d + e];
          scores[j] = scale * dot;
          max_score = std::max(max_score, scores[j]);
        }
        // Subtracting the row maximum keeps exp() in range; it cancels in the normalisation.
        double sum = 0;
        for (int j = 0; j < n; ++j) {
          scores[j] = std::exp(scores[j] - max_score);
          sum += scores[j];
        }
        double* out_row = result.out.data() + row * d;
        for (int j = 0; j < n; ++j) {
          const double weight = scores[j] / sum;
          for (size_t e = 0; e < d; ++e) out_row[e] += weight * v_head[size_t(j) * d + e];
        }
        result.lse[row] = max_score + std::log(sum);
      }
    }
  }
  return result;
}

}  // namespace selfattn::reference
