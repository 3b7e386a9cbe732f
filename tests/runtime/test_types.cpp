// Enum names, element sizes and the two tensor layouts.
#include <string>

#include <gtest/gtest.h>

#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

TEST(Types, NamesAndSizes) {
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::f16), 2u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_STREQ(to_string(DType::bf16), "bf16");
  EXPECT_STREQ(to_string(Backend::sim), "sim");
  EXPECT_STREQ(to_string(Backend::cuda), "cuda");
  EXPECT_STREQ(to_string(Path::automatic), "automatic");
  EXPECT_STREQ(to_string(Path::fused), "fused");
  EXPECT_STREQ(to_string(Causal::bottom_right), "bottom_right");
  EXPECT_THROW(dtype_size(DType(9)), InvalidArgument);
}

TEST(Types, BhsdIsContiguousHeadsOuter) {
  int dummy = 0;
  const TensorView t = TensorView::bhsd(&dummy, DType::f16, 2, 3, 5, 7);
  EXPECT_EQ(t.shape, (std::array<int64_t, 4>{2, 3, 5, 7}));
  EXPECT_EQ(t.strides, (std::array<int64_t, 4>{105, 35, 7, 1}));
  EXPECT_EQ(t.numel(), 210);
  EXPECT_EQ(t.offset(1, 2, 4, 6), 209);  // the last element
}

TEST(Types, BshdInterleavesHeadsWithinEachToken) {
  int dummy = 0;
  const TensorView t = TensorView::bshd(&dummy, DType::f32, 2, 3, 5, 7);
  EXPECT_EQ(t.shape, (std::array<int64_t, 4>{2, 3, 5, 7}));
  // Memory order [b, s, h, d]: token s of batch b starts at (b * 5 + s) * 21, head h at + h * 7.
  EXPECT_EQ(t.strides, (std::array<int64_t, 4>{105, 7, 21, 1}));
  EXPECT_EQ(t.offset(1, 2, 4, 6), (1 * 5 + 4) * 21 + 2 * 7 + 6);
}

TEST(Types, OffsetsAre64Bit) {
  int dummy = 0;
  const TensorView t = TensorView::bhsd(&dummy, DType::f16, 1, 64, 1 << 20, 128);
  EXPECT_EQ(t.numel(), int64_t(1) << 33);
  EXPECT_EQ(t.offset(0, 63, 0, 0), int64_t(63) << 27);
}

}  // namespace
}  // namespace selfattn
