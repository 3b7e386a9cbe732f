#pragma once
// self_attention()'s whole pipeline for the host tests: random inputs already representable in the
// dtype, and what out and lse are judged against by the shared rule (judge.h): the pipeline exact in
// double (projections Q, K, V, attention per head by selfattn::reference, the optional output
// projection) and as the library may compute it (each stored intermediate rounded to the dtype).
#include <random>
#include <string>
#include <vector>

#include "judge.h"
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
  testing::Expected out;  // [batch, heads, seq, head_dim], or [batch, 1, seq, d_out] with W^O
  testing::Expected lse;  // [batch, heads, seq]
};

SelfAttentionProblem make_self_attention_problem(const SelfAttentionCase& c, std::mt19937& rng);

// `values` (representable in dtype) stored as dtype elements in a new device buffer.
DeviceBuffer<unsigned char> upload(Context& ctx, const std::vector<double>& values, DType dtype);

}  // namespace selfattn::host_test
