#pragma once
// What the sim math tests share (test_sim_math_bounds.cpp, test_sim_math_special_values.cpp): a
// kernel that evaluates one of the sim's CUDA math functions (kernels/common/sim_math.h) over
// arrays of inputs, its launch, and comparing floats bit for bit.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/compat.h"
#include "sim_test_launch.h"

// The kernel lives in the library kernels' namespace, so that its unqualified calls (expf(x))
// resolve exactly as the library's do.
SELFATTN_KERNELS_BEGIN
namespace sim_math_test {

enum class Function {
  expf, exp2f, exp10f, expm1f, logf, log2f, log10f, log1pf, sinf, cosf, sincosf, tanf, tanhf, powf, rsqrtf,
  fast_expf, fast_exp10f, fast_logf, fast_log2f, fast_log10f, fast_sinf, fast_cosf, fast_sincosf, fast_tanf,
  fast_powf, fast_tanhf, fast_fdividef,
};

struct EvaluateParams {
  Function function;
  const float* x;
  const float* y;  // the second argument of powf, __powf, __fdividef
  float* out;
  float* out2;  // the cosine of sincosf, __sincosf
  int n;
};

inline __global__ void evaluate(const EvaluateParams p) {
  const int stride = int(gridDim.x * blockDim.x);
  for (int i = int(blockIdx.x * blockDim.x + threadIdx.x); i < p.n; i += stride) {
    const float x = p.x[i], y = p.y[i];
    float r = 0.0f, r2 = 0.0f;
    switch (p.function) {
      case Function::expf: r = expf(x); break;
      case Function::exp2f: r = exp2f(x); break;
      case Function::exp10f: r = exp10f(x); break;
      case Function::expm1f: r = expm1f(x); break;
      case Function::logf: r = logf(x); break;
      case Function::log2f: r = log2f(x); break;
      case Function::log10f: r = log10f(x); break;
      case Function::log1pf: r = log1pf(x); break;
      case Function::sinf: r = sinf(x); break;
      case Function::cosf: r = cosf(x); break;
      case Function::sincosf: sincosf(x, &r, &r2); break;
      case Function::tanf: r = tanf(x); break;
      case Function::tanhf: r = tanhf(x); break;
      case Function::powf: r = powf(x, y); break;
      case Function::rsqrtf: r = rsqrtf(x); break;
      case Function::fast_expf: r = __expf(x); break;
      case Function::fast_exp10f: r = __exp10f(x); break;
      case Function::fast_logf: r = __logf(x); break;
      case Function::fast_log2f: r = __log2f(x); break;
      case Function::fast_log10f: r = __log10f(x); break;
      case Function::fast_sinf: r = __sinf(x); break;
      case Function::fast_cosf: r = __cosf(x); break;
      case Function::fast_sincosf: __sincosf(x, &r, &r2); break;
      case Function::fast_tanf: r = __tanf(x); break;
      case Function::fast_powf: r = __powf(x, y); break;
      case Function::fast_tanhf: r = __tanhf(x); break;
      case Function::fast_fdividef: r = __fdividef(x, y); break;
    }
    p.out[i] = r;
    p.out2[i] = r2;
  }
}

}  // namespace sim_math_test
SELFATTN_KERNELS_END

namespace selfattn::sim::testing::sim_math {

namespace kt = selfattn::kernels::sim_target::sim_math_test;
using kt::Function;

struct Results {
  std::vector<float> out, out2;
};

inline Results evaluate(Function function, const std::vector<float>& x, const std::vector<float>& y) {
  Results r{std::vector<float>(x.size()), std::vector<float>(x.size())};
  const kt::EvaluateParams params{function, x.data(), y.data(), r.out.data(), r.out2.data(), int(x.size())};
  testing::launch<kt::EvaluateParams, kt::evaluate>("sim_math_evaluate", dim3(8), dim3(64), params);
  return r;
}

inline uint32_t bits_of(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

inline bool same_value(float a, float b) {  // bit for bit, any NaN matching any NaN
  return (std::isnan(a) && std::isnan(b)) || bits_of(a) == bits_of(b);
}

}  // namespace selfattn::sim::testing::sim_math
