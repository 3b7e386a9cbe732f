#pragma once
// Kernel parameter structs: plain data, the same for nvcc and the host compiler. One struct per
// kernel, passed by value as the kernel's only argument.
#include <cstdint>

namespace selfattn::kernels {

enum class Element : uint8_t { f32, f16, bf16 };

struct FillParams {
  float* data;
  int64_t count;
  float value;
};

}  // namespace selfattn::kernels
