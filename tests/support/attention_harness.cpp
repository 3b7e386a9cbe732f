#include "attention_harness.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <random>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/registry.h"

namespace selfattn::testing {

std::string AttentionCase::name() const {
  std::ostringstream s;
  s << selfattn::to_string(dtype) << " b" << batch << " h" << heads << "/" << kv_heads << " q" << seq_q << " k" << seq_k
    << " d" << head_dim << " causal=" << selfattn::to_string(causal);
  if (!key_lengths.empty()) {
    s << " keys=[";
    for (size_t i = 0; i < key_lengths.size(); ++i) s << (i ? "," : "") << key_lengths[i];
    s << "]";
  }
  s << " " << to_string(layout) << (strides == Strides::shared ? " shared_strides" : "") << (with_lse ? " lse" : "")
    << " " << selfattn::to_string(path);
  if (scale) s << " scale=" << *scale;
  if (batch_gap) s << " batch_gap=" << batch_gap;
  if (row_gap) s << " row_gap=" << row_gap;
  s << mods.name();
  if (misalign) s << " misalign=" << misalign;
  if (keys == Keys::rising) s << " keys=rising";
  return s.str();
}

uint64_t input_seed(const std::string& name) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the name: each case its own inputs
  for (char ch : name) h = (h ^ uint8_t(ch)) * 1099511628211ull;
  const char* env = std::getenv("SELFATTN_SIM_SEED");
  const uint64_t run_seed = env ? std::strtoull(env, nullptr, 10) : 1;
  return h ^ (run_seed * 0x9E3779B97F4A7C15ull);
}

uint16_t float_to_half_bits(float x) {
  return __half_raw(__float2half_rn(x)).x;
}
uint16_t float_to_bf16_bits(float x) {
  return __nv_bfloat16_raw(__float2bfloat16_rn(x)).x;
}
float half_bits_to_float(uint16_t bits) {
  __half_raw raw;
  raw.x = bits;
  return __half2float(__half(raw));
}
float bf16_bits_to_float(uint16_t bits) {
  __nv_bfloat16_raw raw;
  raw.x = bits;
  return __bfloat162float(__nv_bfloat16(raw));
}

void store_element(void* bytes, DType dtype, size_t index, float value) {
  switch (dtype) {
    case DType::f32: static_cast<float*>(bytes)[index] = value; return;
    case DType::f16: static_cast<uint16_t*>(bytes)[index] = float_to_half_bits(value); return;
    case DType::bf16: static_cast<uint16_t*>(bytes)[index] = float_to_bf16_bits(value); return;
  }
}

float load_element(const void* bytes, DType dtype, size_t index) {
  switch (dtype) {
    case DType::f32: return static_cast<const float*>(bytes)[index];
    case DType::f16: return half_bits_to_float(static_cast<const uint16_t*>(bytes)[index]);
    case DType::bf16: return bf16_bits_to_float(static_cast<const uint16_t*>(bytes)[index]);
  }
  return 0;
}

float round_to(DType dtype, float value) {
  switch (dtype) {
    case DType::f32: return value;
    case DType::f16: return half_bits_to_float(float_to_half_bits(value));
    case DType::bf16: return bf16_bits_to_float(float_to_bf16_bits(value));
  }
  return value;
}

DeviceBuffer<unsigned char> random_device_values(Context& ctx, DType dtype, size_t count, std::mt19937_64& rng,
                                                 const char* label) {
  std::vector<unsigned char> host(count * dtype_size(dtype));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t i = 0; i < count; ++i) store_element(host.data(), dtype, i, round_to(dtype, normal(rng)));
  DeviceBuffer<unsigned char> buffer(ctx, host.size(), label);
  buffer.copy_from_host(host);
  return buffer;
}

AttentionCase make_case(DType dtype, int batch, int heads, int kv_heads, int seq_q, int seq_k, int head_dim,
                        Causal causal, Layout layout, bool with_lse, std::vector<int32_t> key_lengths, Path path) {
  AttentionCase c;
  c.dtype = dtype;
  c.batch = batch;
  c.heads = heads;
  c.kv_heads = kv_heads;
  c.seq_q = seq_q;
  c.seq_k = seq_k;
  c.head_dim = head_dim;
  c.causal = causal;
  c.layout = layout;
  c.with_lse = with_lse;
  c.key_lengths = std::move(key_lengths);
  c.path = path;
  return c;
}

std::vector<AttentionCase> sweep_cases(DType dtype, Path path, bool (*head_dim_ok)(int)) {
  constexpr Causal none = Causal::none, top_left = Causal::top_left, bottom_right = Causal::bottom_right;
  constexpr Layout bhsd = Layout::bhsd, bshd = Layout::bshd;
  constexpr DType f32 = DType::f32, f16 = DType::f16;
  std::vector<AttentionCase> cases;
  auto add = [&](int batch, int heads, int kv_heads, int seq_q, int seq_k, int head_dim, Causal causal, Layout layout,
                 bool lse, std::vector<int32_t> key_lengths = {}, int64_t row_gap = 0) {
    if (head_dim_ok && !head_dim_ok(head_dim)) return;
    cases.push_back(make_case(dtype, batch, heads, kv_heads, seq_q, seq_k, head_dim, causal, layout, lse,
                              std::move(key_lengths), path));
    cases.back().row_gap = row_gap;
  };
  // Tiny shapes, the seed example (2 tokens, head_dim 2) first.
  add(1, 1, 1, 2, 2, 2, none, bhsd, false);
  add(1, 1, 1, 1, 1, 1, none, bshd, true);
  add(1, 1, 1, 1, 7, 1, top_left, bhsd, true);
  add(1, 1, 1, 7, 1, 2, bottom_right, bshd, true);
  add(1, 1, 1, 2, 7, 7, bottom_right, bhsd, true, {5});
  // Each dtype gets the same axes in a different arrangement, so the three together cover more pairs.
  if (dtype == f32) {
    add(2, 4, 2, 64, 113, 32, none, bhsd, true);
    add(1, 2, 1, 113, 64, 64, top_left, bshd, true);
    add(3, 1, 1, 7, 203, 80, bottom_right, bhsd, false, {203, 0, 57});
    add(1, 8, 2, 203, 7, 7, none, bshd, true);
    add(2, 3, 3, 257, 64, 2, top_left, bhsd, true, {64, 1});
    add(1, 2, 2, 64, 257, 128, bottom_right, bshd, true);
    add(1, 6, 3, 2, 203, 32, none, bhsd, false, {0});
    add(2, 2, 1, 113, 1, 16, top_left, bshd, true, {1, 0});
    add(2, 1, 1, 7, 64, 32, bottom_right, bshd, true, {500, -3});  // clamped to [0, seq_k]
    add(2, 2, 1, 64, 7, 7, top_left, bhsd, true, {}, 3);          // padded rows
  } else if (dtype == f16) {
    add(2, 4, 1, 113, 64, 64, none, bhsd, true);
    add(1, 2, 2, 64, 113, 32, top_left, bshd, true, {100});
    add(3, 2, 1, 7, 257, 80, bottom_right, bhsd, true, {257, 3, 0});
    add(1, 8, 8, 203, 2, 128, none, bshd, false);
    add(1, 1, 1, 257, 203, 7, top_left, bhsd, true);
    add(2, 4, 2, 1, 64, 1, bottom_right, bshd, true);
    add(1, 4, 4, 64, 64, 64, top_left, bhsd, true, {0});
    add(2, 4, 4, 113, 64, 64, top_left, bshd, true, {}, 2 * 4 * 64);  // a slice of packed [b, s, 3, h, d] QKV:
    cases.back().strides = Strides::shared;                             // q, k, v and out one stride
  } else {
    add(1, 4, 2, 64, 203, 64, bottom_right, bshd, true);
    add(2, 2, 1, 113, 7, 128, top_left, bhsd, true, {7, 0});
    add(1, 3, 1, 203, 113, 32, none, bhsd, false, {60});
    add(3, 1, 1, 2, 64, 80, none, bshd, true);
    add(1, 8, 4, 7, 257, 2, top_left, bshd, true);
    add(1, 2, 2, 257, 1, 7, bottom_right, bhsd, true);
    add(2, 2, 2, 64, 113, 128, bottom_right, bhsd, true, {113, 50});
    add(1, 2, 1, 7, 203, 32, none, bshd, false, {}, 8);  // padded rows
  }
  (void)f16;
  return cases;
}

std::optional<Context> cuda_context(std::string& reason, size_t workspace_limit) {
  try {
    ContextOptions options;
    options.backend = Backend::cuda;
    options.workspace_limit = workspace_limit;
    return Context(options);
  } catch (const NotAvailable& e) {
    reason = e.what();
    return std::nullopt;
  }
}

void expect_all_pass(Context& ctx, const std::vector<AttentionCase>& cases) {
  // SELFATTN_TEST_REPORT=1 prints each case's measured errors (for tolerance studies).
  const bool report = std::getenv("SELFATTN_TEST_REPORT") != nullptr;
  for (const AttentionCase& c : cases) {
    Measured m;
    EXPECT_TRUE(check_attention(ctx, c, &m));
    if (report) print_report(c.name(), m);
  }
}

void print_report(const std::string& name, const Measured& m) {
  // Error / bound per level (element, row, overall), then the allowed computation's worst errors.
  std::printf("%-90s out %.2f %.2f %.2f (allowed %.2g %.2g %.2g)  lse %.2f %.2f (allowed %.2g %.2g)\n", name.c_str(),
              m.out.element, m.out.row, m.out.all, m.out.allowed_element, m.out.allowed_row, m.out.allowed_all,
              m.lse.element, m.lse.all, m.lse.allowed_element, m.lse.allowed_all);
}

bool rounds_probabilities(Context& ctx, Path path, const TensorView& q, const TensorView& k, const TensorView& v,
                          const TensorView& out, const AttentionOptions& options) {
  if (q.dtype == DType::f32) return false;
  if (path == Path::automatic) path = resolve_path(ctx, q, k, v, options);
  const int head_dim = int(q.head_dim());
  switch (path) {
    case Path::cublas: return true;  // the softmax writes P in the input dtype: cuBLAS takes A and B of one type
    case Path::naive: {
      const kernels::Element element = q.dtype == DType::f16 ? kernels::Element::f16 : kernels::Element::bf16;
      return std::string(kernels::sim_target::pv_tiled_instance(element, head_dim).kernel.name).find("mma") !=
             std::string::npos;
    }
    case Path::fused: {
      // path_fused.cpp: tensor cores for the shipped head dims when every row starts on 16 bytes.
      auto rows_on_16_bytes = [](const TensorView& view) {
        const int64_t element = int64_t(dtype_size(view.dtype));
        bool aligned = reinterpret_cast<uintptr_t>(view.data) % 16 == 0;
        for (int i = 0; i < 3; ++i) aligned = aligned && (view.strides[i] * element) % 16 == 0;
        return aligned;
      };
      const bool shipped = head_dim == 32 || head_dim == 64 || head_dim == 96 || head_dim == 128 || head_dim == 256;
      return shipped && rows_on_16_bytes(q) && rows_on_16_bytes(k) && rows_on_16_bytes(v) && rows_on_16_bytes(out);
    }
    case Path::automatic: break;
  }
  return false;
}

namespace {

// A tensor of the case in device memory. Each batch is a [heads, seq, head_dim] block in the
// layout tensor_layout() gives the tensor's role, every row (one head's head_dim elements) followed
// by its row gap (as a slice of a packed QKV projection is); consecutive batches are c.batch_gap
// elements further apart, so host copies go batch by batch and the gaps (possibly gigabytes on the
// sim) are never touched. The view starts c.misalign elements into the allocation.
struct DeviceTensor {
  DeviceBuffer<unsigned char> device;
  TensorView view;
  size_t element = 0;      // bytes per element
  size_t batch_bytes = 0;  // one batch block, row gaps included
  size_t misalign_bytes = 0;
  size_t batch_offset_bytes(int b) const { return misalign_bytes + size_t(b * view.strides[0]) * element; }
};

DeviceTensor make_tensor(Context& ctx, const AttentionCase& c, Role role, int heads, int seq, const char* label) {
  DeviceTensor t;
  t.element = dtype_size(c.dtype);
  t.misalign_bytes = size_t(c.misalign) * t.element;
  t.view = strided_view(nullptr, c.dtype, c.batch, heads, seq, c.head_dim,
                        tensor_layout(c.layout, c.row_gap, c.strides, role), c.batch_gap);
  const int64_t block = batch_block_elements(t.view);
  t.batch_bytes = size_t(block) * t.element;
  const size_t bytes = c.batch > 0 ? size_t(int64_t(c.batch - 1) * t.view.strides[0] + block) * t.element : 0;
  t.device = DeviceBuffer<unsigned char>(ctx, std::max<size_t>(t.misalign_bytes + bytes, 1), label);
  t.view.data = t.device.data() + t.misalign_bytes;
  return t;
}

// Index of element (b, h, s, d) in the host copy: the batches' blocks back to back.
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

// One input of the case: logical values (rounded to the dtype, as double for the reference) and
// their device copy laid out as the view says. keys: how the rows are drawn (Keys).
struct Operand {
  std::vector<double> logical;  // [b, h, s, d] contiguous
  DeviceTensor tensor;
};

// padded_rows: k and v, whose rows past c.key_lengths[b] are padding.
// unowned_rows: the last rows of every head, which no sequence of a varlen call owns: NaN on the
// device (and 0 in `logical`), like the row gaps.
Operand make_operand(Context& ctx, const AttentionCase& c, Role role, int heads, int seq, std::mt19937_64& rng,
                     const char* label, Keys keys = Keys::random, bool padded_rows = false, int unowned_rows = 0) {
  Operand op;
  op.tensor = make_tensor(ctx, c, role, heads, seq, label);
  const size_t count = size_t(c.batch) * heads * seq * c.head_dim;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // 0xFF bytes: NaN in every dtype in the row gaps, which no kernel may read.
  std::vector<unsigned char> host(op.tensor.batch_bytes * size_t(c.batch), 0xFF);
  std::vector<float> first_row(size_t(c.head_dim));
  op.logical.resize(count);
  size_t i = 0;
  for (int b = 0; b < c.batch; ++b)
    for (int h = 0; h < heads; ++h) {
      if (keys == Keys::rising)
        for (float& x : first_row) x = normal(rng);
      for (int s = 0; s < seq; ++s)
        for (int d = 0; d < c.head_dim; ++d, ++i) {
          const float drawn = keys == Keys::rising ? float(first_row[d] * (1 + kRisingKeyStep * s)) : normal(rng);
          const float value = round_to(c.dtype, drawn);
          op.logical[i] = value;
          // Keys past a batch's key length are padding nobody may use: NaN on the device (what
          // an inference engine's unused cache rows may hold), so a kernel that multiplies a zero
          // probability by such a row's V, or lets it into a score, fails.
          const bool padding = (padded_rows && !c.key_lengths.empty() && s >= std::max(c.key_lengths[size_t(b)], 0)) ||
                               s >= seq - unowned_rows;
          if (s >= seq - unowned_rows) op.logical[i] = 0;
          store_element(host.data(), c.dtype, host_index(op.tensor, b, h, s, d), padding ? NAN : value);
        }
    }
  upload(op.tensor, host, c.batch);
  return op;
}

// The values of out as the reference orders them ([b, h, s, d]), read from the host copy.
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

// Judges out, then lse when the call asked for it; m receives both judgements.
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

}  // namespace

::testing::AssertionResult check_attention(Context& ctx, const AttentionCase& c, Measured* measured) {
  std::mt19937_64 rng(input_seed(c));
  Operand q = make_operand(ctx, c, Role::q, c.heads, c.seq_q, rng, "test q");
  Operand k = make_operand(ctx, c, Role::k, c.kv_heads, c.seq_k, rng, "test k", c.keys, true);
  Operand v = make_operand(ctx, c, Role::v, c.kv_heads, c.seq_k, rng, "test v", Keys::random, true);

  const size_t lse_count = size_t(c.batch) * c.heads * c.seq_q;
  DeviceTensor out_tensor = make_tensor(ctx, c, Role::out, c.heads, c.seq_q, "test out");
  DeviceBuffer<float> lse_buffer(ctx, std::max<size_t>(lse_count, 1), "test lse");
  // NaN bytes: 0xFF.. is a NaN in f32, f16 and bf16 alike, so an unwritten element cannot pass.
  upload(out_tensor, std::vector<unsigned char>(out_tensor.batch_bytes * size_t(c.batch), 0xFF), c.batch);
  lse_buffer.fill_bytes(0xFF);
  const TensorView out = out_tensor.view;

  DeviceBuffer<int32_t> key_lengths;
  AttentionOptions options;
  options.path = c.path;
  options.causal = c.causal;
  options.scale = c.scale;
  if (!c.key_lengths.empty()) {
    key_lengths = DeviceBuffer<int32_t>(ctx, c.key_lengths.size(), "test key_lengths");
    key_lengths.copy_from_host(c.key_lengths);
    options.key_lengths = key_lengths.data();
  }
  if (c.with_lse) options.lse = lse_buffer.data();
  ScoreModsData mods;
  if (c.mods.any()) {
    mods = make_score_mods(ctx, c.mods, c.dtype, c.batch, c.heads, c.seq_q, c.seq_k, rng);
    mods.apply(c.mods, options);
  }

  try {
    attention(ctx, q.tensor.view, k.tensor.view, v.tensor.view, out, options);
    ctx.synchronize();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << c.name() << ": attention threw: " << e.what();
  }

  reference::Problem problem;
  problem.batch = c.batch;
  problem.heads = c.heads;
  problem.kv_heads = c.kv_heads;
  problem.seq_q = c.seq_q;
  problem.seq_k = c.seq_k;
  problem.head_dim = c.head_dim;
  problem.causal = c.causal;
  problem.scale = c.scale ? double(*c.scale) : 0.0;
  problem.key_lengths = c.key_lengths;
  if (c.mods.any()) mods.apply(c.mods, problem);
  AttentionArithmetic arithmetic;
  arithmetic.dtype = c.dtype;
  arithmetic.p_rounded = rounds_probabilities(ctx, c.path, q.tensor.view, k.tensor.view, v.tensor.view, out, options);
  const AttentionExpected expected = expected_attention(problem, q.logical, k.logical, v.logical, arithmetic);

  const std::vector<unsigned char> out_host = download(out_tensor, c.batch);
  // Nothing outside out's elements was written: every byte of the row gaps is still poison.
  if (::testing::AssertionResult gaps = gaps_untouched(out_host, out_tensor.view, "out"); !gaps)
    return ::testing::AssertionFailure() << c.name() << ": " << gaps.message();

  const std::vector<float> lse_host = lse_buffer.to_host();
  const std::vector<double> lse(lse_host.begin(), lse_host.begin() + long(lse_count));
  const RowNamer row_name = [&c](size_t row) {
    return "batch " + std::to_string(row / (size_t(c.heads) * c.seq_q)) + " head " +
           std::to_string(row / c.seq_q % c.heads) + " query " + std::to_string(row % c.seq_q);
  };
  Measured m;
  ::testing::AssertionResult verdict =
      judge_attention(c.name(), expected, out_values(out_tensor, out_host, c.batch, c.heads, 0, c.seq_q),
                      c.with_lse ? &lse : nullptr, row_name, m);
  if (measured) *measured = m;
  return verdict;
}

namespace {

// One case of check_backward_ignores_key_padding.
::testing::AssertionResult check_backward_padding_case(Context& ctx, const AttentionCase& c, bool grad_f32,
                                                       double tolerance) {
  // The same seed twice gives the same values; make_operand puts NaN past the key lengths when asked.
  struct Inputs {
    Operand q, k, v, dout;
  };
  const auto inputs = [&](bool nan_padding) {
    std::mt19937_64 rng(input_seed(c));
    Operand q = make_operand(ctx, c, Role::q, c.heads, c.seq_q, rng, "test q");
    Operand k = make_operand(ctx, c, Role::k, c.kv_heads, c.seq_k, rng, "test k", Keys::random, nan_padding);
    Operand v = make_operand(ctx, c, Role::v, c.kv_heads, c.seq_k, rng, "test v", Keys::random, nan_padding);
    Operand dout = make_operand(ctx, c, Role::dout, c.heads, c.seq_q, rng, "test dout");
    return Inputs{std::move(q), std::move(k), std::move(v), std::move(dout)};
  };
  const Inputs finite = inputs(false), poisoned = inputs(true);

  DeviceBuffer<int32_t> key_lengths(ctx, c.key_lengths.size(), "test key_lengths");
  key_lengths.copy_from_host(c.key_lengths);
  DeviceBuffer<float> lse(ctx, size_t(c.batch) * c.heads * c.seq_q, "test lse");
  DeviceTensor out = make_tensor(ctx, c, Role::out, c.heads, c.seq_q, "test out");
  AttentionOptions options;
  options.path = c.path;
  options.causal = c.causal;
  options.key_lengths = key_lengths.data();
  options.lse = lse.data();
  AttentionCase gradient_case = c;
  if (grad_f32) gradient_case.dtype = DType::f32;
  DeviceTensor dq = make_tensor(ctx, gradient_case, Role::dq, c.heads, c.seq_q, "test dq");
  DeviceTensor dk = make_tensor(ctx, gradient_case, Role::dk, c.kv_heads, c.seq_k, "test dk");
  DeviceTensor dv = make_tensor(ctx, gradient_case, Role::dv, c.kv_heads, c.seq_k, "test dv");
  // Gradients [dq, dk, dv] of one input set, in the reference's order ([b, h, s, d]).
  const auto gradients = [&](const Inputs& in) {
    for (DeviceTensor* g : {&dq, &dk, &dv}) g->device.fill_bytes(0xFF);  // NaN: an element not written fails
    attention_backward(ctx, in.q.tensor.view, in.k.tensor.view, in.v.tensor.view, out.view, in.dout.tensor.view,
                       lse.data(), dq.view, dk.view, dv.view, options);
    ctx.synchronize();
    std::vector<std::vector<double>> values;
    for (const auto& [g, heads, rows, what] : {std::tuple{&dq, c.heads, c.seq_q, "dq"},
                                               std::tuple{&dk, c.kv_heads, c.seq_k, "dk"},
                                               std::tuple{&dv, c.kv_heads, c.seq_k, "dv"}}) {
      const std::vector<unsigned char> host = download(*g, c.batch);
      if (::testing::AssertionResult gaps = gaps_untouched(host, g->view, what); !gaps)
        throw std::runtime_error(gaps.message());
      values.push_back(out_values(*g, host, c.batch, heads, 0, rows));
    }
    return values;
  };
  std::vector<std::vector<double>> want, got;
  try {
    // out and the LSE from the finite inputs: the forward's own handling of the padding is not on trial.
    attention(ctx, finite.q.tensor.view, finite.k.tensor.view, finite.v.tensor.view, out.view, options);
    options.lse = nullptr;
    want = gradients(finite);
    got = gradients(poisoned);
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << c.name() << ": threw: " << e.what();
  }

  const char* names[] = {"dq", "dk", "dv"};
  for (int which = 0; which < 3; ++which) {
    const bool query = which == 0;
    const int heads = query ? c.heads : c.kv_heads, rows = query ? c.seq_q : c.seq_k;
    double largest = 0;
    for (double x : want[size_t(which)]) largest = std::max(largest, std::abs(x));
    for (size_t i = 0; i < got[size_t(which)].size(); ++i) {
      const size_t row = i / size_t(c.head_dim);
      const int b = int(row / (size_t(heads) * rows)), r = int(row % size_t(rows));
      const double x = got[size_t(which)][i], expected = want[size_t(which)][i];
      const bool padding = !query && r >= std::clamp(c.key_lengths[size_t(b)], 0, c.seq_k);
      const bool wrong = !std::isfinite(x) || (padding ? x != 0.0 : std::abs(x - expected) > tolerance * largest);
      if (wrong)
        return ::testing::AssertionFailure()
               << c.name() << (grad_f32 ? " grad f32" : "") << ": " << names[which] << " at batch " << b << " head "
               << row / size_t(rows) % size_t(heads) << " row " << r << " column " << i % size_t(c.head_dim) << " is "
               << x << " with NaN key padding, " << expected << " with finite padding"
               << (padding ? " (a key row past the length: expected exactly 0)" : "");
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace

::testing::AssertionResult check_backward_ignores_key_padding(Context& ctx, Path path, double tolerance) {
  // GQA and not, both layouts, every causal mode, gradients in the input dtype and in f32, key
  // lengths full, partial and 0.
  const std::pair<AttentionCase, bool> cases[] = {
      {make_case(DType::f32, 3, 4, 2, 9, 21, 16, Causal::none, Layout::bhsd, true, {21, 8, 0}, path), false},
      {make_case(DType::f16, 2, 2, 1, 13, 40, 32, Causal::bottom_right, Layout::bshd, true, {17, 40}, path), false},
      {make_case(DType::bf16, 2, 3, 3, 6, 33, 64, Causal::top_left, Layout::bhsd, true, {0, 5}, path), true},
  };
  for (const auto& [c, grad_f32] : cases)
    if (::testing::AssertionResult verdict = check_backward_padding_case(ctx, c, grad_f32, tolerance); !verdict)
      return verdict;
  return ::testing::AssertionSuccess();
}

}  // namespace selfattn::testing

namespace selfattn::testing {

std::string VarlenCase::name() const {
  std::ostringstream s;
  s << selfattn::to_string(dtype) << " varlen h" << heads << "/" << kv_heads << " d" << head_dim << " q=[";
  for (size_t i = 0; i < seq_q.size(); ++i) s << (i ? "," : "") << seq_q[i];
  s << "] k=[";
  for (size_t i = 0; i < seq_k.size(); ++i) s << (i ? "," : "") << seq_k[i];
  s << "] causal=" << selfattn::to_string(causal) << " " << to_string(layout)
    << (strides == Strides::shared ? " shared_strides" : "") << (with_lse ? " lse" : "") << " "
    << selfattn::to_string(path);
  if (misalign) s << " misalign=" << misalign;
  if (unowned_q_rows || unowned_k_rows) s << " unowned=" << unowned_q_rows << "/" << unowned_k_rows;
  return s.str();
}

::testing::AssertionResult check_attention_varlen(Context& ctx, const VarlenCase& c, Measured* measured) {
  return check_attention_varlen(ctx, c, ScoreModsCase{}, measured);
}

::testing::AssertionResult check_attention_varlen(Context& ctx, const VarlenCase& c, const ScoreModsCase& mods_case,
                                                  Measured* measured) {
  if (c.seq_q.size() != c.seq_k.size()) return ::testing::AssertionFailure() << c.name() << ": seq_q and seq_k differ in size";
  const int batch = int(c.seq_q.size());
  std::vector<int32_t> cu_q(1, 0), cu_k(1, 0);
  for (int b = 0; b < batch; ++b) {
    cu_q.push_back(cu_q.back() + c.seq_q[b]);
    cu_k.push_back(cu_k.back() + c.seq_k[b]);
  }
  // The views' rows: the sequences' then those no sequence owns.
  const int total_q = cu_q.back() + c.unowned_q_rows, total_k = cu_k.back() + c.unowned_k_rows;
  // The packed tensors are padded calls of batch 1 over the total lengths.
  AttentionCase packed;
  packed.dtype = c.dtype;
  packed.batch = 1;
  packed.head_dim = c.head_dim;
  packed.layout = c.layout;
  packed.strides = c.strides;
  packed.misalign = c.misalign;
  std::mt19937_64 rng(input_seed(c.name()));
  Operand q = make_operand(ctx, packed, Role::q, c.heads, total_q, rng, "test q", Keys::random, false, c.unowned_q_rows);
  Operand k = make_operand(ctx, packed, Role::k, c.kv_heads, total_k, rng, "test k", Keys::random, false,
                           c.unowned_k_rows);
  Operand v = make_operand(ctx, packed, Role::v, c.kv_heads, total_k, rng, "test v", Keys::random, false,
                           c.unowned_k_rows);
  DeviceTensor out_tensor = make_tensor(ctx, packed, Role::out, c.heads, total_q, "test out");
  upload(out_tensor, std::vector<unsigned char>(out_tensor.batch_bytes, 0xFF), 1);
  const size_t lse_count = size_t(c.heads) * total_q;
  DeviceBuffer<float> lse_buffer(ctx, std::max<size_t>(lse_count, 1), "test lse");
  lse_buffer.fill_bytes(0xFF);
  DeviceBuffer<int32_t> cu_q_device(ctx, cu_q.size(), "test cu_seqlens_q"), cu_k_device(ctx, cu_k.size(), "test cu_seqlens_k");
  cu_q_device.copy_from_host(cu_q);
  cu_k_device.copy_from_host(cu_k);

  AttentionOptions options;
  options.path = c.path;
  options.causal = c.causal;
  if (c.with_lse) options.lse = lse_buffer.data();
  const int max_q = batch ? *std::max_element(c.seq_q.begin(), c.seq_q.end()) : 0;
  const int max_k = batch ? *std::max_element(c.seq_k.begin(), c.seq_k.end()) : 0;
  ScoreModsData mods;
  if (mods_case.any()) {
    mods = make_score_mods(ctx, mods_case, c.dtype, batch, c.heads, max_q, max_k, rng);
    mods.apply(mods_case, options);
  }
  try {
    attention_varlen(ctx, q.tensor.view, k.tensor.view, v.tensor.view, out_tensor.view, cu_q_device.data(),
                     cu_k_device.data(), batch, max_q, max_k, options);
    ctx.synchronize();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << c.name() << ": attention_varlen threw: " << e.what();
  }
  const std::vector<unsigned char> out_host = download(out_tensor, 1);
  const std::vector<float> lse_host = lse_buffer.to_host();
  // Neither the gaps nor the rows no sequence owns were written (attention.h): still poison.
  if (::testing::AssertionResult gaps = gaps_untouched(out_host, out_tensor.view, "out"); !gaps)
    return ::testing::AssertionFailure() << c.name() << ": " << gaps.message();
  for (int h = 0; h < c.heads; ++h)
    for (int r = cu_q.back(); r < total_q; ++r) {
      for (int e = 0; e < c.head_dim; ++e)
        for (size_t byte = 0; byte < out_tensor.element; ++byte)
          if (out_host[host_index(out_tensor, 0, h, r, e) * out_tensor.element + byte] != 0xFF)
            return ::testing::AssertionFailure() << c.name() << ": out's row " << r << " of head " << h
                                                 << ", which no sequence owns, was written";
      if (c.with_lse && !std::isnan(lse_host[size_t(h) * total_q + r]))
        return ::testing::AssertionFailure() << c.name() << ": lse's row " << r << " of head " << h
                                             << ", which no sequence owns, was written";
    }

  AttentionArithmetic arithmetic;
  arithmetic.dtype = c.dtype;
  arithmetic.p_rounded = rounds_probabilities(ctx, c.path, q.tensor.view, k.tensor.view, v.tensor.view,
                                              out_tensor.view, options);
  // Each sequence against the reference run on it alone; the parts are judged as one result.
  AttentionExpected expected;
  expected.out.row_length = c.head_dim;
  std::vector<double> out, lse;
  std::vector<std::string> row_names;
  const int d = c.head_dim;
  for (int b = 0; b < batch; ++b) {
    if (c.seq_q[b] == 0) continue;
    // This sequence alone, as the reference takes it: contiguous [1, heads, len, d].
    auto slice = [&](const Operand& op, int heads, int total, int first, int len) {
      std::vector<double> part(size_t(heads) * len * d);
      for (int h = 0; h < heads; ++h)
        for (int r = 0; r < len; ++r)
          for (int e = 0; e < d; ++e)
            part[(size_t(h) * len + r) * d + e] = op.logical[(size_t(h) * total + first + r) * d + e];
      return part;
    };
    reference::Problem problem;
    problem.heads = c.heads;
    problem.kv_heads = c.kv_heads;
    problem.seq_q = c.seq_q[b];
    problem.seq_k = c.seq_k[b];
    problem.head_dim = d;
    problem.causal = c.causal;
    if (mods_case.any()) mods.apply_sequence(mods_case, problem, b, c.seq_q[b], c.seq_k[b]);
    const AttentionExpected part =
        expected_attention(problem, slice(q, c.heads, total_q, cu_q[b], c.seq_q[b]),
                           slice(k, c.kv_heads, total_k, cu_k[b], c.seq_k[b]),
                           slice(v, c.kv_heads, total_k, cu_k[b], c.seq_k[b]), arithmetic);
    expected.out.append(part.out);
    expected.lse.append(part.lse);
    const std::vector<double> part_out = out_values(out_tensor, out_host, 1, c.heads, cu_q[b], c.seq_q[b]);
    out.insert(out.end(), part_out.begin(), part_out.end());
    for (int h = 0; h < c.heads; ++h)
      for (int r = 0; r < c.seq_q[b]; ++r) {
        lse.push_back(lse_host[size_t(h) * total_q + cu_q[b] + r]);
        row_names.push_back("sequence " + std::to_string(b) + " head " + std::to_string(h) + " query " + std::to_string(r));
      }
  }
  Measured m;
  ::testing::AssertionResult verdict = judge_attention(c.name(), expected, out, c.with_lse ? &lse : nullptr,
                                                       [&](size_t row) { return row_names[row]; }, m);
  if (measured) *measured = m;
  if (std::getenv("SELFATTN_TEST_REPORT") != nullptr) print_report(c.name(), m);
  return verdict;
}

}  // namespace selfattn::testing
