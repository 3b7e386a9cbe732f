// The harness's device tensors and operands (harness_tensors.h).
#include "harness_tensors.h"

#include <algorithm>
#include <cmath>

namespace selfattn::testing::harness {

DType stored_dtype(const AttentionCase& c, Role role) {
  const bool input = role == Role::q || role == Role::k || role == Role::v;
  return input && c.fp8 ? *c.fp8 : c.dtype;
}

// q and k have the case's head_dim, v and out its v_dim().
int head_dim_of(const AttentionCase& c, Role role) { return role == Role::v || role == Role::out ? c.v_dim() : c.head_dim; }

DeviceTensor make_tensor(Context& ctx, const AttentionCase& c, Role role, int heads, int seq, const char* label) {
  DeviceTensor t;
  const DType dtype = stored_dtype(c, role);
  t.element = dtype_size(dtype);
  t.misalign_bytes = size_t(c.misalign) * t.element;
  t.view = strided_view(nullptr, dtype, c.batch, heads, seq, head_dim_of(c, role),
                        tensor_layout(c.layout, c.row_gap, c.strides, role), c.batch_gap);
  const int64_t block = batch_block_elements(t.view);
  t.batch_bytes = size_t(block) * t.element;
  const size_t bytes = c.batch > 0 ? size_t(int64_t(c.batch - 1) * t.view.strides[0] + block) * t.element : 0;
  t.device = DeviceBuffer<unsigned char>(ctx, std::max<size_t>(t.misalign_bytes + bytes, 1), label);
  t.view.data = t.device.data() + t.misalign_bytes;
  return t;
}

// Index of element (b, h, s, d) in the host copy: the batches' blocks back to back.
std::string values_name(const char* label, const std::vector<int32_t>& values) {
  if (values.empty()) return "";
  std::string s = std::string(" ") + label + "=[";
  for (size_t i = 0; i < values.size(); ++i) s += (i ? "," : "") + std::to_string(values[i]);
  return s + "]";
}

const int32_t* upload_ints(Context& ctx, DeviceBuffer<int32_t>& buffer, const std::vector<int32_t>& values,
                           const char* label) {
  if (values.empty()) return nullptr;
  buffer = DeviceBuffer<int32_t>(ctx, values.size(), label);
  buffer.copy_from_host(values);
  return buffer.data();
}

size_t host_index(const DeviceTensor& t, int b, int h, int s, int d) {
  return b * (t.batch_bytes / t.element) + size_t(t.view.offset(0, h, s, d));
}

void upload(DeviceTensor& t, const std::vector<unsigned char>& host, int batch) {
  for (int b = 0; b < batch; ++b)
    t.device.copy_from_host(host.data() + b * t.batch_bytes, t.batch_bytes, t.batch_offset_bytes(b));
}

std::vector<unsigned char> download(const DeviceTensor& t, int batch) {
  std::vector<unsigned char> host(t.batch_bytes * size_t(batch));
  for (int b = 0; b < batch; ++b)
    t.device.copy_to_host(host.data() + b * t.batch_bytes, t.batch_bytes, t.batch_offset_bytes(b));
  return host;
}

Operand make_operand(Context& ctx, const AttentionCase& c, Role role, int heads, int seq, std::mt19937_64& rng,
                     const char* label, Keys keys, bool padded_rows, int unowned_rows) {
  Operand op;
  op.tensor = make_tensor(ctx, c, role, heads, seq, label);
  const int head_dim = head_dim_of(c, role);
  const size_t count = size_t(c.batch) * heads * seq * head_dim;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // 0xFF bytes: NaN in every dtype in the row gaps, which no kernel may read.
  std::vector<unsigned char> host(op.tensor.batch_bytes * size_t(c.batch), 0xFF);
  std::vector<float> first_row(static_cast<size_t>(head_dim));
  op.logical.resize(count);
  size_t i = 0;
  for (int b = 0; b < c.batch; ++b)
    for (int h = 0; h < heads; ++h) {
      if (keys == Keys::rising)
        for (float& x : first_row) x = normal(rng);
      for (int s = 0; s < seq; ++s)
        for (int d = 0; d < head_dim; ++d, ++i) {
          const float drawn = keys == Keys::rising ? float(first_row[d] * (1 + kRisingKeyStep * s)) : normal(rng);
          const float value = round_to(stored_dtype(c, role), drawn);
          op.logical[i] = value;
          // Keys past a batch's key length are padding nobody may use: NaN on the device (what
          // an inference engine's unused cache rows may hold), so a kernel that multiplies a zero
          // probability by such a row's V, or lets it into a score, fails.
          // Keys before a key_start are padding too (left padding).
          const bool padding = (padded_rows && !c.key_lengths.empty() && s >= std::max(c.key_lengths[size_t(b)], 0)) ||
                               (padded_rows && !c.key_start.empty() && s < c.key_start[size_t(b)]) ||
                               s >= seq - unowned_rows;
          if (s >= seq - unowned_rows) op.logical[i] = 0;
          store_element(host.data(), stored_dtype(c, role), host_index(op.tensor, b, h, s, d), padding ? NAN : value);
        }
    }
  upload(op.tensor, host, c.batch);
  return op;
}

std::vector<double> out_values(const DeviceTensor& out, const std::vector<unsigned char>& host, int batch, int heads,
                               int first_row, int rows) {
  const int d = int(out.view.shape[3]);
  std::vector<double> values;
  values.reserve(size_t(batch) * heads * rows * d);
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < heads; ++h)
      for (int s = first_row; s < first_row + rows; ++s)
        for (int e = 0; e < d; ++e) values.push_back(load_element(host.data(), out.view.dtype, host_index(out, b, h, s, e)));
  return values;
}

::testing::AssertionResult judge_attention(const std::string& name, const AttentionExpected& expected,
                                           const std::vector<double>& out, const std::vector<double>* lse,
                                           const RowNamer& row_name, Measured& m) {
  ::testing::AssertionResult out_verdict = judge("out", out, expected.out, &m.out, row_name);
  if (!out_verdict) return ::testing::AssertionFailure() << name << ": " << out_verdict.message();
  if (lse != nullptr) {
    ::testing::AssertionResult lse_verdict = judge("lse", *lse, expected.lse, &m.lse, row_name);
    if (!lse_verdict) return ::testing::AssertionFailure() << name << ": " << lse_verdict.message();
  }
  return ::testing::AssertionSuccess();
}

void apply_fp8_descales(Operand& op, Role role, int batch, int heads, int group, int seq, int head_dim,
                        const std::vector<int>& row_batch) {
  size_t i = 0;
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < heads; ++h)
      for (int s = 0; s < seq; ++s) {
        const double descale = fp8_descale(role, row_batch.empty() ? b : row_batch[size_t(s)], h / group);
        for (int d = 0; d < head_dim; ++d, ++i) op.logical[i] *= descale;
      }
}

std::vector<float> fp8_descales(Role role, int batch, int kv_heads) {
  std::vector<float> values;
  for (int b = 0; b < batch; ++b)
    for (int g = 0; g < kv_heads; ++g) values.push_back(float(fp8_descale(role, b, g)));
  return values;
}

}  // namespace selfattn::testing::harness
