#include "tensor_layouts.h"

#include <algorithm>
#include <cmath>

#include "attention_harness.h"  // store_element, load_element

namespace selfattn::testing {

const char* to_string(Layout layout) { return layout == Layout::bhsd ? "bhsd" : "bshd"; }

const char* to_string(Role role) {
  static const char* const names[] = {"q", "k", "v", "out", "dout", "dq", "dk", "dv"};
  return names[int(role)];
}

TensorLayout tensor_layout(Layout layout, int64_t row_gap, Strides strides, Role role) {
  if (strides == Strides::shared) return {layout, row_gap};
  const int r = int(role);
  const Layout other = layout == Layout::bhsd ? Layout::bshd : Layout::bhsd;
  return {r % 2 ? other : layout, row_gap + 8 * r};
}

TensorView strided_view(void* data, DType dtype, int64_t batch, int64_t heads, int64_t seq, int64_t head_dim,
                        TensorLayout placement, int64_t batch_gap) {
  TensorView view;
  view.data = data;
  view.dtype = dtype;
  view.shape = {batch, heads, seq, head_dim};
  int64_t block = 0;
  if (placement.layout == Layout::bhsd) {
    const int64_t row = head_dim + placement.row_gap;
    view.strides = {0, seq * row, row, 1};
    block = heads * seq * row;
  } else {
    const int64_t row = heads * head_dim + placement.row_gap;
    view.strides = {0, head_dim, row, 1};
    block = seq * row;
  }
  view.strides[0] = block + batch_gap;
  return view;
}

int64_t batch_block_elements(const TensorView& view) {
  // The outer of the head and sequence dimensions spans the block (both layouts end with a full
  // row gap); with one head or one row the two strides may tie, so take the larger span.
  if (view.shape[1] == 0 || view.shape[2] == 0) return 0;
  return std::max(view.strides[1] * view.shape[1], view.strides[2] * view.shape[2]);
}

size_t span_elements(const TensorView& view) {
  if (view.numel() == 0) return 0;
  int64_t last = 0;
  for (int i = 0; i < 4; ++i) last += (view.shape[i] - 1) * view.strides[i];
  return size_t(last + 1);
}

std::vector<unsigned char> strided_image(const TensorView& view, const std::vector<double>& values,
                                         bool (*nan_row)(const void* context, int64_t b, int64_t h, int64_t s),
                                         const void* context) {
  std::vector<unsigned char> image(span_elements(view) * dtype_size(view.dtype), 0xFF);
  size_t n = 0;
  for (int64_t b = 0; b < view.batch(); ++b)
    for (int64_t h = 0; h < view.heads(); ++h)
      for (int64_t s = 0; s < view.seq(); ++s) {
        const bool nan = nan_row != nullptr && nan_row(context, b, h, s);
        for (int64_t d = 0; d < view.head_dim(); ++d, ++n)
          store_element(image.data(), view.dtype, size_t(view.offset(b, h, s, d)), nan ? NAN : float(values[n]));
      }
  return image;
}

std::vector<float> logical_values(const std::vector<unsigned char>& image, const TensorView& view) {
  std::vector<float> values;
  values.reserve(size_t(view.numel()));
  for (int64_t b = 0; b < view.batch(); ++b)
    for (int64_t h = 0; h < view.heads(); ++h)
      for (int64_t s = 0; s < view.seq(); ++s)
        for (int64_t d = 0; d < view.head_dim(); ++d)
          values.push_back(load_element(image.data(), view.dtype, size_t(view.offset(b, h, s, d))));
  return values;
}

::testing::AssertionResult gaps_untouched(const std::vector<unsigned char>& bytes, const TensorView& view,
                                          const std::string& what) {
  const size_t element = dtype_size(view.dtype), block = size_t(batch_block_elements(view));
  std::vector<bool> is_element(bytes.size() / element, false);
  for (int64_t b = 0; b < view.batch(); ++b)
    for (int64_t h = 0; h < view.heads(); ++h)
      for (int64_t s = 0; s < view.seq(); ++s)
        for (int64_t d = 0; d < view.head_dim(); ++d) {
          const size_t at = size_t(b) * block + size_t(view.offset(0, h, s, d));
          if (at < is_element.size()) is_element[at] = true;
        }
  for (size_t e = 0; e < is_element.size(); ++e)
    for (size_t byte = 0; byte < element && !is_element[e]; ++byte)
      if (bytes[e * element + byte] != 0xFF)
        return ::testing::AssertionFailure() << "element " << e << " of " << what
                                             << "'s gaps (outside its elements) was written";
  return ::testing::AssertionSuccess();
}

}  // namespace selfattn::testing
