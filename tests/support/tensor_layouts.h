#pragma once
// Where each tensor of a test call sits in memory. A kernel that reads one tensor with another's
// strides (q's row stride for k, out's head stride for dout, ...) passes every test in which all
// tensors share one layout, so by default each tensor of a call gets its own (Strides::distinct):
// its own BHSD/BSHD order and its own row gap, derived from the case's by the tensor's role. The
// gaps of inputs hold NaN (a read with a wrong stride lands in them sooner or later), and those of
// outputs must still hold their poison after the call (gaps_untouched).
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "selfattn/tensor.h"

namespace selfattn::testing {

// Where heads sit in memory: [b, h, s, d] contiguous, or [b, s, h, d] (a projection's output).
enum class Layout : uint8_t { bhsd, bshd };
const char* to_string(Layout layout);

// Which tensor of a call: the forward's four, then the backward's upstream gradient and its outputs.
enum class Role : uint8_t { q, k, v, out, dout, dq, dk, dv };
const char* to_string(Role role);

// distinct: every tensor its own layout and row gap (tensor_layout); shared: every tensor exactly
// the case's layout and row gap (slices of one packed projection, the layout many callers have).
enum class Strides : uint8_t { distinct, shared };

// One tensor's placement: the order of its dimensions and the unused elements after each row (one
// head's head_dim values), so its sequence stride exceeds the dense one.
struct TensorLayout {
  Layout layout = Layout::bhsd;
  int64_t row_gap = 0;
};

// The placement of `role` in a call whose case asks for `layout` and `row_gap`. distinct: every
// other role (k, out, dq, dv) takes the other layout, and role r adds 8 r elements to the gap -
// so any two tensors of one call differ in their row stride (and mostly in their head stride),
// while the gaps' multiples of 8 elements keep whatever 16-byte row alignment the case's gap gives
// (the tensor-core and Hopper kernels need it; a gap of 3 keeps every tensor unaligned).
TensorLayout tensor_layout(Layout layout, int64_t row_gap, Strides strides, Role role);

// The view of [batch, heads, seq, head_dim] at `data` in that placement, batches `batch_gap`
// elements apart beyond their dense blocks.
TensorView strided_view(void* data, DType dtype, int64_t batch, int64_t heads, int64_t seq, int64_t head_dim,
                        TensorLayout placement, int64_t batch_gap = 0);
// Elements of one batch block of such a view (row gaps included, batch gap not).
int64_t batch_block_elements(const TensorView& view);

// Elements from view.data to its last element, inclusive: the allocation a view needs.
size_t span_elements(const TensorView& view);
// The host image of a span_elements(view) buffer holding `values` (logical [b, h, s, d] order) at
// the view's offsets, 0xFF bytes (NaN in every dtype) everywhere else; rows where `nan_row(b, h, s)`
// is true hold NaN too (rows no sequence owns). And the reverse: the elements read back in logical order.
std::vector<unsigned char> strided_image(const TensorView& view, const std::vector<double>& values,
                                         bool (*nan_row)(const void* context, int64_t b, int64_t h, int64_t s) = nullptr,
                                         const void* context = nullptr);
std::vector<float> logical_values(const std::vector<unsigned char>& image, const TensorView& view);

// Fails naming `what` unless every byte of `bytes` outside the view's elements is still 0xFF (the
// poison written before the call). `bytes` holds the view's batch blocks back to back: element
// (b, h, s, d) at b * batch_block_elements(view) + view.offset(0, h, s, d).
::testing::AssertionResult gaps_untouched(const std::vector<unsigned char>& bytes, const TensorView& view,
                                          const std::string& what);

}  // namespace selfattn::testing
