// The shared attention harness's cases and forward check (attention_harness.h): AttentionCase's
// name and input seed, make_case and the sweeps, the CUDA context, check_attention and its report,
// and which paths round the probabilities. Elsewhere: element_values.cpp (element conversions,
// random values), harness_tensors.* (device tensors and operands), varlen_check.cpp,
// backward_padding_check.cpp.
#include "attention_harness.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <random>
#include <sstream>
#include <stdexcept>

#include "harness_tensors.h"
#include "kernels/registry.h"

namespace selfattn::testing {

std::string AttentionCase::name() const {
  std::ostringstream s;
  s << selfattn::to_string(dtype) << " b" << batch << " h" << heads << "/" << kv_heads << " q" << seq_q << " k" << seq_k
    << " d" << head_dim << " causal=" << selfattn::to_string(causal);
  if (head_dim_v > 0) s << " dv" << head_dim_v;
  if (!key_lengths.empty()) {
    s << " keys=[";
    for (size_t i = 0; i < key_lengths.size(); ++i) s << (i ? "," : "") << key_lengths[i];
    s << "]";
  }
  s << harness::values_name("key_start", key_start) << harness::values_name("q_offset", q_offset);
  s << " " << to_string(layout) << (strides == Strides::shared ? " shared_strides" : "") << (with_lse ? " lse" : "")
    << " " << selfattn::to_string(path);
  if (scale) s << " scale=" << *scale;
  if (batch_gap) s << " batch_gap=" << batch_gap;
  if (row_gap) s << " row_gap=" << row_gap;
  s << mods.name();
  if (misalign) s << " misalign=" << misalign;
  if (keys == Keys::rising) s << " keys=rising";
  if (fp8) s << " fp8=" << selfattn::to_string(*fp8);
  return s.str();
}

uint64_t input_seed(const std::string& name) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the name: each case its own inputs
  for (char ch : name) h = (h ^ uint8_t(ch)) * 1099511628211ull;
  const char* env = std::getenv("SELFATTN_SIM_SEED");
  const uint64_t run_seed = env ? std::strtoull(env, nullptr, 10) : 1;
  return h ^ (run_seed * 0x9E3779B97F4A7C15ull);
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

namespace {
// Whether every row of the view starts on 16 bytes (the tensor-core kernels' and TMA's condition).
bool rows_on_16_bytes(const TensorView& view) {
  const int64_t element = int64_t(dtype_size(view.dtype));
  bool aligned = reinterpret_cast<uintptr_t>(view.data) % 16 == 0;
  for (int i = 0; i < 3; ++i) aligned = aligned && (view.strides[i] * element) % 16 == 0;
  return aligned;
}
}  // namespace

bool rounds_probabilities(Context& ctx, Path path, const TensorView& q, const TensorView& k, const TensorView& v,
                          const TensorView& out, const AttentionOptions& options) {
  if (q.dtype == DType::f32) return false;
  if (path == Path::automatic) path = resolve_path(ctx, q, k, v, options);
  switch (path) {
    case Path::cublas: return true;  // the softmax writes P in the input dtype: cuBLAS takes A and B of one type
    case Path::naive: {
      // P V runs over v's head dim (path_naive.cpp looks its kernel up by it).
      const kernels::Element element = q.dtype == DType::f16 ? kernels::Element::f16 : kernels::Element::bf16;
      return std::string(kernels::sim_target::pv_tiled_instance(element, int(v.head_dim())).kernel.name)
                 .find("mma") != std::string::npos;
    }
    case Path::fused: {
      // fused_mma.cpp: tensor cores for a line of the kernel list (dtype and both head dims) when
      // every row starts on 16 bytes.
      bool shipped = false;
#define SELFATTN_FLASH_FWD(arch, E, DQK, DV) \
  shipped |= q.dtype == DType::E && q.head_dim() == DQK && v.head_dim() == DV;
#include "kernels/forward/flash_fwd_kernels.inc"
#undef SELFATTN_FLASH_FWD
      return shipped && rows_on_16_bytes(q) && rows_on_16_bytes(k) && rows_on_16_bytes(v) && rows_on_16_bytes(out);
    }
    case Path::automatic: break;
  }
  return false;
}

bool hopper_fp8_kernel_runs(Context& ctx, Path path, const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& out, const AttentionOptions& options, bool varlen) {
  const bool shipped =
      (q.head_dim() == 128 || q.head_dim() == 256) && (out.dtype == DType::f16 || out.dtype == DType::bf16);
  return (path == Path::fused || path == Path::automatic) && ctx.uses_hopper_kernels() && q.dtype == DType::e4m3 &&
         shipped && !varlen && options.key_start == nullptr && options.dropout_p == 0 && rows_on_16_bytes(q) &&
         rows_on_16_bytes(k) && rows_on_16_bytes(v) && rows_on_16_bytes(out);
}

void set_probability_rounding(Context& ctx, Path path, const TensorView& q, const TensorView& k, const TensorView& v,
                              const TensorView& out, const AttentionOptions& options, AttentionArithmetic& arithmetic,
                              bool varlen) {
  if (!is_fp8(q.dtype)) {
    arithmetic.p_rounded = rounds_probabilities(ctx, path, q, k, v, out, options);
    return;
  }
  if (hopper_fp8_kernel_runs(ctx, path, q, k, v, out, options, varlen)) {
    arithmetic.p_rounded = true;
    arithmetic.p_fp8 = DType::e4m3;
    return;
  }
  // The copies: contiguous, 256-byte aligned (any such address: only alignment and strides matter).
  alignas(256) static unsigned char copy_address[256];
  auto copy_of = [&](const TensorView& view) {
    return TensorView::bhsd(copy_address, out.dtype, view.batch(), view.heads(), view.seq(), view.head_dim());
  };
  AttentionOptions copy_options = options;
  copy_options.q_descale = copy_options.k_descale = copy_options.v_descale = nullptr;
  arithmetic.p_rounded = rounds_probabilities(ctx, path, copy_of(q), copy_of(k), copy_of(v), out, copy_options);
}

using namespace harness;

::testing::AssertionResult check_attention(Context& ctx, const AttentionCase& c, Measured* measured) {
  std::mt19937_64 rng(input_seed(c));
  Operand q = make_operand(ctx, c, Role::q, c.heads, c.seq_q, rng, "test q");
  Operand k = make_operand(ctx, c, Role::k, c.kv_heads, c.seq_k, rng, "test k", c.keys, true);
  Operand v = make_operand(ctx, c, Role::v, c.kv_heads, c.seq_k, rng, "test v", Keys::random, true);
  DeviceBuffer<float> descales[3];
  if (c.fp8) {
    const int group = c.heads / c.kv_heads;
    apply_fp8_descales(q, Role::q, c.batch, c.heads, group, c.seq_q, c.head_dim);
    apply_fp8_descales(k, Role::k, c.batch, c.kv_heads, 1, c.seq_k, c.head_dim);
    apply_fp8_descales(v, Role::v, c.batch, c.kv_heads, 1, c.seq_k, c.v_dim());
    for (Role role : {Role::q, Role::k, Role::v}) {
      DeviceBuffer<float>& buffer = descales[int(role)];
      buffer = DeviceBuffer<float>(ctx, std::max(c.batch * c.kv_heads, 1), "test descale");
      buffer.copy_from_host(fp8_descales(role, c.batch, c.kv_heads));
    }
  }

  const size_t lse_count = size_t(c.batch) * c.heads * c.seq_q;
  DeviceTensor out_tensor = make_tensor(ctx, c, Role::out, c.heads, c.seq_q, "test out");
  DeviceBuffer<float> lse_buffer(ctx, std::max<size_t>(lse_count, 1), "test lse");
  // NaN bytes: 0xFF.. is a NaN in f32, f16 and bf16 alike, so an unwritten element cannot pass.
  upload(out_tensor, std::vector<unsigned char>(out_tensor.batch_bytes * size_t(c.batch), 0xFF), c.batch);
  lse_buffer.fill_bytes(0xFF);
  const TensorView out = out_tensor.view;

  DeviceBuffer<int32_t> key_lengths, key_start, q_offset;
  AttentionOptions options;
  options.path = c.path;
  options.causal = c.causal;
  options.scale = c.scale;
  options.key_lengths = upload_ints(ctx, key_lengths, c.key_lengths, "test key_lengths");
  options.key_start = upload_ints(ctx, key_start, c.key_start, "test key_start");
  options.q_offset = upload_ints(ctx, q_offset, c.q_offset, "test q_offset");
  if (c.with_lse) options.lse = lse_buffer.data();
  if (c.fp8) {
    options.q_descale = descales[0].data();
    options.k_descale = descales[1].data();
    options.v_descale = descales[2].data();
  }
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
  problem.head_dim_v = c.head_dim_v;
  problem.causal = c.causal;
  problem.scale = c.scale ? double(*c.scale) : 0.0;
  problem.key_lengths = c.key_lengths;
  problem.key_start = c.key_start;
  problem.q_offset = c.q_offset;
  if (c.mods.any()) mods.apply(c.mods, problem);
  AttentionArithmetic arithmetic;
  arithmetic.dtype = c.dtype;
  set_probability_rounding(ctx, c.path, q.tensor.view, k.tensor.view, v.tensor.view, out, options, arithmetic);
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

}  // namespace selfattn::testing
