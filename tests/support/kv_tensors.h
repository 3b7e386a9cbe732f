#pragma once
// Device tensors of the KV-cache tests (kv_cache_check.h includes this): each tensor in its own
// layout, random inputs with NaN padding, poisoned outputs read back with their padding checked.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "attention_harness.h"
#include "selfattn/selfattn.h"

namespace selfattn::kv_test {

using testing::load_element;
using testing::round_to;
using testing::store_element;

// How one tensor of a call lies in memory: heads outer (BHSD) or interleaved (BSHD), with `row_pad`
// spare elements after each row's head_dim (a row stride that is not the packed one, as in a
// slice of a wider projection). Every tensor of a call gets its own (the defaults below differ
// pairwise), so a kernel or host that reads one tensor with another's strides reads the wrong
// elements - padding holds NaN in inputs and must stay untouched in outputs.
struct Layout {
  bool head_major = true;
  int row_pad = 0;

  std::string name() const { return std::string(head_major ? "bhsd" : "bshd") + (row_pad ? "+" + std::to_string(row_pad) : ""); }
  // A view of [batch, heads, seq, d] at `data` in this layout.
  TensorView view(void* data, DType dtype, int64_t batch, int64_t heads, int64_t seq, int64_t d) const {
    TensorView v = TensorView::bhsd(data, dtype, batch, heads, seq, d);
    const int64_t row = d + row_pad;
    v.strides = head_major ? std::array<int64_t, 4>{heads * seq * row, seq * row, row, 1}
                           : std::array<int64_t, 4>{seq * heads * row, row, heads * row, 1};
    return v;
  }
  size_t elements(int64_t batch, int64_t heads, int64_t seq, int64_t d) const {
    return size_t(batch) * size_t(heads) * size_t(seq) * size_t(d + row_pad);
  }
};

// The default layout of each role. Pads are multiples of 8 elements, so f16/bf16 rows stay on 16
// bytes and the tensor-core decode kernel and 16-byte loads still take the call; cases that need
// other pads say so.
inline constexpr Layout kQueryLayout{/*head_major=*/false, /*row_pad=*/8};
inline constexpr Layout kOutLayout{/*head_major=*/true, /*row_pad=*/16};
inline constexpr Layout kNewKeysLayout{/*head_major=*/false, /*row_pad=*/16};
inline constexpr Layout kNewValuesLayout{/*head_major=*/true, /*row_pad=*/24};
// Packed BHSD: for tests about something else that view parts of a tensor by hand.
inline constexpr Layout kPacked{};
// merge_states: out_a as an attention output, out_b and the merged out each their own.
inline constexpr Layout kMergeALayout = kOutLayout;
inline constexpr Layout kMergeBLayout{/*head_major=*/false, /*row_pad=*/8};
inline constexpr Layout kMergedLayout{/*head_major=*/true, /*row_pad=*/24};
// A cache's K in the order its spec names, V in the other, with different pads (CacheSpec).
inline constexpr int kCacheKeysPad = 8, kCacheValuesPad = 24;

// Random values rounded to the dtype, as doubles (BHSD order, packed) and as device bytes in
// `layout` (padding NaN: a kernel that reads it, or reads with another tensor's strides, is caught).
struct Tensor {
  DType dtype = DType::f32;
  std::vector<double> values;
  DeviceBuffer<unsigned char> device;
  TensorView view;
};

inline Tensor random_tensor(Context& ctx, DType dtype, int batch, int heads, int seq, int d, std::mt19937_64& rng,
                            Layout layout) {
  Tensor t;
  t.dtype = dtype;
  const size_t count = size_t(batch) * heads * seq * d;
  std::vector<unsigned char> host(std::max<size_t>(layout.elements(batch, heads, seq, d), 1) * dtype_size(dtype), 0xff);
  const TensorView at = layout.view(nullptr, dtype, batch, heads, seq, d);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  t.values.resize(count);
  size_t i = 0;
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < heads; ++h)
      for (int s = 0; s < seq; ++s)
        for (int e = 0; e < d; ++e, ++i) {
          t.values[i] = round_to(dtype, uniform(rng));
          store_element(host.data(), dtype, size_t(at.offset(b, h, s, e)), float(t.values[i]));
        }
  t.device = DeviceBuffer<unsigned char>(ctx, host.size(), "kv test tensor");
  t.device.copy_from_host(host);
  t.view = layout.view(t.device.data(), dtype, batch, heads, seq, d);
  return t;
}

// Packed BHSD, for the tests outside the KV-cache family that share these helpers and view the
// data by hand (test_fused_varlen_metadata.cpp); the KV-cache tests name each tensor's layout.
inline Tensor random_tensor(Context& ctx, DType dtype, int batch, int heads, int seq, int d, std::mt19937_64& rng) {
  return random_tensor(ctx, dtype, batch, heads, seq, d, rng, kPacked);
}

// A poisoned (all 0xff bytes: NaN in every dtype) output of `count` elements.
inline DeviceBuffer<unsigned char> poisoned(Context& ctx, DType dtype, size_t count) {
  DeviceBuffer<unsigned char> buffer(ctx, std::max<size_t>(count, 1) * dtype_size(dtype), "kv test output");
  buffer.fill_bytes(0xff);
  return buffer;
}

inline std::vector<float> download(const DeviceBuffer<unsigned char>& buffer, DType dtype, size_t count) {
  const std::vector<unsigned char> bytes = buffer.to_host();
  std::vector<float> values(count);
  for (size_t i = 0; i < count; ++i) values[i] = load_element(bytes.data(), dtype, i);
  return values;
}

// A poisoned output [batch, heads, seq, d] in `layout`.
struct Output {
  DeviceBuffer<unsigned char> device;
  TensorView view;
};

inline Output poisoned_output(Context& ctx, DType dtype, int batch, int heads, int seq, int d, Layout layout) {
  Output o;
  o.device = poisoned(ctx, dtype, layout.elements(batch, heads, seq, d));
  o.view = layout.view(o.device.data(), dtype, batch, heads, seq, d);
  return o;
}

// An output read back in BHSD order (as the reference lays results out); fails, naming the first
// such element, when anything outside the view's elements (its row padding) was written.
inline ::testing::AssertionResult download_output(const std::string& what, const DeviceBuffer<unsigned char>& device,
                                                  const TensorView& view, std::vector<float>& values) {
  const std::vector<unsigned char> bytes = device.to_host();
  const size_t element = dtype_size(view.dtype);
  std::vector<char> inside(bytes.size() / element, 0);
  values.clear();
  for (int64_t b = 0; b < view.batch(); ++b)
    for (int64_t h = 0; h < view.heads(); ++h)
      for (int64_t s = 0; s < view.seq(); ++s)
        for (int64_t e = 0; e < view.head_dim(); ++e) {
          const size_t at = size_t(view.offset(b, h, s, e));
          inside[at] = 1;
          values.push_back(load_element(bytes.data(), view.dtype, at));
        }
  for (size_t i = 0; i < inside.size(); ++i) {
    if (inside[i]) continue;
    for (size_t byte = 0; byte < element; ++byte)
      if (bytes[i * element + byte] != 0xff)
        return ::testing::AssertionFailure() << what << ": element " << i << " (padding, no element of the view) was written";
  }
  return ::testing::AssertionSuccess();
}

}  // namespace selfattn::kv_test
