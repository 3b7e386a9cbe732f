// Host-side element conversions (f32 <-> f16 / bf16 bits, loads and stores of one element of a
// dtype, rounding to a dtype) and random device values, declared in attention_harness.h.
#include "attention_harness.h"
#include "selfattn/reference.h"

#include <cmath>
#include <random>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace selfattn::testing {

uint16_t float_to_half_bits(float x) {
  return __half_raw(__float2half_rn(x)).x;
}
uint16_t float_to_bf16_bits(float x) {
  return __nv_bfloat16_raw(__float2bfloat16_rn(x)).x;
}
float half_bits_to_float(uint16_t bits) {
  __half_raw raw;
  raw.x = bits;
  return __half2float(__half(raw));
}
float bf16_bits_to_float(uint16_t bits) {
  __nv_bfloat16_raw raw;
  raw.x = bits;
  return __bfloat162float(__nv_bfloat16(raw));
}

void store_element(void* bytes, DType dtype, size_t index, float value) {
  switch (dtype) {
    case DType::f32: static_cast<float*>(bytes)[index] = value; return;
    case DType::f16: static_cast<uint16_t*>(bytes)[index] = float_to_half_bits(value); return;
    case DType::bf16: static_cast<uint16_t*>(bytes)[index] = float_to_bf16_bits(value); return;
    case DType::b8: static_cast<uint8_t*>(bytes)[index] = value == -INFINITY ? 0 : 1; return;  // a mask
    case DType::e4m3:
    case DType::e5m2: static_cast<uint8_t*>(bytes)[index] = reference::fp8_code(dtype, value); return;
  }
}

float load_element(const void* bytes, DType dtype, size_t index) {
  switch (dtype) {
    case DType::f32: return static_cast<const float*>(bytes)[index];
    case DType::f16: return half_bits_to_float(static_cast<const uint16_t*>(bytes)[index]);
    case DType::bf16: return bf16_bits_to_float(static_cast<const uint16_t*>(bytes)[index]);
    case DType::b8: return static_cast<const uint8_t*>(bytes)[index] != 0 ? 0.0f : -INFINITY;
    case DType::e4m3:
    case DType::e5m2: return float(reference::fp8_value(dtype, static_cast<const uint8_t*>(bytes)[index]));
  }
  return 0;
}

double fp8_descale(Role role, int b, int g) {
  static constexpr double kDescales[] = {0.375, 0.625, 0.75, 1.25, 2.5};
  return kDescales[size_t(3 * b + 2 * g + int(role)) % 5];
}

float round_to(DType dtype, float value) {
  switch (dtype) {
    case DType::f32: return value;
    case DType::f16: return half_bits_to_float(float_to_half_bits(value));
    case DType::bf16: return bf16_bits_to_float(float_to_bf16_bits(value));
    case DType::b8: return value == -INFINITY ? value : 0.0f;  // what a mask byte stands for
    case DType::e4m3:
    case DType::e5m2: return float(reference::fp8_round(dtype, value));
  }
  return value;
}

DeviceBuffer<unsigned char> random_device_values(Context& ctx, DType dtype, size_t count, std::mt19937_64& rng,
                                                 const char* label) {
  std::vector<unsigned char> host(count * dtype_size(dtype));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t i = 0; i < count; ++i) store_element(host.data(), dtype, i, round_to(dtype, normal(rng)));
  DeviceBuffer<unsigned char> buffer(ctx, host.size(), label);
  buffer.copy_from_host(host);
  return buffer;
}

}  // namespace selfattn::testing
