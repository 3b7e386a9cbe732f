#pragma once
// CPU reference in double precision, with exactly the semantics of attention() (every option).
// Host memory; inputs given as double, row-major with the same [batch, heads, seq, head_dim] shape
// convention (contiguous BHSD). Used by the tests and by the benchmark's --check.
#include <cstdint>
#include <vector>

#include "selfattn/types.h"

namespace selfattn::reference {

struct Problem {
  int batch = 1, heads = 1, kv_heads = 1, seq_q = 1, seq_k = 1, head_dim = 1;
  Causal causal = Causal::none;
  double scale = 0;                  // 0: 1/sqrt(head_dim)
  std::vector<int32_t> key_lengths;  // empty, or [batch]
};

struct Result {
  std::vector<double> out;  // [batch, heads, seq_q, head_dim]
  std::vector<double> lse;  // [batch, heads, seq_q]
};

// q: [batch, heads, seq_q, head_dim]; k, v: [batch, kv_heads, seq_k, head_dim] (contiguous).
Result attention(const Problem& problem, const std::vector<double>& q, const std::vector<double>& k,
                 const std::vector<double>& v);

// Number of keys (a prefix [0, n)) that query `row` sees: the mask in one place.
int visible_keys(int row, int seq_q, int len_k, Causal causal);

}  // namespace selfattn::reference
