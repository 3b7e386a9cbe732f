#pragma once
// Kernel parameter structs: plain data, the same for nvcc and the host compiler. One struct per
// kernel, passed by value as the kernel's only argument.
#include <cstdint>

namespace selfattn::kernels {

enum class Element : uint8_t { f32, f16, bf16 };

// Which keys a query row sees: the same three rules as selfattn::Causal (types.h), applied by
// visible_keys() in causal_mask.cuh.
enum class CausalMask : uint8_t { none, top_left, bottom_right };

struct FillParams {
  float* data;
  int64_t count;
  float value;
};

}  // namespace selfattn::kernels
