#pragma once
// The CUDA math library's single-precision functions as the sim computes them (compat.h includes
// this; nothing here exists for nvcc).
//
// glibc's float functions are within about 1 ulp of the exact result; a GPU's are only within the
// bound CUDA documents (exp2f: 2 ulp). A kernel whose logic needs more accuracy than that would pass
// on the sim and fail on the GPU, so each function here returns the correctly rounded result (the
// double-precision value rounded to float) moved by a seeded amount within its documented bound:
//
// - Seeded: the amount is a hash of (the math seed, the function, the input bits), so a rerun
//   reproduces every result and another SELFATTN_SIM_SEED moves other results other ways. The math
//   seed is SELFATTN_SIM_SEED as the process started, not Options::seed: a test that changes
//   Options::seed to run other schedules (the determinism tests, which want bitwise-equal results)
//   keeps one GPU's arithmetic, as a real GPU's does not change with the schedule.
//   set_math_seed() changes it.
// - Within the bound, drawn uniformly over all of it (a GPU is mostly closer; the sim aims to show
//   what a kernel may meet, not what is likely).
// - Exact where the result is exact by definition: a NaN, infinite or zero input, and a result
//   that is NaN, infinite or zero, keep glibc's double-precision value (C99 Annex F's special
//   cases, which the CUDA Math API lists function by function: exp2f(+-0) = 1, exp2f(-inf) = +0,
//   logf(1) = +0, tanhf(+-0) = +-0, tanhf(+-inf) = +-1, powf(1, y) = 1 ...). A result that
//   underflows to 0 or overflows to infinity stays there.
// - Inside the function's range: |tanh|, |sin|, |cos| <= 1 and exp >= 0 (the ulp bound alone would
//   allow tanhf(10) > 1); the sign of a result never changes.
// - Subnormals: the library builds without -ftz, so the standard functions keep subnormal inputs and
//   results. The fast intrinsics that CUDA documents as flushing them ([LD], [CH]) flush
//   both to sign-preserving zero; __fdividef and __tanhf are documented without a flush and keep them.
//
// Operations that are IEEE-rounded on the GPU (x + y, x * y, fmaf, and, as the library builds with
// the default -prec-div=true and -prec-sqrt=true, x / y and sqrtf; the _rn intrinsics) are exact and
// stay the host's own.
//
// Sources, cited per function below:
//   [SF]  CUDA C++ Programming Guide, appendix "Mathematical Functions", "Standard Functions":
//         single-precision maximum ulp errors (CUDA 12.8-13.0; "full range" for every one used here).
//   [IF]  the same appendix, "Intrinsic Functions": single-precision intrinsic error bounds.
//   [LD]  libdevice User's Guide, __nv_fast_expf / logf / log2f / powf ...: "input and output values
//         around (in) the denormal range are flushed to sign preserving 0.0".
//   [CH]  the CUDA 13.0 headers, crt/device_functions.h: __sinf "output in the denormal range is
//         flushed", __tanf "denormal output is flushed", __sincosf "denorm input/output is flushed".
//   [PTX] PTX ISA, "Floating Point Instructions": sin / cos.approx (absolute error 2^-20.5 in
//         [-2pi, 2pi], 2^-14.7 in [-100pi, 100pi], no guarantee outside), ex2.approx (2 ulp),
//         tanh.approx (relative error 2^-11, subnormals passed through).
//
// Kernel code calls these by their CUDA names, unqualified (exp2f(x)). Inside the kernels' namespace
// (target.h) unqualified lookup finds the declarations at the end of this file before glibc's
// global ones, so no kernel is edited. tests/sim/test_sim_math_bounds.cpp checks the bounds; the
// ctest SimMath.KernelObjectsCallNoFloatLibm checks that no kernel object calls glibc's float
// functions.
#include "target.h"

#if SELFATTN_SIM
#include <math.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include <selfattn_sim/sim.h>

namespace selfattn::sim::math {

// Which function a draw is for: expf(x) and __expf(x) move independently.
enum class Fn : uint32_t {
  expf = 1, exp2f, exp10f, expm1f, logf, log2f, log10f, log1pf, sinf, cosf, tanf, tanhf, powf, rsqrtf,
  fast_expf, fast_exp10f, fast_logf, fast_log2f, fast_log10f, fast_sinf, fast_cosf, fast_ex2, fast_fdividef,
  fast_tanhf,
};

inline uint32_t bits_of(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}
inline float float_of(uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}

// SplitMix64's finaliser: every input bit moves every output bit.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The math seed (see the top): SELFATTN_SIM_SEED read as options.cpp reads it, else Options' default.
inline std::atomic<uint64_t>& math_seed_storage() {
  static std::atomic<uint64_t> seed{[] {
    const char* env = std::getenv("SELFATTN_SIM_SEED");
    return env != nullptr ? uint64_t(std::strtoull(env, nullptr, 0)) : ::selfattn::sim::Options{}.seed;
  }()};
  return seed;
}
inline uint64_t math_seed() { return math_seed_storage().load(std::memory_order_relaxed); }
inline void set_math_seed(uint64_t seed) { math_seed_storage().store(seed, std::memory_order_relaxed); }

// 64 random bits for (seed, function, inputs).
inline uint64_t draw(Fn fn, float a, float b = 0.0f) {
  const uint64_t key = mix64(math_seed() * 0x9E3779B97F4A7C15ull + uint64_t(fn));
  return mix64(key ^ (uint64_t(bits_of(b)) << 32 | bits_of(a)));
}

// An integer in [-max_ulps, max_ulps], each equally likely.
inline int draw_steps(uint64_t random, uint32_t max_ulps) {
  return int(((random >> 32) * (2ull * max_ulps + 1)) >> 32) - int(max_ulps);
}

// Zero, infinite or NaN: values whose results CUDA defines exactly.
inline bool is_special(float x) { return x == 0.0f || !isfinite(x); }

// `r` moved by `steps` representable floats, away from zero for steps > 0 (ulp distance as CUDA
// counts it: the number of floats between). Stops at zero and at the largest finite float: a
// result never changes sign or becomes infinite.
inline float step_ulps(float r, int steps) {
  const uint32_t bits = bits_of(r);
  const int64_t magnitude = int64_t(bits & 0x7FFFFFFFu) + steps;
  const int64_t largest_finite = 0x7F7FFFFF;
  const int64_t clamped = magnitude < 0 ? 0 : magnitude > largest_finite ? largest_finite : magnitude;
  return float_of((bits & 0x80000000u) | uint32_t(clamped));
}

// A function with a maximum ulp error: the correctly rounded `exact`, moved by up to max_ulps.
inline float within_ulps(Fn fn, float x, double exact, uint32_t max_ulps) {
  const float rounded = float(exact);
  if (is_special(x) || is_special(rounded)) return rounded;
  return step_ulps(rounded, draw_steps(draw(fn, x), max_ulps));
}
// The same for a function of two inputs.
inline float within_ulps(Fn fn, float x, float y, double exact, uint32_t max_ulps) {
  const float rounded = float(exact);
  if (is_special(x) || is_special(y) || is_special(rounded)) return rounded;
  return step_ulps(rounded, draw_steps(draw(fn, x, y), max_ulps));
}

// A function with a maximum absolute error: `exact` moved by an amount drawn from
// [-max_error, max_error], rounded to float (and stepped back toward `exact` should the rounding
// have carried it past the bound). A result smaller than the bound stops at zero rather than
// change sign, as within_ulps does.
inline float within_absolute(Fn fn, float x, double exact, double max_error) {
  const float rounded = float(exact);
  if (is_special(x) || is_special(rounded)) return rounded;
  const double offset = (double(draw(fn, x) >> 11) * 0x1p-52 - 1.0) * max_error;
  float moved = float(exact + offset);
  while (moved != rounded && fabs(double(moved) - exact) > max_error) moved = nextafterf(moved, rounded);
  return signbit(moved) == signbit(rounded) ? moved : copysignf(0.0f, rounded);
}

inline float within_unit(float x) { return fabsf(x) > 1.0f ? copysignf(1.0f, x) : x; }

// .ftz: a subnormal becomes zero of the same sign.
inline float flush_subnormal(float x) { return fpclassify(x) == FP_SUBNORMAL ? copysignf(0.0f, x) : x; }

// The documented absolute errors, 2^-21.41 and so on, as exact binary constants.
constexpr double two_to_minus_21_41 = 0x1.8157d9d08a78dp-22;
constexpr double two_to_minus_21_19 = 0x1.c0d2771113e52p-22;
constexpr double two_to_minus_20_5 = 0x1.6a09e667f3bcdp-21;
constexpr double two_to_minus_14_7 = 0x1.3b2c47bff832cp-15;

// The __expf / __exp10f bound, 2 + floor(|factor x|) ulp, for finite x.
inline uint32_t ulps_growing_with(float x, double factor) {
  return isfinite(x) ? 2u + uint32_t(fabs(factor * double(x))) : 0u;
}

// ---- the profiler's MUFU count (selfattn_sim/profile.h) ------------------------------------------
// One operation of the special-function unit per call, for the functions whose CUDA implementation
// is that one instruction (with FMA-pipe scaling around it): exp2f / expf / exp10f (ex2.approx after
// a range reduction, within ex2's 2 ulp [SF], [PTX]) and the fast intrinsics, which are the PTX
// .approx instructions ([IF]: __expf ex2, __logf lg2, __sinf sin, __fdividef rcp, __tanhf tanh,
// rsqrtf rsqrt.approx). The accurate logf, log2f, log10f, sinf, cosf, tanf, tanhf, powf, expm1f and
// log1pf are mostly FMA-pipe polynomials in CUDA's implementation and are not counted: the count
// stays a floor, as the speed-of-light bound it feeds needs.
inline void count_mufu(::selfattn::sim::Mufu kind) {
  if (::selfattn::sim::profiling()) ::selfattn::sim::profile_mufu(kind);
}

// ---- the standard functions ([SF], maximum ulp error over the full range) ---------------------
inline float expf(float x) {  // 2 ulp
  count_mufu(Mufu::ex2);
  return within_ulps(Fn::expf, x, ::exp(double(x)), 2);
}
inline float exp2f(float x) {  // 2 ulp
  count_mufu(Mufu::ex2);
  return within_ulps(Fn::exp2f, x, ::exp2(double(x)), 2);
}
inline float exp10f(float x) {  // 2 ulp
  count_mufu(Mufu::ex2);
  return within_ulps(Fn::exp10f, x, ::exp10(double(x)), 2);
}
inline float expm1f(float x) { return within_ulps(Fn::expm1f, x, ::expm1(double(x)), 1); }      // 1 ulp
inline float logf(float x) { return within_ulps(Fn::logf, x, ::log(double(x)), 1); }            // 1 ulp
inline float log2f(float x) { return within_ulps(Fn::log2f, x, ::log2(double(x)), 1); }         // 1 ulp
inline float log10f(float x) { return within_ulps(Fn::log10f, x, ::log10(double(x)), 2); }      // 2 ulp
inline float log1pf(float x) { return within_ulps(Fn::log1pf, x, ::log1p(double(x)), 1); }      // 1 ulp
inline float sinf(float x) { return within_unit(within_ulps(Fn::sinf, x, ::sin(double(x)), 2)); }  // 2 ulp
inline float cosf(float x) { return within_unit(within_ulps(Fn::cosf, x, ::cos(double(x)), 2)); }  // 2 ulp
inline float tanf(float x) { return within_ulps(Fn::tanf, x, ::tan(double(x)), 4); }            // 4 ulp
inline float tanhf(float x) { return within_unit(within_ulps(Fn::tanhf, x, ::tanh(double(x)), 2)); }  // 2 ulp
// 4 ulp. powf(1, y) = 1 for every y, NaN included (Annex F), besides the special x and y.
inline float powf(float x, float y) {
  if (x == 1.0f) return 1.0f;
  return within_ulps(Fn::powf, x, y, ::pow(double(x), double(y)), 4);
}
// 2 ulp (the row rsqrtf(x)).
inline float rsqrtf(float x) {
  count_mufu(Mufu::rsqrt);
  return within_ulps(Fn::rsqrtf, x, 1.0 / ::sqrt(double(x)), 2);
}

// ---- the fast intrinsics ([IF]; flushes per [LD] and [CH]) ---------------------------------------
// ex2.approx.ftz.f32, the last step of __powf: 2 ulp [PTX], subnormals flushed.
inline float fast_ex2(float x) {
  count_mufu(Mufu::ex2);
  x = flush_subnormal(x);
  return flush_subnormal(within_ulps(Fn::fast_ex2, x, ::exp2(double(x)), 2));
}
// __expf: 2 + floor(|1.173 x|) ulp.
inline float fast_expf(float x) {
  count_mufu(Mufu::ex2);
  x = flush_subnormal(x);
  return flush_subnormal(within_ulps(Fn::fast_expf, x, ::exp(double(x)), ulps_growing_with(x, 1.173)));
}
// __exp10f: 2 + floor(|2.97 x|) ulp.
inline float fast_exp10f(float x) {
  count_mufu(Mufu::ex2);
  x = flush_subnormal(x);
  return flush_subnormal(within_ulps(Fn::fast_exp10f, x, ::exp10(double(x)), ulps_growing_with(x, 2.97)));
}
// __logf: absolute error 2^-21.41 for x in [0.5, 2], else 3 ulp.
inline float fast_logf(float x) {
  count_mufu(Mufu::lg2);
  x = flush_subnormal(x);
  if (x >= 0.5f && x <= 2.0f) return within_absolute(Fn::fast_logf, x, ::log(double(x)), two_to_minus_21_41);
  return within_ulps(Fn::fast_logf, x, ::log(double(x)), 3);
}
// __log2f: absolute error 2^-22 for x in [0.5, 2], else 2 ulp.
inline float fast_log2f(float x) {
  count_mufu(Mufu::lg2);
  x = flush_subnormal(x);
  if (x >= 0.5f && x <= 2.0f) return within_absolute(Fn::fast_log2f, x, ::log2(double(x)), 0x1p-22);
  return within_ulps(Fn::fast_log2f, x, ::log2(double(x)), 2);
}
// __log10f: absolute error 2^-24 for x in [0.5, 2], else 3 ulp.
inline float fast_log10f(float x) {
  count_mufu(Mufu::lg2);
  x = flush_subnormal(x);
  if (x >= 0.5f && x <= 2.0f) return within_absolute(Fn::fast_log10f, x, ::log10(double(x)), 0x1p-24);
  return within_ulps(Fn::fast_log10f, x, ::log10(double(x)), 3);
}
// __sinf / __cosf: absolute error 2^-21.41 (sin) / 2^-21.19 (cos) for x in [-pi, pi] [IF]; beyond,
// sin.approx / cos.approx's 2^-20.5 up to 2pi and 2^-14.7 up to 100pi [PTX]. PTX guarantees
// nothing past 100pi; the sim keeps 2^-14.7 there.
inline double approx_trig_error(float x, double within_pi) {
  const double a = fabs(double(x));
  return a <= M_PI ? within_pi : a <= 2 * M_PI ? two_to_minus_20_5 : two_to_minus_14_7;
}
inline float fast_sinf(float x) {
  count_mufu(Mufu::sin);
  x = flush_subnormal(x);
  const double bound = approx_trig_error(x, two_to_minus_21_41);
  return within_unit(flush_subnormal(within_absolute(Fn::fast_sinf, x, ::sin(double(x)), bound)));
}
inline float fast_cosf(float x) {
  count_mufu(Mufu::cos);
  x = flush_subnormal(x);
  const double bound = approx_trig_error(x, two_to_minus_21_19);
  return within_unit(flush_subnormal(within_absolute(Fn::fast_cosf, x, ::cos(double(x)), bound)));
}
// __fdividef: 2 ulp for |y| in [2^-126, 2^126]; for 2^126 < |y| < 2^128 it returns 0 for a finite
// x and NaN for an infinite one (x times the reciprocal of y, which is 0 there: a NaN x stays NaN).
// Outside both ranges no bound is documented and the sim keeps the IEEE quotient.
inline float fast_fdividef(float x, float y) {
  count_mufu(Mufu::rcp);
  const float ay = fabsf(y);
  if (ay > 0x1p126f && ay < INFINITY) return isfinite(x) ? 0.0f : NAN;
  const float quotient = x / y;
  if (ay < 0x1p-126f || ay > 0x1p126f) return quotient;
  return within_ulps(Fn::fast_fdividef, x, y, double(quotient), 2);
}
// __tanf: "derived from its implementation as __sinf(x) * (1/__cosf(x))" [IF], a fast divide [CH];
// denormal output flushed [CH].
inline float fast_tanf(float x) { return flush_subnormal(fast_fdividef(fast_sinf(x), fast_cosf(x))); }
// __powf: "derived from its implementation as exp2f(y * __log2f(x))" [IF]; the exp2 is ex2.approx.ftz.
inline float fast_powf(float x, float y) { return fast_ex2(flush_subnormal(y) * fast_log2f(x)); }
// __tanhf (tanh.approx.f32): relative error 2^-11 [IF], [PTX]; subnormals kept, even under -ftz.
inline float fast_tanhf(float x) {
  count_mufu(Mufu::tanh);
  const double exact = ::tanh(double(x));
  return within_unit(within_absolute(Fn::fast_tanhf, x, exact, fabs(exact) * 0x1p-11));
}

}  // namespace selfattn::sim::math

// The fast intrinsics, by CUDA's names. glibc declares __expf, __logf, __sinf... (internal names)
// with C linkage but exports no such symbols, so these are defined with C linkage too.
extern "C" {
inline float __expf(float x) noexcept { return ::selfattn::sim::math::fast_expf(x); }
inline float __exp10f(float x) noexcept { return ::selfattn::sim::math::fast_exp10f(x); }
inline float __logf(float x) noexcept { return ::selfattn::sim::math::fast_logf(x); }
inline float __log2f(float x) noexcept { return ::selfattn::sim::math::fast_log2f(x); }
inline float __log10f(float x) noexcept { return ::selfattn::sim::math::fast_log10f(x); }
inline float __powf(float x, float y) noexcept { return ::selfattn::sim::math::fast_powf(x, y); }
inline float __sinf(float x) noexcept { return ::selfattn::sim::math::fast_sinf(x); }
inline float __cosf(float x) noexcept { return ::selfattn::sim::math::fast_cosf(x); }
inline float __tanf(float x) noexcept { return ::selfattn::sim::math::fast_tanf(x); }
// [CH]: "denorm input/output is flushed".
inline void __sincosf(float x, float* s, float* c) noexcept {
  *s = ::selfattn::sim::math::fast_sinf(x);
  *c = ::selfattn::sim::math::fast_cosf(x);
}
inline float __tanhf(float x) noexcept { return ::selfattn::sim::math::fast_tanhf(x); }
}
inline float __fdividef(float x, float y) { return ::selfattn::sim::math::fast_fdividef(x, y); }
inline float rsqrtf(float x) { return ::selfattn::sim::math::rsqrtf(x); }
// Double precision: CUDA's rsqrt is within 1 ulp [SF, double table]; the sim's is 1 / sqrt(x), two
// IEEE roundings, about as close. Not emulated: no kernel uses double-precision math.
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
// IEEE-compliant on the GPU ([IF]: __frcp_rn, __fsqrt_rn, __fdiv_rn, __fadd_rn ... "IEEE-compliant"):
// the host's IEEE operations are the same results.
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }

// The standard functions, by CUDA's names, where kernel code finds them first (see the top).
// sqrtf, fabsf, fmaf... are IEEE-exact on the GPU too and stay glibc's.
SELFATTN_KERNELS_BEGIN
inline float expf(float x) { return ::selfattn::sim::math::expf(x); }
inline float exp2f(float x) { return ::selfattn::sim::math::exp2f(x); }
inline float exp10f(float x) { return ::selfattn::sim::math::exp10f(x); }
inline float expm1f(float x) { return ::selfattn::sim::math::expm1f(x); }
inline float logf(float x) { return ::selfattn::sim::math::logf(x); }
inline float log2f(float x) { return ::selfattn::sim::math::log2f(x); }
inline float log10f(float x) { return ::selfattn::sim::math::log10f(x); }
inline float log1pf(float x) { return ::selfattn::sim::math::log1pf(x); }
inline float sinf(float x) { return ::selfattn::sim::math::sinf(x); }
inline float cosf(float x) { return ::selfattn::sim::math::cosf(x); }
inline void sincosf(float x, float* s, float* c) {  // 2 ulp each [SF]
  *s = ::selfattn::sim::math::sinf(x);
  *c = ::selfattn::sim::math::cosf(x);
}
inline float tanf(float x) { return ::selfattn::sim::math::tanf(x); }
inline float tanhf(float x) { return ::selfattn::sim::math::tanhf(x); }
inline float powf(float x, float y) { return ::selfattn::sim::math::powf(x, y); }
SELFATTN_KERNELS_END

#endif  // SELFATTN_SIM
