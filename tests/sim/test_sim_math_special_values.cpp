// The special values of the sim's CUDA math (kernels/common/sim_math.h), called from kernels as the
// library's kernels call it: the values CUDA documents as exact are exact (zeros, infinities, NaNs,
// exp2f(0), logf(1)...), and subnormals are flushed only by the intrinsics documented to flush
// them. The bounds over all other inputs: test_sim_math_bounds.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/compat.h"
#include "sim_test_math.h"

namespace sim = selfattn::sim;
using namespace sim::testing::sim_math;

namespace {

TEST(SimMath, DocumentedExactValuesAreExact) {
  struct Exact {
    Function function;
    float x, y, expected;
  };
  const Exact table[] = {
      {Function::exp2f, 0.0f, 0, 1.0f},          {Function::exp2f, -0.0f, 0, 1.0f},
      {Function::exp2f, -INFINITY, 0, 0.0f},     {Function::exp2f, INFINITY, 0, INFINITY},
      {Function::expf, 0.0f, 0, 1.0f},           {Function::expf, -INFINITY, 0, 0.0f},
      {Function::logf, 1.0f, 0, 0.0f},           {Function::log2f, 1.0f, 0, 0.0f},
      {Function::logf, 0.0f, 0, -INFINITY},      {Function::logf, INFINITY, 0, INFINITY},
      {Function::tanhf, 0.0f, 0, 0.0f},          {Function::tanhf, -0.0f, 0, -0.0f},
      {Function::tanhf, INFINITY, 0, 1.0f},      {Function::tanhf, -INFINITY, 0, -1.0f},
      {Function::powf, 1.0f, NAN, 1.0f},         {Function::powf, NAN, 0.0f, 1.0f},
      {Function::rsqrtf, 0.0f, 0, INFINITY},     {Function::rsqrtf, -0.0f, 0, -INFINITY},
      {Function::rsqrtf, INFINITY, 0, 0.0f},     {Function::sinf, -0.0f, 0, -0.0f},
      {Function::cosf, 0.0f, 0, 1.0f},           {Function::fast_expf, -INFINITY, 0, 0.0f},
      {Function::fast_expf, 0.0f, 0, 1.0f},      {Function::fast_logf, 1.0f, 0, 0.0f},
      {Function::fast_tanhf, -INFINITY, 0, -1.0f}, {Function::fast_fdividef, 1.0f, 0x1.8p126f, 0.0f},
      {Function::fast_fdividef, 0.0f, 3.0f, 0.0f},
  };
  for (const Exact& e : table) {
    const Results r = evaluate(e.function, {e.x}, {e.y});
    EXPECT_TRUE(same_value(r.out[0], e.expected))
        << "function " << int(e.function) << " (" << e.x << ", " << e.y << ") = " << r.out[0] << ", documented "
        << e.expected;
  }
  for (Function nan_in : {Function::expf, Function::exp2f, Function::logf, Function::tanhf, Function::fast_expf}) {
    EXPECT_TRUE(std::isnan(evaluate(nan_in, {NAN}, {0.0f}).out[0])) << int(nan_in);
  }
  EXPECT_TRUE(std::isnan(evaluate(Function::logf, {-1.0f}, {0.0f}).out[0]));
  EXPECT_TRUE(std::isnan(evaluate(Function::fast_fdividef, {INFINITY}, {0x1.8p126f}).out[0]));
}

// The library builds without -ftz: the standard functions keep subnormals. The intrinsics documented
// as flushing them (__expf, __logf, __sinf ... [LD], [CH]) flush inputs and results; __tanhf and
// __fdividef are documented without a flush.
TEST(SimMath, SubnormalsAreFlushedOnlyWhereDocumented) {
  const float subnormal = 1e-40f;
  auto one = [](Function f, float x, float y = 0.0f) { return evaluate(f, {x}, {y}).out[0]; };
  EXPECT_EQ(std::fpclassify(one(Function::expf, -100.0f)), FP_SUBNORMAL);  // e^-100 = 3.7e-44
  EXPECT_EQ(std::fpclassify(one(Function::exp2f, -140.0f)), FP_SUBNORMAL);
  EXPECT_EQ(std::fpclassify(one(Function::tanhf, subnormal)), FP_SUBNORMAL);
  EXPECT_EQ(std::fpclassify(one(Function::sinf, -subnormal)), FP_SUBNORMAL);
  EXPECT_TRUE(std::isfinite(one(Function::logf, subnormal)));

  EXPECT_TRUE(same_value(one(Function::fast_expf, -100.0f), 0.0f));
  EXPECT_TRUE(same_value(one(Function::fast_expf, subnormal), 1.0f));  // e^0
  EXPECT_TRUE(same_value(one(Function::fast_logf, subnormal), -INFINITY));
  EXPECT_TRUE(same_value(one(Function::fast_log2f, -subnormal), -INFINITY));
  EXPECT_TRUE(same_value(one(Function::fast_sinf, -subnormal), -0.0f));  // sign-preserving
  EXPECT_TRUE(same_value(one(Function::fast_tanf, subnormal), 0.0f));
  EXPECT_TRUE(same_value(one(Function::fast_powf, 2.0f, -140.0f), 0.0f));

  EXPECT_EQ(std::fpclassify(one(Function::fast_tanhf, subnormal)), FP_SUBNORMAL);
  EXPECT_EQ(std::fpclassify(one(Function::fast_fdividef, 1e-39f, 2.0f)), FP_SUBNORMAL);
}

}  // namespace
