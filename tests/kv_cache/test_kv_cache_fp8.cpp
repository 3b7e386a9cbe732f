// FP8 KV caches (kv_cache.h, issue 37): e4m3 and e5m2 K/V with fp32 scales per tensor or per kv
// head (real value = stored x scale). The kernels' conversions against the formats' definition
// (reference::fp8_value / fp8_code, written from the OCP spec in double, independent of
// cuda_fp8.h); attention over FP8 caches on every path, paged and contiguous, page sizes 1 and 16,
// GQA, f16/bf16/f32 queries, both split-KV kernels with 1 and 3 splits, masks and modifiers; append_kv's quantization
// code for code, saturation, rotary before quantization; left padding, q_offset and a batch index; bad arguments named
// with outputs untouched. The packed calls over FP8 caches: test_kv_cache_varlen.cpp (Fp8CacheEveryPath, and
// AppendPackedEqualsAppendPerSequence's e4m3 variant).
//
// The judge is the shared rule (kv_cache_check.h): the caches' scales have few significant bits, so
// code x scale is exact in fp32, f16 and bf16 (the dequantized inputs are exact on every path) and
// the allowed computation is the f16/bf16/f32 one on those values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "kernels/common/simt_tile.cuh"
#include "kv_cache_check.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

using namespace kv_test;

const Path kPaths[] = {Path::naive, Path::cublas, Path::fused};

// `spec` as an FP8 cache of `format`: one scale per tensor, or one per kv head (few significant
// bits each, kv_cache_check.h).
CacheSpec fp8(CacheSpec spec, DType format, bool per_head) {
  spec.dtype = format;
  const std::vector<float> k = {0.375f, 1.25f, 0.75f, 0.625f}, v = {0.625f, 0.5f, 1.25f, 0.375f};
  spec.k_scale.clear();
  spec.v_scale.clear();
  for (int h = 0; h < (per_head ? spec.kv_heads : 1); ++h) {
    spec.k_scale.push_back(k[size_t(h) % k.size()]);
    spec.v_scale.push_back(v[size_t(h) % v.size()]);
  }
  return spec;
}

AttendCase attend_q(CacheSpec spec, DType q_dtype, int heads, int seq_q, Causal causal = Causal::bottom_right) {
  AttendCase c = attend(std::move(spec), heads, seq_q, causal);
  c.query_dtype = q_dtype;
  return c;
}

// ---- the conversions -----------------------------------------------------------------------------

template <class T>
uint8_t kernel_code(float x) {
  const T value = kernels::from_float<T>(x);
  uint8_t code;
  std::memcpy(&code, &value, 1);
  return code;
}
template <class T>
float kernel_value(uint8_t code) {
  T value;
  std::memcpy(&value, &code, 1);
  return kernels::to_float(value);
}

// The kernels' FP8 conversions (cuda_fp8.h's, as the kernels call them) against the definition:
// all 256 codes decode to the defined value (NaN codes to NaN); quantization rounds to nearest
// even - every finite value, the midpoints between neighbours (ties) and the floats just either
// side of them - saturates past the largest finite value and at infinities, and keeps NaN.
template <class T>
void check_format(DType format, double max_finite, double min_subnormal) {
  SCOPED_TRACE(to_string(format));
  EXPECT_EQ(reference::fp8_value(format, reference::fp8_code(format, 1e9)), max_finite);
  EXPECT_EQ(reference::fp8_value(format, 0x01), min_subnormal);
  std::vector<double> finite;
  for (int code = 0; code < 256; ++code) {
    const double defined = reference::fp8_value(format, uint8_t(code));
    const float decoded = kernel_value<T>(uint8_t(code));
    if (std::isnan(defined)) {
      EXPECT_TRUE(std::isnan(decoded)) << "code " << code;
      continue;
    }
    EXPECT_EQ(double(decoded), defined) << "code " << code;
    if (std::isfinite(defined)) {
      finite.push_back(defined);
      // Every finite value encodes to its own code (the two zeros to theirs).
      EXPECT_EQ(reference::fp8_code(format, defined), code) << defined;
      EXPECT_EQ(kernel_code<T>(float(defined)), code) << defined;
    }
  }
  std::sort(finite.begin(), finite.end());
  std::vector<float> probes = {float(max_finite) * 1.01f,
                               float(max_finite) * 2.0f,
                               1e30f,
                               -1e30f,
                               std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::max(),
                               std::numeric_limits<float>::denorm_min(),
                               float(min_subnormal) / 4,
                               float(min_subnormal) / 2,
                               -float(min_subnormal) / 2};
  for (size_t i = 0; i + 1 < finite.size(); ++i) {
    const float mid = float((finite[i] + finite[i + 1]) / 2);  // exact: FP8 values have few bits
    probes.push_back(mid);
    probes.push_back(std::nextafter(mid, -INFINITY));
    probes.push_back(std::nextafter(mid, INFINITY));
  }
  std::mt19937_64 rng(37);
  std::uniform_real_distribution<float> exponent(-20.0f, 18.0f);
  for (int i = 0; i < 20000; ++i) probes.push_back((i % 2 ? -1.0f : 1.0f) * std::exp2(exponent(rng)));
  int mismatches = 0;
  for (float x : probes) {
    const uint8_t defined = reference::fp8_code(format, x), kernel = kernel_code<T>(x);
    if (defined != kernel && ++mismatches <= 10) {
      ADD_FAILURE() << to_string(format) << ": " << x << " quantizes to code " << int(kernel) << ", defined "
                    << int(defined);
    }
  }
  EXPECT_EQ(mismatches, 0);
  // Saturation and NaN, spelled out.
  EXPECT_EQ(kernel_value<T>(kernel_code<T>(std::numeric_limits<float>::infinity())), float(max_finite));
  EXPECT_EQ(kernel_value<T>(kernel_code<T>(-1e20f)), -float(max_finite));
  EXPECT_TRUE(std::isnan(kernel_value<T>(kernel_code<T>(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(reference::fp8_value(format, reference::fp8_code(format, std::nan("")))));
}

TEST(Fp8Formats, KernelConversionsMatchTheDefinition) {
  check_format<__nv_fp8_e4m3>(DType::e4m3, 448.0, std::ldexp(1.0, -9));
  check_format<__nv_fp8_e5m2>(DType::e5m2, 57344.0, std::ldexp(1.0, -16));
  EXPECT_EQ(dtype_size(DType::e4m3), 1u);
  EXPECT_EQ(dtype_size(DType::e5m2), 1u);
  EXPECT_STREQ(to_string(DType::e5m2), "e5m2");
}

// ---- attention over FP8 caches -----------------------------------------------------------------

// Every path over paged (page sizes 16 and 1) and contiguous caches, both formats, scales per
// tensor and per kv head, GQA 1/2/4, q f16/bf16/f32, lengths around the page edges, head dims 64
// and 128, causal bottom-right and none.
TEST(KvCacheFp8, EveryPathPagedAndContiguous) {
  Context ctx;
  std::vector<AttendCase> cases;
  cases.push_back(
      attend_q(fp8(paged(DType::f16, 5, 1, 64, 16, 3, {0, 1, 15, 16, 17}), DType::e4m3, false), DType::f16, 4, 1));
  cases.push_back(
      attend_q(fp8(paged(DType::f16, 4, 2, 64, 1, 20, {0, 1, 2, 19}, false), DType::e5m2, true), DType::bf16, 4, 3));
  cases.push_back(attend_q(fp8(contiguous(DType::f16, 2, 2, 64, 40, {33, 40}, false), DType::e4m3, true), DType::f32, 2,
                           2, Causal::none));
  cases.push_back(
      attend_q(fp8(contiguous(DType::f16, 2, 1, 128, 20, {7, 20}, true), DType::e5m2, false), DType::f16, 2, 3));
  cases.push_back(attend_q(fp8(paged(DType::f16, 2, 2, 128, 16, 3, {40, 33}), DType::e4m3, true), DType::bf16, 8, 1));
  for (const AttendCase& c : cases)
    for (Path path : kPaths) EXPECT_TRUE(check_attend(ctx, c, path));
}

// Left padding with query rows placed by q_offset (paged), and a contiguous cache read through a
// batch index (two sequences on one row, one row outside the cache), every path.
TEST(KvCacheFp8, LeftPaddingAndBatchIndexEveryPath) {
  Context ctx;
  CacheSpec left_padded = fp8(paged(DType::f16, 3, 2, 64, 16, 5, {70, 37, 16}), DType::e5m2, true);
  left_padded.key_start = {20, 0, 16};
  AttendCase placed = attend_q(left_padded, DType::bf16, 4, 3);
  placed.q_offset = {40, 30, 0};
  CacheSpec indexed = fp8(contiguous(DType::f16, 4, 2, 64, 33, {33, 10, 0, 21}, true), DType::e4m3, false);
  indexed.batch_index = {2, 2, 0, 5};
  indexed.cache_rows = 3;
  for (const AttendCase& c : {placed, attend_q(indexed, DType::f16, 4, 3)})
    for (Path path : kPaths) EXPECT_TRUE(check_attend(ctx, c, path));
}

// Each split-KV kernel over FP8, with 1 and 3 splits, both formats, q f32 and bf16: pools with the
// default pads (8 and 24 one-byte elements: rows on 8 bytes, so bf16 queries take the tensor-core
// kernel and its 8-byte loads, f32 ones the SIMT kernel element-wise), pads 4 and 12 (rows off 8
// bytes: the SIMT kernel for both) and pads 16 and 32 (rows on 16 bytes: the SIMT kernel's 16-byte
// loads for f32, the tensor-core kernel for bf16).
TEST(KvCacheFp8, SplitsAndEachKernel) {
  Context ctx;
  for (DType format : {DType::e4m3, DType::e5m2})
    for (int pad : {8, 4, 16})
      for (int splits : {1, 3})
        for (DType q_dtype : {DType::f32, DType::bf16}) {
          CacheSpec spec = fp8(paged(DType::f16, 2, 2, 64, 16, 8, {113, 70}), format, splits == 3);
          spec.k_layout.row_pad = pad;
          spec.v_layout.row_pad = 3 * pad;
          AttendCase c = attend_q(spec, q_dtype, 4, 2);
          c.num_splits = splits;
          EXPECT_TRUE(check_attend(ctx, c, Path::fused));
        }
}

// Masks and modifiers over an FP8 cache, every path: a window, softcap, ALiBi, a bias, sinks; on the
// fused path also with 3 splits.
TEST(KvCacheFp8, MasksAndModifiersEveryPath) {
  Context ctx;
  testing::ScoreModsCase window;
  window.window_left = 9;
  testing::ScoreModsCase softcap_alibi;
  softcap_alibi.softcap = 2.5f;
  softcap_alibi.alibi = testing::AlibiSlopes::heads;
  testing::ScoreModsCase sinks_bias;
  sinks_bias.sinks = true;
  sinks_bias.bias = testing::BiasLayout::full;
  sinks_bias.masked_key_period = 5;
  const AttendCase e4m3 =
      attend_q(fp8(paged(DType::f16, 3, 1, 64, 16, 5, {0, 37, 80}), DType::e4m3, false), DType::f16, 3, 2);
  const AttendCase e5m2 = attend_q(fp8(contiguous(DType::f16, 2, 2, 64, 45, {45, 12}, true), DType::e5m2, true),
                                   DType::bf16, 4, 3, Causal::none);
  for (const testing::ScoreModsCase& m : {window, softcap_alibi, sinks_bias})
    for (AttendCase c : {e4m3, e5m2}) {
      c.mods = m;
      for (Path path : kPaths) EXPECT_TRUE(check_attend(ctx, c, path));
      c.num_splits = 3;
      EXPECT_TRUE(check_attend(ctx, c, Path::fused));
    }
}

// ---- append_kv into FP8 caches -------------------------------------------------------------------

// Signed order of an FP8 code's magnitude (adjacent values differ by 1, +0 and -0 are both 0).
int code_order(uint8_t code) { return (code & 0x80) ? -int(code & 0x7f) : int(code); }

// append_kv of `new_dtype` tokens into an FP8 cache: without rotary every stored code is the
// reference's quantization (fp32 quotient by the scale, round to nearest even, saturating) exactly;
// with rotary (rotated in fp32 by the library, in double by the reference) within one FP8 step of
// it. Every byte that is no new token's stays as it was. Every `saturate_every`-th new value is
// scaled far past the format's range (0: none). Then attention over the appended cache.
::testing::AssertionResult check_fp8_append(Context& ctx, const CacheSpec& spec, DType new_dtype, int heads,
                                            int seq_new, std::optional<std::pair<int, bool>> rotary_spec, Path path,
                                            int saturate_every) {
  AttendCase c = attend_q(spec, new_dtype, heads, seq_new);
  c.rotary = rotary_spec;
  const std::string name =
      "fp8 append " + c.name() + " new" + std::to_string(seq_new) + " k_new " + to_string(new_dtype);
  std::mt19937_64 rng = rng_for(name);
  TestCache cache = make_cache(ctx, spec, rng);
  std::optional<TestRotary> rotary;
  if (rotary_spec) {
    rotary = make_rotary(ctx, rotary_rows_for(cache.image, seq_new), rotary_spec->first, rotary_spec->second, rng);
  }
  Tensor k_new = random_tensor(ctx, new_dtype, spec.batch, spec.kv_heads, seq_new, spec.head_dim, rng, kNewKeysLayout);
  Tensor v_new =
      random_tensor(ctx, new_dtype, spec.batch, spec.kv_heads, seq_new, spec.head_dim, rng, kNewValuesLayout);
  if (saturate_every > 0) {
    // Out of range: +-1e5 over a scale of at most 1.25 is past both formats' largest values.
    for (Tensor* t : {&k_new, &v_new}) {
      std::vector<unsigned char> host = t->device.to_host();
      size_t i = 0;
      for (int b = 0; b < spec.batch; ++b)
        for (int h = 0; h < spec.kv_heads; ++h)
          for (int s = 0; s < seq_new; ++s)
            for (int e = 0; e < spec.head_dim; ++e, ++i) {
              if (i % size_t(saturate_every) != 0) continue;
              t->values[i] = round_to(new_dtype, float(t->values[i] < 0 ? -1e5 : 1e5));
              store_element(host.data(), new_dtype, size_t(t->view.offset(b, h, s, e)), float(t->values[i]));
            }
      t->device.copy_from_host(host);
    }
  }
  DeviceBuffer<int32_t> updated(ctx, size_t(spec.batch), "updated lengths");
  updated.fill_bytes(0xff);
  const std::vector<unsigned char> k_before = cache.k.to_host(), v_before = cache.v.to_host();
  AppendKvOptions options;
  options.updated_lengths = updated.data();
  if (rotary) options.rotary = rotary->view;
  append_kv(ctx, cache.view, k_new.view, v_new.view, options);
  ctx.synchronize();

  reference::KvCacheImage expected = cache.image;
  reference::KvQuantization quantization;
  quantization.format = spec.dtype;
  for (int h = 0; h < spec.kv_heads; ++h) {
    quantization.k_scale.push_back(spec.scale(0, h));
    quantization.v_scale.push_back(spec.scale(1, h));
  }
  reference::append_kv(expected, k_new.values, v_new.values, seq_new, rotary ? &rotary->table : nullptr, &quantization);
  std::vector<char> target(size_t(expected.num_pages) * expected.page_size, 0);
  for (int b = 0; b < spec.batch; ++b)
    for (int t = 0; t < seq_new; ++t) {
      const int page = expected.page_of(b, expected.length(b) + t);
      if (page >= 0)
        target[size_t(page) * expected.page_size + size_t((expected.length(b) + t) % expected.page_size)] = 1;
    }
  int saturated = 0;
  for (int which = 0; which < 2; ++which) {
    const std::vector<unsigned char>& before = which == 0 ? k_before : v_before;
    const std::vector<unsigned char> after = (which == 0 ? cache.k : cache.v).to_host();
    const std::vector<double>& image = which == 0 ? expected.k : expected.v;
    for (int page = 0; page < expected.num_pages; ++page)
      for (int h = 0; h < expected.kv_heads; ++h)
        for (int row = 0; row < expected.page_size; ++row)
          for (int e = 0; e < expected.head_dim; ++e) {
            const size_t index = cache.device_index(which, page, h, row, e);
            if (!target[size_t(page) * expected.page_size + size_t(row)]) {
              if (after[index] != before[index]) {
                return ::testing::AssertionFailure()
                       << name << ": cache " << (which ? "v" : "k") << " page " << page << " head " << h << " row "
                       << row << " changed but is no new token's";
              }
              continue;
            }
            // The image holds code x scale exactly: dividing by the scale gives the code's value back.
            const double scale = spec.scale(which, h);
            const uint8_t wanted =
                reference::fp8_code(spec.dtype, image[expected.offset(page, h, row) + size_t(e)] / scale);
            const uint8_t got = after[index];
            const bool rotated = rotary && which == 0 && e < rotary->table.rotary_dim;
            const bool ok = rotated ? std::abs(code_order(got) - code_order(wanted)) <= 1 : got == wanted;
            if (!ok) {
              return ::testing::AssertionFailure()
                     << name << ": cache " << (which ? "v" : "k") << " page " << page << " head " << h << " row " << row
                     << " element " << e << " holds code " << int(got) << " ("
                     << reference::fp8_value(spec.dtype, got) * scale << "), expected " << int(wanted) << " ("
                     << reference::fp8_value(spec.dtype, wanted) * scale << ")" << (rotated ? " or a neighbour" : "");
            }
            if ((got & 0x7f) == reference::fp8_code(spec.dtype, 1e30)) ++saturated;
          }
  }
  if (saturate_every > 0 && saturated == 0) {
    return ::testing::AssertionFailure() << name << ": no stored value reached the format's largest finite value";
  }
  const std::vector<int32_t> new_lengths = updated.to_host();
  for (int b = 0; b < spec.batch; ++b) {
    const int wanted = std::min(expected.length(b) + seq_new, expected.capacity());
    if (new_lengths[size_t(b)] != wanted) {
      return ::testing::AssertionFailure()
             << name << ": updated_lengths[" << b << "] = " << new_lengths[size_t(b)] << ", expected " << wanted;
    }
  }
  if (saturate_every > 0) return ::testing::AssertionSuccess();  // saturated values make no sense to attend over
  // Attend with the updated lengths over what the device wrote (the reference fed its dequantized values).
  cache.image.k = download_pool(cache, 0);
  cache.image.v = download_pool(cache, 1);
  cache.image.lengths = new_lengths;
  cache.view.lengths = updated.data();
  return attend_and_check(ctx, c, cache, path, rng, rotary ? &*rotary : nullptr);
}

// Quantization code for code from f16, bf16 and f32 tokens into both formats, scales per tensor
// and per kv head, across page boundaries (page sizes 16 and 1) and into a contiguous cache whose
// last sequence drops the tokens past its capacity; then every path attends over them.
TEST(KvCacheFp8, AppendQuantizesExactlyThenAttend) {
  Context ctx;
  EXPECT_TRUE(check_fp8_append(ctx, fp8(paged(DType::f16, 4, 2, 64, 16, 3, {9, 15, 16, 0}), DType::e4m3, true),
                               DType::f16, 4, 7, std::nullopt, Path::fused, 0));
  EXPECT_TRUE(check_fp8_append(ctx, fp8(paged(DType::f16, 2, 2, 64, 1, 12, {0, 4}), DType::e5m2, false), DType::bf16, 2,
                               7, std::nullopt, Path::naive, 0));
  EXPECT_TRUE(check_fp8_append(ctx, fp8(contiguous(DType::f16, 2, 2, 64, 23, {3, 20}, false), DType::e4m3, false),
                               DType::f32, 2, 7, std::nullopt, Path::cublas, 0));
}

// Values far past the format's range saturate to its largest finite value (signs kept), never to
// NaN or infinity; the other values of the same rows are still exact.
TEST(KvCacheFp8, AppendSaturatesOutOfRangeValues) {
  Context ctx;
  for (DType format : {DType::e4m3, DType::e5m2})
    for (DType new_dtype : {DType::f32, DType::bf16}) {
      EXPECT_TRUE(check_fp8_append(ctx, fp8(paged(DType::f16, 2, 2, 64, 16, 2, {5, 16}), format, true), new_dtype, 2, 5,
                                   std::nullopt, Path::fused, 7));
    }
}

// K is rotated (in fp32) before it is quantized: each stored code within one FP8 step of the
// double-precision rotation's, V and the dimensions past rotary_dim exact; then attention (with
// q rotated too) on the fused and naive paths.
TEST(KvCacheFp8, AppendRotaryBeforeQuantization) {
  Context ctx;
  EXPECT_TRUE(check_fp8_append(ctx, fp8(paged(DType::f16, 3, 2, 64, 16, 3, {9, 15, 16}), DType::e4m3, true),
                               DType::bf16, 4, 5, std::make_pair(64, false), Path::fused, 0));
  EXPECT_TRUE(check_fp8_append(ctx, fp8(contiguous(DType::f16, 2, 1, 64, 30, {3, 20}, true), DType::e5m2, false),
                               DType::f16, 2, 3, std::make_pair(32, true), Path::naive, 0));
}

// ---- arguments -----------------------------------------------------------------------------------

// Each bad argument is named, and nothing is written (out and the cache keep their bytes).
TEST(KvCacheFp8, BadArgumentsNamedNothingWritten) {
  Context ctx;
  std::mt19937_64 rng = rng_for("fp8 arguments");
  const CacheSpec spec = fp8(paged(DType::f16, 2, 2, 64, 16, 2, {5, 16}), DType::e4m3, true);
  const TestCache cache = make_cache(ctx, spec, rng);
  const CacheSpec plain_spec = paged(DType::f16, 2, 2, 64, 16, 2, {5, 16});
  const TestCache plain = make_cache(ctx, plain_spec, rng);
  Tensor q = random_tensor(ctx, DType::f16, 2, 4, 1, 64, rng, kQueryLayout);
  Tensor q32 = random_tensor(ctx, DType::f32, 2, 4, 1, 64, rng, kQueryLayout);
  Tensor k_new = random_tensor(ctx, DType::bf16, 2, 2, 1, 64, rng, kNewKeysLayout);
  Tensor v_new = random_tensor(ctx, DType::bf16, 2, 2, 1, 64, rng, kNewValuesLayout);
  Tensor v_new16 = random_tensor(ctx, DType::f16, 2, 2, 1, 64, rng, kNewValuesLayout);
  Output out = poisoned_output(ctx, DType::f16, 2, 4, 1, 64, kOutLayout);
  Output out_bf16 = poisoned_output(ctx, DType::bf16, 2, 4, 1, 64, kOutLayout);
  const std::vector<unsigned char> out_before = out.device.to_host(), out_bf16_before = out_bf16.device.to_host();
  const std::vector<unsigned char> k_before = cache.k.to_host(), v_before = cache.v.to_host();
  const auto expect_named = [&](const std::string& expected, const auto& call) {
    try {
      call();
      ADD_FAILURE() << "no error, expected one naming " << expected;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  };
  const auto attend_with = [&](const KvCache& view, const TensorView& q_view, const TensorView& out_view) {
    return [&ctx, view, q_view, out_view] { attention_with_kv_cache(ctx, q_view, view, out_view); };
  };
  const auto append_with = [&](const KvCache& view, const TensorView& k_view, const TensorView& v_view) {
    return [&ctx, view, k_view, v_view] { append_kv(ctx, view, k_view, v_view); };
  };
  KvCache no_k_scale = cache.view;
  no_k_scale.k_scale = nullptr;
  KvCache no_v_scale = cache.view;
  no_v_scale.v_scale = nullptr;
  KvCache three_scales = cache.view;
  three_scales.scale_count = 3;
  KvCache no_count = cache.view;
  no_count.scale_count = 0;
  KvCache misaligned = cache.view;
  misaligned.k_scale = reinterpret_cast<const float*>(reinterpret_cast<const char*>(cache.k_scale.data()) + 1);
  KvCache overlapping = cache.view;
  overlapping.v_scale = static_cast<const float*>(cache.view.k.data);
  KvCache scaled_f16 = plain.view;
  scaled_f16.k_scale = cache.view.k_scale;
  scaled_f16.v_scale = cache.view.v_scale;
  scaled_f16.scale_count = 1;
  KvCache counted_f16 = plain.view;
  counted_f16.scale_count = 1;
  for (const auto& [expected, view] : std::vector<std::pair<std::string, KvCache>>{
           {"cache.k_scale expected device fp32 scales (cache.k.dtype e4m3", no_k_scale},
           {"cache.v_scale expected device fp32 scales", no_v_scale},
           {"cache.scale_count expected 1 (per tensor) or kv_heads = 2 (per kv head), got 3", three_scales},
           {"cache.scale_count expected 1 (per tensor) or kv_heads = 2 (per kv head), got 0", no_count},
           {"cache.k_scale", misaligned},
           {"cache.v_scale", overlapping},
           {"cache.k_scale expected null (cache.k.dtype f16 is not FP8)", scaled_f16},
           {"cache.scale_count expected 0 (cache.k.dtype f16 is not FP8), got 1", counted_f16}}) {
    expect_named("attention_with_kv_cache: " + expected, attend_with(view, q.view, out.view));
    expect_named("append_kv: " + expected, append_with(view, k_new.view, v_new.view));
  }
  // Mixed dtypes: only an FP8 cache takes them, and q/out, k_new/v_new agree among themselves.
  expect_named("attention_with_kv_cache: q.dtype expected f16 (cache.k.dtype), got f32",
               attend_with(plain.view, q32.view, out.view));
  expect_named("append_kv: k_new.dtype expected f16 (cache.k.dtype), got bf16",
               append_with(plain.view, k_new.view, v_new.view));
  expect_named(
      "attention_with_kv_cache: out.dtype expected f16 (q.dtype; with an FP8 cache both are f32, f16 or "
      "bf16), got bf16",
      attend_with(cache.view, q.view, out_bf16.view));
  expect_named("append_kv: v_new.dtype expected bf16 (k_new.dtype; with an FP8 cache",
               append_with(cache.view, k_new.view, v_new16.view));
  // FP8 is a cache's format and attention()'s q, k and v together (with out 16- or 32-bit), not a
  // cache call's q, nor k and v beside a 16-bit q.
  TensorView q_fp8 = q.view;
  q_fp8.dtype = DType::e4m3;
  expect_named(
      "attention_with_kv_cache: q.dtype expected f32, f16 or bf16, got e4m3 (FP8 is for a KV cache's K "
      "and V and for attention()'s q, k and v)",
      attend_with(cache.view, q_fp8, out.view));
  TensorView k_fp8 = cache.view.k, v_fp8 = cache.view.v;
  k_fp8.shape[0] = v_fp8.shape[0] = 2;
  expect_named("attention: k.dtype expected f16 (q.dtype), got e4m3",
               [&] { attention(ctx, q.view, k_fp8, v_fp8, out.view); });
  ctx.synchronize();
  EXPECT_EQ(out.device.to_host(), out_before);
  EXPECT_EQ(out_bf16.device.to_host(), out_bf16_before);
  EXPECT_EQ(cache.k.to_host(), k_before);
  EXPECT_EQ(cache.v.to_host(), v_before);
}

}  // namespace
}  // namespace selfattn
