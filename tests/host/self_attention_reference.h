#pragma once
// self_attention()'s whole pipeline in double precision, for the host tests: random inputs already
// representable in the dtype, the projections Q, K, V, attention per head (selfattn::reference),
// the optional output projection. Each intermediate the library stores (Q, K, V, and the attention
// output before W^O) is rounded to the dtype, so a comparison measures the computation, not the
// storage format.
#include <random>
#include <string>
#include <vector>

#include "selfattn/selfattn.h"

namespace selfattn::host_test {

struct SelfAttentionCase {
  DType dtype = DType::f32;
  int batch = 1, seq = 1, d_model = 1, heads = 1, kv_heads = 1, head_dim = 1;
  int d_out = 0;  // 0: no W^O
  Causal causal = Causal::none;
  std::string name() const;
};

struct SelfAttentionProblem {
  std::vector<double> x, wq, wk, wv, wo;  // row-major, as self_attention() takes them
  std::vector<double> out;  // expected: [batch, heads, seq, head_dim], or [batch, 1, seq, d_out] with W^O
  std::vector<double> lse;  // expected: [batch, heads, seq]
};

SelfAttentionProblem make_self_attention_problem(const SelfAttentionCase& c, std::mt19937& rng);

// Tolerated ||out - expected|| / ||expected||: the projections add rounding the attention tests do not see.
double self_attention_tolerance(DType dtype);

// `values` (representable in dtype) stored as dtype elements in a new device buffer.
DeviceBuffer<unsigned char> upload(Context& ctx, const std::vector<double>& values, DType dtype);

}  // namespace selfattn::host_test
