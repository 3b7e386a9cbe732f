// Names of the public enums, element sizes and the TensorView layouts.
#include "selfattn/error.h"
#include "selfattn/tensor.h"
#include "selfattn/types.h"

#include <string>

namespace selfattn {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::b8: return 1;
    case DType::e4m3: return 1;
    case DType::e5m2: return 1;
  }
  throw InvalidArgument("dtype: expected f32, f16, bf16, b8, e4m3 or e5m2, got value " + std::to_string(int(dtype)));
}

const char* to_string(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::b8: return "b8";
    case DType::e4m3: return "e4m3";
    case DType::e5m2: return "e5m2";
  }
  return "unknown dtype";
}

const char* to_string(Backend backend) {
  switch (backend) {
    case Backend::cuda: return "cuda";
    case Backend::sim: return "sim";
  }
  return "unknown backend";
}

const char* to_string(Path path) {
  switch (path) {
    case Path::automatic: return "automatic";
    case Path::naive: return "naive";
    case Path::cublas: return "cublas";
    case Path::fused: return "fused";
  }
  return "unknown path";
}

const char* to_string(Causal causal) {
  switch (causal) {
    case Causal::none: return "none";
    case Causal::top_left: return "top_left";
    case Causal::bottom_right: return "bottom_right";
  }
  return "unknown causal";
}

TensorView TensorView::bhsd(void* data, DType dtype, int64_t batch, int64_t heads, int64_t seq, int64_t head_dim) {
  return TensorView{data, dtype, {batch, heads, seq, head_dim}, {heads * seq * head_dim, seq * head_dim, head_dim, 1}};
}

TensorView TensorView::bshd(void* data, DType dtype, int64_t batch, int64_t heads, int64_t seq, int64_t head_dim) {
  // Memory order batch, seq, heads, head_dim; the view's order stays batch, heads, seq, head_dim.
  return TensorView{data, dtype, {batch, heads, seq, head_dim}, {seq * heads * head_dim, head_dim, heads * head_dim, 1}};
}

}  // namespace selfattn
