// Argument checking for the attention entry points (see attention_validation.h).
#include "validation/attention_validation.h"

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <string>

#include "selfattn/error.h"

namespace selfattn::detail {
namespace {

constexpr std::array<const char*, 4> kDimNames{"batch", "heads", "seq", "head_dim"};

[[noreturn]] void fail(const char* function, const std::string& message) {
  throw InvalidArgument(std::string(function) + ": " + message);
}

std::string dim(const char* name, int i) {
  return std::string(name) + ".shape[" + std::to_string(i) + "] (" + kDimNames[i] + ")";
}

// `name`'s dimension i must equal `ref_name`'s dimension ref_i.
void expect_same_dim(const char* function, const char* name, const TensorView& view, int i, const char* ref_name,
                     const TensorView& ref, int ref_i) {
  if (view.shape[i] != ref.shape[ref_i]) {
    fail(function, dim(name, i) + " expected " + std::to_string(ref.shape[ref_i]) + " (" + dim(ref_name, ref_i) +
                       "), got " + std::to_string(view.shape[i]));
  }
}

void expect_same_dtype(const char* function, const char* name, const TensorView& view, const TensorView& q) {
  if (view.dtype != q.dtype) {
    fail(function, std::string(name) + ".dtype expected " + to_string(q.dtype) + " (q.dtype), got " +
                       to_string(view.dtype));
  }
}


// The checks shared by the padded and the varlen entry points: each view alone, then q/k/v/out
// against each other (dtype, head dims, heads vs kv_heads, k vs v), then out against the inputs.
void check_common(const char* function, const TensorView& q, const TensorView& k, const TensorView& v,
                  const TensorView& out, bool check_out_overlap) {
  // FP8 inputs (AttentionOptions::q_descale): q, k and v share the format, out is f16, bf16 or f32.
  check_view(function, "q", q, /*fp8=*/true);
  check_view(function, "k", k, /*fp8=*/true);
  check_view(function, "v", v, /*fp8=*/true);
  check_view(function, "out", out);
  expect_same_dtype(function, "k", k, q);
  expect_same_dtype(function, "v", v, q);
  if (!is_fp8(q.dtype)) expect_same_dtype(function, "out", out, q);
  expect_same_dim(function, "k", k, 0, "q", q, 0);
  expect_same_dim(function, "v", v, 0, "q", q, 0);
  expect_same_dim(function, "out", out, 0, "q", q, 0);
  // Two head dims (AttentionCall): q and k share the dot product's, v and out the output's.
  expect_same_dim(function, "k", k, 3, "q", q, 3);
  expect_same_dim(function, "out", out, 3, "v", v, 3);
  expect_same_dim(function, "out", out, 1, "q", q, 1);
  expect_same_dim(function, "out", out, 2, "q", q, 2);
  expect_same_dim(function, "v", v, 1, "k", k, 1);
  expect_same_dim(function, "v", v, 2, "k", k, 2);
  const int64_t heads = q.heads(), kv_heads = k.heads();
  if (heads > 0 && (kv_heads == 0 || heads % kv_heads != 0)) {
    fail(function, "k.shape[1] (kv_heads) expected a divisor of q.shape[1] (heads) = " + std::to_string(heads) +
                       ", got " + std::to_string(kv_heads));
  }
  if (heads > 0 && q.batch() > 0 && q.seq() > 0 && q.head_dim() == 0) {
    fail(function, "q.shape[3] (head_dim) expected >= 1 when there are query rows, got 0");
  }
  if (heads > 0 && q.batch() > 0 && q.seq() > 0 && v.head_dim() == 0) {
    fail(function, "v.shape[3] (head_dim) expected >= 1 when there are query rows, got 0");
  }
  // The naive and cublas paths count (batch, head) pairs in int32.
  if (q.batch() * heads > INT_MAX) {
    fail(function, "q.shape[0] * q.shape[1] (batch * heads) expected <= " + std::to_string(INT_MAX) + ", got " +
                       std::to_string(q.batch() * heads));
  }
  if (check_out_overlap) {
    expect_distinct_addresses(function, "out", out);
    const ByteRange out_range = byte_range(out);
    expect_disjoint(function, "out", out_range, "q", byte_range(q));
    expect_disjoint(function, "out", out_range, "k", byte_range(k));
    expect_disjoint(function, "out", out_range, "v", byte_range(v));
  }
}

float checked_scale(const char* function, const AttentionOptions& options, int64_t head_dim) {
  if (!options.scale) return 1.0f / std::sqrt(float(std::max<int64_t>(head_dim, 1)));
  if (!std::isfinite(*options.scale)) {
    fail(function, "options.scale expected a finite number, got " + std::to_string(*options.scale));
  }
  return *options.scale;
}

// lse must not overlap what the call reads or writes.
void check_lse(const char* function, const AttentionOptions& options, int64_t rows, const TensorView& q,
               const TensorView& k, const TensorView& v, const TensorView& out, bool check_out_overlap) {
  if (options.lse == nullptr) return;
  expect_aligned(function, "options.lse", options.lse, alignof(float));
  const ByteRange lse = byte_range(options.lse, size_t(rows) * sizeof(float));
  expect_disjoint(function, "options.lse", lse, "q", byte_range(q));
  expect_disjoint(function, "options.lse", lse, "k", byte_range(k));
  expect_disjoint(function, "options.lse", lse, "v", byte_range(v));
  if (check_out_overlap) expect_disjoint(function, "options.lse", lse, "out", byte_range(out));
}

// key_lengths, key_start and q_offset are read while out and lse are written: none may lie in either.
void check_batch_metadata(const char* function, const char* name, const int32_t* values,
                          const AttentionOptions& options, int64_t batch, int64_t lse_rows, const TensorView& out,
                          bool check_out_overlap) {
  if (values == nullptr) return;
  expect_aligned(function, name, values, alignof(int32_t));
  const ByteRange range = byte_range(values, size_t(batch) * sizeof(int32_t));
  if (check_out_overlap) expect_disjoint(function, name, range, "out", byte_range(out));
  if (options.lse) {
    expect_disjoint(function, name, range, "options.lse", byte_range(options.lse, size_t(lse_rows) * sizeof(float)));
  }
}
void check_key_lengths(const char* function, const AttentionOptions& options, int64_t batch, int64_t lse_rows,
                       const TensorView& out, bool check_out_overlap) {
  check_batch_metadata(function, "options.key_lengths", options.key_lengths, options, batch, lse_rows, out,
                       check_out_overlap);
  check_batch_metadata(function, "options.key_start", options.key_start, options, batch, lse_rows, out,
                       check_out_overlap);
  check_batch_metadata(function, "options.q_offset", options.q_offset, options, batch, lse_rows, out,
                       check_out_overlap);
}

// The descales are read while out and lse are written; they belong to FP8 inputs only.
void check_descales(const char* function, const AttentionOptions& options, int64_t batch, int64_t kv_heads,
                    const TensorView& q, const TensorView& out, int64_t lse_rows, bool check_out_overlap,
                    AttentionCall& call) {
  const std::pair<const char*, const float*> descales[] = {{"options.q_descale", options.q_descale},
                                                           {"options.k_descale", options.k_descale},
                                                           {"options.v_descale", options.v_descale}};
  for (const auto& [name, values] : descales) {
    if (values == nullptr) continue;
    if (!is_fp8(q.dtype)) {
      fail(function, std::string(name) + " expected null (descales scale FP8 inputs; q.dtype is " + to_string(q.dtype) +
                         "), got a pointer");
    }
    expect_aligned(function, name, values, alignof(float));
    const ByteRange range = byte_range(values, size_t(batch * kv_heads) * sizeof(float));
    if (check_out_overlap) expect_disjoint(function, name, range, "out", byte_range(out));
    if (options.lse) {
      expect_disjoint(function, name, range, "options.lse", byte_range(options.lse, size_t(lse_rows) * sizeof(float)));
    }
  }
  call.q_descale = options.q_descale;
  call.k_descale = options.k_descale;
  call.v_descale = options.v_descale;
}

AttentionCall make_call(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                        const AttentionOptions& options, float scale) {
  AttentionCall call;
  call.q = q;
  call.k = k;
  call.v = v;
  call.out = out;
  call.dtype = q.dtype;
  call.batch = int(q.batch());
  call.heads = int(q.heads());
  call.kv_heads = int(k.heads());
  call.seq_q = int(q.seq());
  call.seq_k = int(k.seq());
  call.head_dim_qk = int(q.head_dim());
  call.head_dim_v = int(v.head_dim());
  call.causal = options.causal;
  call.scale = scale;
  call.key_lengths = options.key_lengths;
  call.key_start = options.key_start;
  call.q_offset = options.q_offset;
  call.lse = options.lse;
  return call;
}

}  // namespace

void check_score_mods(const char* function, const AttentionOptions& options, int64_t batch, int64_t heads,
                      int64_t seq_q, int64_t seq_k, const TensorView& q, const TensorView& out, int64_t lse_rows,
                      bool check_out_overlap, AttentionCall& call, const char* seq_k_name) {
  for (const auto& [name, value] : {std::pair<const char*, int>{"options.window_left", options.window_left},
                                    {"options.window_right", options.window_right}}) {
    if (value < -1) fail(function, std::string(name) + " expected -1 (unbounded) or >= 0, got " + std::to_string(value));
  }
  call.window_left = options.window_left;
  call.window_right = options.window_right;

  if (options.softcap) {
    if (!std::isfinite(*options.softcap) || !(*options.softcap > 0)) {
      fail(function, "options.softcap expected a finite number > 0 (or unset), got " + std::to_string(*options.softcap));
    }
    call.softcap = *options.softcap;
  }

  const ByteRange out_range = check_out_overlap ? byte_range(out) : ByteRange{};
  const ByteRange lse_range = byte_range(options.lse, size_t(std::max<int64_t>(lse_rows, 0)) * sizeof(float));

  if (options.alibi_slopes != nullptr || options.alibi_slopes_count != 0) {
    if (options.alibi_slopes == nullptr) {
      fail(function, "options.alibi_slopes expected non-null when options.alibi_slopes_count is set (" +
                         std::to_string(options.alibi_slopes_count) + "), got null");
    }
    if (options.alibi_slopes_count != heads && options.alibi_slopes_count != batch * heads) {
      fail(function, "options.alibi_slopes_count expected heads = " + std::to_string(heads) +
                         " ([heads]) or batch * heads = " + std::to_string(batch * heads) + " ([batch, heads]), got " +
                         std::to_string(options.alibi_slopes_count));
    }
    expect_aligned(function, "options.alibi_slopes", options.alibi_slopes, alignof(float));
    const ByteRange slopes = byte_range(options.alibi_slopes, size_t(options.alibi_slopes_count) * sizeof(float));
    expect_disjoint(function, "options.alibi_slopes", slopes, "out", out_range);
    expect_disjoint(function, "options.alibi_slopes", slopes, "options.lse", lse_range);
    call.alibi_slopes = options.alibi_slopes;
    // [batch, heads] when it has more than one batch's slopes (batch 1: both readings agree).
    call.alibi_stride_batch = options.alibi_slopes_count == heads ? 0 : heads;
  }

  if (!std::isfinite(options.dropout_p) || !(options.dropout_p >= 0.0f) || !(options.dropout_p < 1.0f)) {
    fail(function, "options.dropout_p expected a finite number in [0, 1), got " + std::to_string(options.dropout_p));
  }
  call.dropout_p = options.dropout_p;
  call.dropout_seed = options.dropout_seed;
  call.dropout_offset = options.dropout_offset;

  if (options.sinks != nullptr) {
    expect_aligned(function, "options.sinks", options.sinks, alignof(float));
    const ByteRange sinks = byte_range(options.sinks, size_t(heads) * sizeof(float));
    expect_disjoint(function, "options.sinks", sinks, "out", out_range);
    expect_disjoint(function, "options.sinks", sinks, "options.lse", lse_range);
    call.sinks = options.sinks;
  }

  if (options.bias) {
    TensorView bias = *options.bias;
    // FP8 inputs compute in out's dtype: a bias in "q's dtype" is in that one.
    const bool fp8_inputs = is_fp8(q.dtype);
    const DType values_dtype = fp8_inputs ? out.dtype : q.dtype;
    if (bias.dtype != DType::f32 && bias.dtype != DType::b8 && bias.dtype != values_dtype) {
      const bool known = bias.dtype == DType::f16 || bias.dtype == DType::bf16;
      fail(function, std::string("options.bias.dtype expected f32, b8 (a boolean mask) or ") +
                         (fp8_inputs ? "out.dtype (" : "q.dtype (") + to_string(values_dtype) + "), got " +
                         (known ? std::string(to_string(bias.dtype)) : "value " + std::to_string(int(bias.dtype))));
    }
    const std::array<const char*, 4> bias_dims{"batch", "heads", "seq_q", seq_k_name};
    const std::array<int64_t, 4> extent{batch, heads, seq_q, seq_k};
    for (int i = 0; i < 4; ++i) {
      const std::string dim_name = "options.bias.shape[" + std::to_string(i) + "] (" + bias_dims[i] + ")";
      if (bias.shape[i] != extent[i] && bias.shape[i] != 1) {
        fail(function, dim_name + " expected " + std::to_string(extent[i]) + " or 1 (broadcast), got " +
                           std::to_string(bias.shape[i]));
      }
      if (bias.strides[i] < 0) {
        fail(function, "options.bias.strides[" + std::to_string(i) + "] (" + bias_dims[i] + ") expected >= 0, got " +
                           std::to_string(bias.strides[i]));
      }
      // A broadcast dimension is read at index 0 whatever its stride says.
      if (bias.shape[i] == 1) bias.strides[i] = 0;
    }
    const bool has_elements = bias.shape[0] * bias.shape[1] * bias.shape[2] * bias.shape[3] > 0;
    if (has_elements && bias.data == nullptr) fail(function, "options.bias.data expected non-null, got null");
    if (reinterpret_cast<uintptr_t>(bias.data) % dtype_size(bias.dtype) != 0) {
      fail(function, "options.bias.data expected alignment to its element size " + std::to_string(dtype_size(bias.dtype)) +
                         ", got a misaligned pointer");
    }
    // The range it is read from, with its own extents: then the full extent with broadcast strides.
    const ByteRange bias_range = byte_range(bias);
    expect_disjoint(function, "options.bias", bias_range, "out", out_range);
    expect_disjoint(function, "options.bias", bias_range, "options.lse", lse_range);
    for (int i = 0; i < 4; ++i) bias.shape[i] = extent[i];
    call.bias = bias;
  }
}

namespace {

void check_causal(const char* function, Causal causal) {
  if (causal != Causal::none && causal != Causal::top_left && causal != Causal::bottom_right) {
    fail(function, "options.causal expected none, top_left or bottom_right, got value " + std::to_string(int(causal)));
  }
}

}  // namespace

void expect_disjoint(const char* function, const char* name, const ByteRange& range, const char* other_name,
                     const ByteRange& other) {
  if (range.overlaps(other)) {
    fail(function, std::string(name) + " expected not to overlap " + other_name + ", but bytes [" +
                       std::to_string(range.begin) + ", " + std::to_string(range.end) + ") and [" +
                       std::to_string(other.begin) + ", " + std::to_string(other.end) + ") intersect");
  }
}

void check_view(const char* function, const char* name, const TensorView& view) {
  check_view(function, name, view, /*fp8=*/false);
}

void check_view(const char* function, const char* name, const TensorView& view, bool fp8) {
  const bool fp8_dtype = view.dtype == DType::e4m3 || view.dtype == DType::e5m2;
  if (view.dtype != DType::f32 && view.dtype != DType::f16 && view.dtype != DType::bf16 && !(fp8 && fp8_dtype)) {
    const bool named = view.dtype == DType::b8 || fp8_dtype;
    fail(function, std::string(name) + ".dtype expected f32, f16" + (fp8 ? ", bf16, e4m3 or e5m2" : " or bf16") +
                       ", got " +
                       (named ? std::string(to_string(view.dtype)) : "value " + std::to_string(int(view.dtype))) +
                       (fp8_dtype ? " (FP8 is for a KV cache's K and V and for attention()'s q, k and v)" : ""));
  }
  for (int i = 0; i < 4; ++i) {
    if (view.shape[i] < 0) fail(function, dim(name, i) + " expected >= 0, got " + std::to_string(view.shape[i]));
    if (view.shape[i] > kMaxExtent) {
      fail(function, dim(name, i) + " expected <= " + std::to_string(kMaxExtent) + ", got " + std::to_string(view.shape[i]));
    }
    if (view.strides[i] < 0) {
      fail(function, std::string(name) + ".strides[" + std::to_string(i) + "] (" + kDimNames[i] +
                         ") expected >= 0, got " + std::to_string(view.strides[i]));
    }
  }
  if (view.numel() == 0) return;
  if (view.data == nullptr) fail(function, std::string(name) + ".data expected non-null, got null");
  if (reinterpret_cast<uintptr_t>(view.data) % dtype_size(view.dtype) != 0) {
    fail(function, std::string(name) + ".data expected alignment to its element size " +
                       std::to_string(dtype_size(view.dtype)) + " (" + to_string(view.dtype) + "), got a misaligned pointer");
  }
  if (view.strides[3] != 1) {
    fail(function, std::string(name) + ".strides[3] (head_dim) expected 1, got " + std::to_string(view.strides[3]));
  }
}

void expect_distinct_addresses(const char* function, const char* name, const TensorView& view) {
  if (view.numel() == 0) return;
  // Dimensions of extent > 1, innermost (smallest stride) first: each stride must step past every
  // element the dimensions inside it reach, or two indices share an address.
  std::array<int, 4> order{0, 1, 2, 3};
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return view.strides[a] < view.strides[b]; });
  int64_t reach = 0;  // largest offset the inner dimensions reach
  for (int i : order) {
    if (view.shape[i] == 1) continue;
    if (view.strides[i] <= reach) {
      fail(function, std::string(name) + ".strides[" + std::to_string(i) + "] (" + kDimNames[i] + ") = " +
                         std::to_string(view.strides[i]) + " makes elements of " + name +
                         " share addresses (a written view needs distinct addresses; expected > " +
                         std::to_string(reach) + ")");
    }
    reach += (view.shape[i] - 1) * view.strides[i];
  }
}

void expect_aligned(const char* function, const char* name, const void* data, size_t alignment) {
  if (reinterpret_cast<uintptr_t>(data) % alignment != 0) {
    fail(function, std::string(name) + " expected " + std::to_string(alignment) +
                       "-byte alignment, got a misaligned pointer");
  }
}

bool is_dense(const TensorView& view) {
  // Dimensions of extent > 1, innermost (smallest stride) first; each stride must equal the number
  // of elements spanned by the dimensions inside it.
  std::array<int, 4> order{0, 1, 2, 3};
  std::sort(order.begin(), order.end(), [&](int a, int b) { return view.strides[a] < view.strides[b]; });
  int64_t expected = 1;
  for (int i : order) {
    if (view.shape[i] == 1) continue;
    if (view.strides[i] != expected) return false;
    expected *= view.shape[i];
  }
  return true;
}

ByteRange byte_range(const TensorView& view) {
  if (view.numel() == 0 || view.data == nullptr) return {};
  int64_t last = 0;
  for (int i = 0; i < 4; ++i) last += (view.shape[i] - 1) * view.strides[i];
  const uintptr_t begin = reinterpret_cast<uintptr_t>(view.data);
  return {begin, begin + uintptr_t(last + 1) * dtype_size(view.dtype)};
}

ByteRange byte_range(const void* data, size_t bytes) {
  if (data == nullptr || bytes == 0) return {};
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  return {begin, begin + bytes};
}

std::string describe(const AttentionCall& call) {
  std::string text = std::string(to_string(call.dtype)) + " b" + std::to_string(call.batch) + " h" +
                     std::to_string(call.heads) + "/" + std::to_string(call.kv_heads) + " q" +
                     std::to_string(call.seq_q) + " k" + std::to_string(call.seq_k) + " d" +
                     std::to_string(call.head_dim_qk);
  if (!call.equal_head_dims()) text += " dv" + std::to_string(call.head_dim_v);
  if (call.causal != Causal::none) text += std::string(" causal=") + to_string(call.causal);
  if (call.key_lengths) text += " key_lengths";
  if (call.key_start) text += " key_start";
  if (call.q_offset) text += " q_offset";
  if (call.lse) text += " lse";
  if (call.window_left >= 0 || call.window_right >= 0) {
    text += " window=" + std::to_string(call.window_left) + "," + std::to_string(call.window_right);
  }
  if (call.softcap > 0) text += " softcap=" + std::to_string(call.softcap);
  if (call.alibi_slopes) text += " alibi";
  if (call.bias) text += std::string(" bias=") + to_string(call.bias->dtype);
  if (call.sinks) text += " sinks";
  if (call.dropout_p > 0) text += " dropout_p=" + std::to_string(call.dropout_p);
  if (call.varlen()) text += " varlen";
  if (call.fp8()) text += std::string(" out=") + to_string(call.out.dtype);
  return text;
}

AttentionCall validate_attention(const char* function, const TensorView& q, const TensorView& k, const TensorView& v,
                                 const TensorView& out, const AttentionOptions& options, bool check_out_overlap) {
  check_common(function, q, k, v, out, check_out_overlap);
  check_causal(function, options.causal);
  check_lse(function, options, q.batch() * q.heads() * q.seq(), q, k, v, out, check_out_overlap);
  check_key_lengths(function, options, q.batch(), q.batch() * q.heads() * q.seq(), out, check_out_overlap);
  AttentionCall call = make_call(q, k, v, out, options, checked_scale(function, options, q.head_dim()));
  check_score_mods(function, options, q.batch(), q.heads(), q.seq(), k.seq(), q, out, q.batch() * q.heads() * q.seq(),
                   check_out_overlap, call);
  check_descales(function, options, q.batch(), k.heads(), q, out, q.batch() * q.heads() * q.seq(), check_out_overlap,
                 call);
  return call;
}

AttentionCall validate_attention_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                                        const TensorView& out, const int32_t* cu_seqlens_q,
                                        const int32_t* cu_seqlens_k, int batch, int max_seqlen_q, int max_seqlen_k,
                                        const AttentionOptions& options, const char* function,
                                        bool check_out_overlap) {
  check_common(function, q, k, v, out, check_out_overlap);
  check_causal(function, options.causal);
  // Packed sequences live in one row range per tensor: the batch dimension of every view is 1.
  for (const auto& [name, view] : {std::pair<const char*, const TensorView&>{"q", q}, {"k", k}, {"v", v}, {"out", out}}) {
    if (view.batch() != 1) {
      fail(function, dim(name, 0) + " expected 1 (sequences are packed along seq), got " + std::to_string(view.batch()));
    }
  }
  if (batch < 0) fail(function, "batch expected >= 0, got " + std::to_string(batch));
  if (max_seqlen_q < 0) fail(function, "max_seqlen_q expected >= 0, got " + std::to_string(max_seqlen_q));
  if (max_seqlen_k < 0) fail(function, "max_seqlen_k expected >= 0, got " + std::to_string(max_seqlen_k));
  if (max_seqlen_q > q.seq()) {
    fail(function, "max_seqlen_q expected <= q.shape[2] (total_q) = " + std::to_string(q.seq()) + ", got " +
                       std::to_string(max_seqlen_q));
  }
  if (max_seqlen_k > k.seq()) {
    fail(function, "max_seqlen_k expected <= k.shape[2] (total_k) = " + std::to_string(k.seq()) + ", got " +
                       std::to_string(max_seqlen_k));
  }
  if (batch > 0 && cu_seqlens_q == nullptr) fail(function, "cu_seqlens_q expected non-null (batch > 0), got null");
  if (batch > 0 && cu_seqlens_k == nullptr) fail(function, "cu_seqlens_k expected non-null (batch > 0), got null");
  expect_aligned(function, "cu_seqlens_q", cu_seqlens_q, alignof(int32_t));
  expect_aligned(function, "cu_seqlens_k", cu_seqlens_k, alignof(int32_t));
  check_lse(function, options, q.heads() * q.seq(), q, k, v, out, check_out_overlap);
  check_key_lengths(function, options, batch, q.heads() * q.seq(), out, check_out_overlap);
  // The offsets are read while out and lse are written: they must not lie in either.
  const ByteRange lse_range = byte_range(options.lse, size_t(q.heads() * q.seq()) * sizeof(float));
  for (const auto& [name, offsets] : {std::pair<const char*, const int32_t*>{"cu_seqlens_q", cu_seqlens_q},
                                      {"cu_seqlens_k", cu_seqlens_k}}) {
    const ByteRange range = byte_range(offsets, batch > 0 ? size_t(batch + 1) * sizeof(int32_t) : 0);
    if (check_out_overlap) expect_disjoint(function, name, range, "out", byte_range(out));
    expect_disjoint(function, name, range, "options.lse", lse_range);
  }

  AttentionCall call = make_call(q, k, v, out, options, checked_scale(function, options, q.head_dim()));
  call.batch = batch;
  call.seq_q = max_seqlen_q;
  call.seq_k = max_seqlen_k;
  call.cu_seqlens_q = cu_seqlens_q;
  call.cu_seqlens_k = cu_seqlens_k;
  check_score_mods(function, options, batch, q.heads(), max_seqlen_q, max_seqlen_k, q, out, q.heads() * q.seq(),
                   check_out_overlap, call);
  check_descales(function, options, batch, k.heads(), q, out, q.heads() * q.seq(), check_out_overlap, call);
  return call;
}

}  // namespace selfattn::detail
