#pragma once
#include <array>
#include <cstdint>

#include "selfattn/types.h"

namespace selfattn {

// A non-owning view of a 4-D tensor in device memory: shape [batch, heads, seq, head_dim] with
// explicit strides in elements, so BHSD (heads outer) and BSHD (heads interleaved, as produced by
// a projection) are both viewed without copies. Offsets are 64-bit.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  std::array<int64_t, 4> shape{};    // batch, heads, seq, head_dim
  std::array<int64_t, 4> strides{};  // elements

  int64_t batch() const { return shape[0]; }
  int64_t heads() const { return shape[1]; }
  int64_t seq() const { return shape[2]; }
  int64_t head_dim() const { return shape[3]; }
  int64_t numel() const { return shape[0] * shape[1] * shape[2] * shape[3]; }
  int64_t offset(int64_t b, int64_t h, int64_t s, int64_t d) const {
    return b * strides[0] + h * strides[1] + s * strides[2] + d * strides[3];
  }

  // Contiguous [batch, heads, seq, head_dim].
  static TensorView bhsd(void* data, DType dtype, int64_t batch, int64_t heads, int64_t seq, int64_t head_dim);
  // Contiguous [batch, seq, heads, head_dim], viewed as [batch, heads, seq, head_dim].
  static TensorView bshd(void* data, DType dtype, int64_t batch, int64_t heads, int64_t seq, int64_t head_dim);
};

// A non-owning row-major 2-D matrix in device memory (weights of self_attention).
struct MatrixView {
  void* data = nullptr;
  DType dtype = DType::f32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_stride = 0;  // elements; >= cols

  static MatrixView row_major(void* data, DType dtype, int64_t rows, int64_t cols) {
    return MatrixView{data, dtype, rows, cols, cols};
  }
};

}  // namespace selfattn
