// What only the cublas path has: declining views that cannot be a cuBLAS leading dimension. Its
// correctness sweeps, shared with the naive path, are in test_score_paths.cpp.
#include <gtest/gtest.h>

#include <string>

#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

// K and V broadcast along seq (stride 0) are valid views, but no cuBLAS leading dimension: the
// cublas path declines (automatic then picks another path) instead of failing inside cuBLAS.
TEST(CublasPath, DeclinesOverlappingRows) {
  Context ctx;
  DeviceBuffer<float> q(ctx, 4 * 2), kv(ctx, 2), out(ctx, 4 * 2);
  TensorView k = TensorView::bhsd(kv.data(), DType::f32, 1, 1, 9, 2);
  k.strides[2] = 0;
  AttentionOptions options;
  options.path = Path::cublas;
  EXPECT_THROW(attention(ctx, TensorView::bhsd(q.data(), DType::f32, 1, 1, 4, 2), k, k,
                         TensorView::bhsd(out.data(), DType::f32, 1, 1, 4, 2), options),
               NotAvailable);
}

}  // namespace
}  // namespace selfattn
