// The benchmark's inputs: random values in each case's dtype and layout (kept for the paths that
// share the shape), rotated among several copies so a timed repeat does not find them in L2; the
// bias and the FP8 codes with their descales; the host copies --check compares with.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "accuracy.h"
#include "bench.h"
#include "inputs.h"
#include "selfattn/reference.h"

namespace selfattn_bench {

// Device representation of a float already rounded to the dtype (the toolkit's host conversions,
// round to nearest even).
uint16_t to_half_bits(float x, DType dtype) {
  if (dtype == DType::bf16) return __nv_bfloat16_raw(__float2bfloat16_rn(x)).x;
  return __half_raw(__float2half_rn(x)).x;
}
float from_half_bits(uint16_t bits, DType dtype) {
  if (dtype == DType::bf16) {
    __nv_bfloat16_raw raw;
    raw.x = bits;
    return __bfloat162float(__nv_bfloat16(raw));
  }
  __half_raw raw;
  raw.x = bits;
  return __half2float(__half(raw));
}
float round_to(float x, DType dtype) { return dtype == DType::f32 ? x : from_half_bits(to_half_bits(x, dtype), dtype); }

namespace {

// Copies of the input set rotated while timing: enough that the set in use was evicted from L2 by
// the others (twice L2 between reuses), at least 2 so the rotation is always exercised, and at
// most 64 so tiny shapes do not allocate thousands of buffers.
constexpr int kMinCopies = 2, kMaxCopies = 64;
constexpr double kL2Multiple = 2.0;

// Element (b, h, s, x) of a [batch, heads, seq, head_dim] tensor stored in `layout`.
int64_t layout_offset(Layout layout, int64_t b, int64_t h, int64_t s, int64_t x, int64_t heads, int64_t seq,
                      int64_t head_dim) {
  return layout == Layout::bhsd ? ((b * heads + h) * seq + s) * head_dim + x : ((b * seq + s) * heads + h) * head_dim + x;
}

// splitmix64 + Box-Muller: normal(0, 1) values fast enough for 100M-element inputs.
struct NormalSource {
  uint64_t state;
  bool has_spare = false;
  float spare = 0;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float operator()() {
    if (has_spare) {
      has_spare = false;
      return spare;
    }
    const double u1 = (double(next() >> 11) + 1.0) * 0x1.0p-53, u2 = double(next() >> 11) * 0x1.0p-53;
    const double r = std::sqrt(-2.0 * std::log(u1)), t = 6.283185307179586 * u2;
    spare = float(r * std::sin(t));
    has_spare = true;
    return float(r * std::cos(t));
  }
};

// One tensor's device bytes in the case's layout and dtype, from host floats in BHSD order.
std::vector<unsigned char> to_device_bytes(const std::vector<float>& bhsd, Layout layout, DType dtype, int64_t batch,
                                           int64_t heads, int64_t seq, int64_t head_dim) {
  const size_t elem = selfattn::dtype_size(dtype);
  std::vector<unsigned char> bytes(bhsd.size() * elem);
  int64_t i = 0;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t s = 0; s < seq; ++s)
        for (int64_t x = 0; x < head_dim; ++x, ++i) {
          const int64_t at = layout_offset(layout, b, h, s, x, heads, seq, head_dim) * int64_t(elem);
          if (dtype == DType::f32) {
            std::memcpy(&bytes[at], &bhsd[i], 4);
          } else {
            const uint16_t bits = to_half_bits(bhsd[i], dtype);
            std::memcpy(&bytes[at], &bits, 2);
          }
        }
  return bytes;
}

}  // namespace

std::vector<float> from_device_bytes(const std::vector<unsigned char>& bytes, const Case& c, int row_length) {
  const size_t elem = selfattn::dtype_size(c.dtype);
  std::vector<float> bhsd(bytes.size() / elem);
  int64_t i = 0;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.heads; ++h)
      for (int64_t s = 0; s < c.seq_q; ++s)
        for (int64_t x = 0; x < row_length; ++x, ++i) {
          const int64_t at = layout_offset(c.layout, b, h, s, x, c.heads, c.seq_q, row_length) * int64_t(elem);
          if (c.dtype == DType::f32) {
            std::memcpy(&bhsd[i], &bytes[at], 4);
          } else {
            uint16_t bits;
            std::memcpy(&bits, &bytes[at], 2);
            bhsd[i] = from_half_bits(bits, c.dtype);
          }
        }
  return bhsd;
}

namespace {

// FP8 inputs (--dtype e4m3|e5m2): tensor `which` (0 q, 1 k, 2 v; `heads`, `seq`, `cols` its extents) as
// device codes in the case's layout, each normal(0, 1) value over its (batch, kv head)'s descale
// rounded as the formats define it (reference::fp8_code); `values` (BHSD) receives what the
// library reads, each code's value x its descale, for --check.
template <class Normal>
std::vector<unsigned char> fp8_inputs(const Case& c, int which, int heads, int seq, int cols, Normal& normal,
                                      std::vector<float>& values) {
  std::vector<unsigned char> codes(values.size());
  const int group = which == 0 ? c.heads / c.kv_heads : 1;  // q head h reads kv head h / group
  size_t i = 0;
  for (int b = 0; b < c.batch; ++b)
    for (int h = 0; h < heads; ++h) {
      const float descale = fp8_descale(which, b, h / group);
      for (int s = 0; s < seq; ++s)
        for (int x = 0; x < cols; ++x, ++i) {
          const uint8_t code = selfattn::reference::fp8_code(c.dtype, double(normal()) / double(descale));
          values[i] = float(selfattn::reference::fp8_value(c.dtype, code) * double(descale));
          codes[size_t(layout_offset(c.layout, b, h, s, x, heads, seq, cols))] = code;
        }
    }
  return codes;
}

bool same_shape(const Case& a, const Case& b) {
  return a.dtype == b.dtype && a.batch == b.batch && a.heads == b.heads && a.kv_heads == b.kv_heads &&
         a.seq_q == b.seq_q && a.seq_k == b.seq_k && a.head_dim == b.head_dim && v_dim(a) == v_dim(b) &&
         a.layout == b.layout;
}

}  // namespace

// The case's bias as a device view over `storage` (filled here), in out's dtype (the input dtype,
// or bf16 beside FP8 inputs).
selfattn::TensorView make_bias(selfattn::Context& ctx, const Case& c, selfattn::DeviceBuffer<unsigned char>& storage) {
  const int batch = c.mods.bias == BiasKind::heads ? 1 : c.batch;
  const int heads = c.mods.bias == BiasKind::batch ? 1 : c.heads;
  const DType dtype = out_dtype(c);
  const size_t elem = selfattn::dtype_size(dtype);
  std::vector<unsigned char> bytes(size_t(batch) * heads * c.seq_q * c.seq_k * elem);
  size_t at = 0;
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < heads; ++h)
      for (int row = 0; row < c.seq_q; ++row)
        for (int key = 0; key < c.seq_k; ++key, at += elem) {
          const float x = bias_value(c, b, h, row, key);
          if (dtype == DType::f32) {
            std::memcpy(&bytes[at], &x, 4);
          } else {
            const uint16_t bits = to_half_bits(x, dtype);
            std::memcpy(&bytes[at], &bits, 2);
          }
        }
  storage = selfattn::DeviceBuffer<unsigned char>(ctx, std::max<size_t>(bytes.size(), 1), "bench bias");
  storage.copy_from_host(bytes);
  return selfattn::TensorView::bhsd(storage.data(), dtype, batch, heads, c.seq_q, c.seq_k);
}


float bias_value(const Case& c, int b, int h, int row, int key) {
  if (c.mods.bias == BiasKind::heads) b = 0;
  if (c.mods.bias == BiasKind::batch) h = 0;
  // Structure of about one unit, varying with the distance, the head and the batch.
  // In out's dtype: FP8 inputs take a bias in out's (attention.h), any other case in its dtype.
  return round_to(0.5f * std::sin(0.37f * float(row - key) + 0.9f * float(h) + 1.7f * float(b)), out_dtype(c));
}

float fp8_descale(int which, int b, int g) {
  static const float steps[] = {0.375f, 0.5f, 0.625f, 0.75f};
  return steps[(which + b + g) % 4] / 16;  // |normal| <= 6 over 0.375 / 16: 256, below e4m3's 448
}

void add_backward_buffers(selfattn::Context& ctx, InputCache::Inputs& in) {
  if (!in.dout.empty()) return;
  const Case& c = in.shape;
  NormalSource normal{0xD0D0ull ^ uint64_t(in.q.size())};
  in.dout.resize(size_t(c.batch) * c.heads * c.seq_q * v_dim(c));  // out's shape
  for (float& x : in.dout) x = round_to(normal(), c.dtype);
  const auto dout_bytes = to_device_bytes(in.dout, c.layout, c.dtype, c.batch, c.heads, c.seq_q, v_dim(c));
  const size_t elem = selfattn::dtype_size(c.dtype);
  for (InputCache::Inputs::Set& set : in.sets) {
    set.dout = {ctx, dout_bytes.size(), "bench dout"};
    set.dout.copy_from_host(dout_bytes);
    set.dq = {ctx, in.q.size() * elem, "bench dq"};
    set.dk = {ctx, in.k.size() * elem, "bench dk"};
    set.dv = {ctx, in.v.size() * elem, "bench dv"};
    set.lse = {ctx, std::max<size_t>(size_t(c.batch) * c.heads * c.seq_q, 1), "bench lse"};
  }
}

InputCache::InputCache() = default;
InputCache::~InputCache() = default;

InputCache::Inputs& InputCache::get(selfattn::Context& ctx, const Case& c) {
  if (inputs_ && same_shape(inputs_->shape, c)) return *inputs_;
  inputs_.reset();  // free the previous shape's device memory before allocating this one's
  auto in = std::make_unique<Inputs>();
  in->shape = c;
  const int64_t q_elems = int64_t(c.batch) * c.heads * c.seq_q * c.head_dim;
  const int64_t kv_elems = int64_t(c.batch) * c.kv_heads * c.seq_k * c.head_dim;
  NormalSource normal{0xA77E5710ull ^ (uint64_t(q_elems) << 20) ^ uint64_t(kv_elems)};
  std::vector<std::vector<unsigned char>> bytes;
  int which = 0;
  for (auto* t : {&in->q, &in->k, &in->v}) {
    const int heads = t == &in->q ? c.heads : c.kv_heads, seq = t == &in->q ? c.seq_q : c.seq_k;
    const int cols = t == &in->v ? v_dim(c) : c.head_dim;
    t->resize(size_t(c.batch) * heads * seq * cols);
    if (is_fp8(c.dtype)) {
      bytes.push_back(fp8_inputs(c, which, heads, seq, cols, normal, *t));
    } else {
      for (float& x : *t) x = round_to(normal(), c.dtype);
      bytes.push_back(to_device_bytes(*t, c.layout, c.dtype, c.batch, heads, seq, cols));
    }
    ++which;
  }
  if (is_fp8(c.dtype)) {
    std::vector<float> descales;
    for (int w = 0; w < 3; ++w)
      for (int b = 0; b < c.batch; ++b)
        for (int g = 0; g < c.kv_heads; ++g) descales.push_back(fp8_descale(w, b, g));
    in->descales = selfattn::DeviceBuffer<float>(ctx, descales.size(), "bench descales");
    in->descales.copy_from_host(descales);
  }
  const size_t out_bytes = size_t(c.batch) * c.heads * c.seq_q * v_dim(c) * selfattn::dtype_size(out_dtype(c));
  const size_t set_bytes = bytes[0].size() + bytes[1].size() + bytes[2].size() + out_bytes;
  const size_t l2 = device_l2_bytes(ctx);
  int copies = kMinCopies;
  if (l2 > 0) copies = int(std::clamp(std::ceil(kL2Multiple * double(l2) / double(set_bytes)), double(kMinCopies), double(kMaxCopies)));
  const auto& q_bytes = bytes[0];
  const auto& k_bytes = bytes[1];
  const auto& v_bytes = bytes[2];
  for (int i = 0; i < copies; ++i) {
    Inputs::Set set;
    set.q = {ctx, q_bytes.size(), "bench q"};
    set.k = {ctx, k_bytes.size(), "bench k"};
    set.v = {ctx, v_bytes.size(), "bench v"};
    set.out = {ctx, out_bytes, "bench out"};
    set.q.copy_from_host(q_bytes);
    set.k.copy_from_host(k_bytes);
    set.v.copy_from_host(v_bytes);
    in->sets.push_back(std::move(set));
  }
  inputs_ = std::move(in);
  return *inputs_;
}

}  // namespace selfattn_bench
