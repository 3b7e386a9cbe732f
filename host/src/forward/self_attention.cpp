// self_attention(): the projections Q = X W^Q, K = X W^K, V = X W^V as cuBLAS-convention GEMMs
// (fp32 accumulation) into the workspace, then attention on head views of them (planned, with every
// check that can throw, before the first GEMM), then the optional output projection
// concat_heads(attention) W^O.
//
// Row-major Y[M x N] = X[M x K] W[K x N] is, read column-major, Y^T = W^T X^T: a GEMM with
// m = N, n = M, k = K, A = W (lda = W's row stride), B = X (ldb = X's row stride), C = Y (ldc = N).
#include <array>
#include <climits>
#include <string>
#include <utility>

#include "validation/attention_validation.h"
#include "runtime/context_state.h"
#include "forward/paths.h"
#include "selfattn/attention.h"
#include "selfattn/error.h"

namespace selfattn {
namespace {

constexpr const char* kFunction = "self_attention";

[[noreturn]] void fail(const std::string& message) { throw InvalidArgument(std::string(kFunction) + ": " + message); }

void check_matrix(const char* name, const MatrixView& m, DType dtype) {
  if (m.rows < 0 || m.cols < 0) {
    fail(std::string(name) + " shape expected >= 0, got " + std::to_string(m.rows) + " x " + std::to_string(m.cols));
  }
  if (m.row_stride < m.cols) {
    fail(std::string(name) + ".row_stride expected >= cols = " + std::to_string(m.cols) + ", got " +
         std::to_string(m.row_stride));
  }
  if (m.dtype != dtype) {
    fail(std::string(name) + ".dtype expected " + to_string(dtype) + " (x.dtype), got " + to_string(m.dtype));
  }
  if (m.rows * m.cols > 0 && m.data == nullptr) fail(std::string(name) + ".data expected non-null, got null");
  // A GEMM takes row_stride as its leading dimension and cols (<= row_stride) as m: both ints.
  if (m.row_stride > INT_MAX) {
    fail(std::string(name) + ".row_stride expected <= " + std::to_string(INT_MAX) + ", got " +
         std::to_string(m.row_stride));
  }
}

// The sequence stride of a view a GEMM reads or writes is its leading dimension: from `rows` (the
// elements of one row) up to INT_MAX.
void check_leading_dimension(const char* name, const TensorView& view, int64_t rows) {
  const int64_t stride = view.strides[2];
  if (stride < rows || stride > INT_MAX) {
    fail(std::string(name) + ".strides[2] (seq) expected in [" + std::to_string(rows) + ", " + std::to_string(INT_MAX) +
         "] (a GEMM's leading dimension), got " + std::to_string(stride));
  }
}

void expect_rows(const char* name, const MatrixView& m, int64_t rows, const char* why) {
  if (m.rows != rows) {
    fail(std::string(name) + ".rows expected " + std::to_string(rows) + " (" + why + "), got " + std::to_string(m.rows));
  }
}

void expect_out_shape(const TensorView& out, const std::array<int64_t, 4>& shape, const char* layout) {
  if (out.shape != shape) {
    auto text = [](const std::array<int64_t, 4>& s) {
      return "[" + std::to_string(s[0]) + ", " + std::to_string(s[1]) + ", " + std::to_string(s[2]) + ", " +
             std::to_string(s[3]) + "]";
    };
    fail(std::string("out.shape expected ") + text(shape) + " " + layout + ", got " + text(out.shape));
  }
}

detail::ByteRange matrix_range(const MatrixView& m) {
  if (m.rows == 0 || m.cols == 0) return {};
  return detail::byte_range(m.data, size_t((m.rows - 1) * m.row_stride + m.cols) * dtype_size(m.dtype));
}

size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Y[b] = X[b] W for every batch b: X rows of d_model elements, Y rows of w.cols elements (dense).
void project(detail::Device& device, const TensorView& x, const MatrixView& w, void* y) {
  const int64_t batch = x.batch(), seq = x.seq(), d_model = x.head_dim();
  if (d_model == 0) {  // an empty sum: Y = 0 (GEMMs with k = 0 are not relied upon)
    device.fill(y, 0, size_t(batch * seq * w.cols) * dtype_size(x.dtype));
    return;
  }
  detail::GemmBatch g;
  g.m = int(w.cols);
  g.n = int(seq);
  g.k = int(d_model);
  g.a = w.data, g.a_type = w.dtype, g.lda = w.row_stride, g.stride_a = 0;
  g.b = x.data, g.b_type = x.dtype, g.ldb = x.strides[2], g.stride_b = x.strides[0];
  g.c = y, g.c_type = x.dtype, g.ldc = w.cols, g.stride_c = seq * w.cols;
  g.batch_count = int(batch);
  device.gemm_strided_batched(g);
}

}  // namespace

void self_attention(Context& ctx, const TensorView& x, const MatrixView& wq, const MatrixView& wk,
                    const MatrixView& wv, int heads, const TensorView& out, const AttentionOptions& options,
                    const MatrixView* wo) {
  detail::ContextState& state = ctx.state();
  detail::check_view(kFunction, "x", x);
  detail::check_view(kFunction, "out", out);
  detail::expect_aligned(kFunction, "options.lse", options.lse, alignof(float));
  if (x.heads() != 1) fail("x.shape[1] expected 1 (x is [batch, 1, seq, d_model]), got " + std::to_string(x.heads()));
  if (heads < 1) fail("heads expected >= 1, got " + std::to_string(heads));
  const DType dtype = x.dtype;
  const int64_t batch = x.batch(), seq = x.seq(), d_model = x.head_dim();
  check_matrix("wq", wq, dtype);
  check_matrix("wk", wk, dtype);
  check_matrix("wv", wv, dtype);
  expect_rows("wq", wq, d_model, "x.shape[3], d_model");
  expect_rows("wk", wk, d_model, "x.shape[3], d_model");
  expect_rows("wv", wv, d_model, "x.shape[3], d_model");
  if (wq.cols == 0 || wq.cols % heads != 0) {
    fail("wq.cols expected a positive multiple of heads = " + std::to_string(heads) + ", got " + std::to_string(wq.cols));
  }
  const int64_t head_dim = wq.cols / heads;
  if (wv.cols != wk.cols) fail("wv.cols expected " + std::to_string(wk.cols) + " (wk.cols), got " + std::to_string(wv.cols));
  if (wk.cols == 0 || wk.cols % head_dim != 0 || heads % (wk.cols / head_dim) != 0) {
    fail("wk.cols expected kv_heads * head_dim with head_dim = " + std::to_string(head_dim) +
         " and kv_heads dividing heads = " + std::to_string(heads) + ", got " + std::to_string(wk.cols));
  }
  const int64_t kv_heads = wk.cols / head_dim;
  if (out.dtype != dtype) fail(std::string("out.dtype expected ") + to_string(dtype) + " (x.dtype), got " + to_string(out.dtype));
  if (d_model > 0) check_leading_dimension("x", x, d_model);
  if (wo) {
    check_matrix("wo", *wo, dtype);
    expect_rows("wo", *wo, heads * head_dim, "heads * head_dim");
    expect_out_shape(out, {batch, 1, seq, wo->cols}, "([batch, 1, seq, wo.cols])");
    if (wo->cols > 0) check_leading_dimension("out", out, wo->cols);
  } else {
    expect_out_shape(out, {batch, heads, seq, head_dim}, "([batch, heads, seq, head_dim])");
  }
  detail::expect_distinct_addresses(kFunction, "out", out);
  const detail::ByteRange out_range = detail::byte_range(out);
  const std::pair<const char*, detail::ByteRange> inputs[] = {{"x", detail::byte_range(x)},
                                                              {"wq", matrix_range(wq)},
                                                              {"wk", matrix_range(wk)},
                                                              {"wv", matrix_range(wv)},
                                                              {"wo", wo ? matrix_range(*wo) : detail::ByteRange{}}};
  for (const auto& [name, range] : inputs) {
    if (out_range.overlaps(range)) fail(std::string("out expected not to overlap ") + name);
  }
  // LSE is written between the projections and W^O: it must not lie in out or in what they read.
  const detail::ByteRange lse_range = detail::byte_range(options.lse, size_t(batch * heads * seq) * sizeof(float));
  if (lse_range.overlaps(out_range)) fail("options.lse expected not to overlap out");
  for (const auto& [name, range] : inputs) {
    if (lse_range.overlaps(range)) fail(std::string("options.lse expected not to overlap ") + name);
  }
  if (batch == 0 || seq == 0) return;

  // The workspace holds Q, K, V (bshd: one row per token), the attention output when W^O follows,
  // then the attention step's scores.
  const size_t element = dtype_size(dtype);
  const size_t q_bytes = aligned(size_t(batch * seq * heads * head_dim) * element);
  const size_t kv_bytes = aligned(size_t(batch * seq * kv_heads * head_dim) * element);
  const size_t k_offset = q_bytes, v_offset = k_offset + kv_bytes, attended_offset = v_offset + kv_bytes;
  const size_t projection_bytes = attended_offset + (wo ? q_bytes : 0);
  const auto at = [](void* base, size_t offset) { return static_cast<unsigned char*>(base) + offset; };
  const auto plan_at = [&](void* base) {
    const TensorView q_view = TensorView::bshd(at(base, 0), dtype, batch, heads, seq, head_dim);
    const TensorView k_view = TensorView::bshd(at(base, k_offset), dtype, batch, kv_heads, seq, head_dim);
    const TensorView v_view = TensorView::bshd(at(base, v_offset), dtype, batch, kv_heads, seq, head_dim);
    const TensorView attended =
        wo ? TensorView::bshd(at(base, attended_offset), dtype, batch, heads, seq, head_dim) : out;
    const detail::AttentionCall call = detail::validate_attention(kFunction, q_view, k_view, v_view, attended, options);
    return detail::plan_attention(state, call, options.path, kFunction, projection_bytes);
  };
  // Everything that can throw runs before the first GEMM. The plan's views lie in the workspace,
  // which is sized for the plan: plan on the projections' reservation, then again if growing it
  // for the scores moved it (the same shapes on another 256-byte aligned base: the same plan).
  void* base = state.workspace.reserve(projection_bytes, std::string(kFunction) + ": Q, K, V" +
                                                             (wo ? " and the attention output" : ""));
  detail::PlannedAttention planned = plan_at(base);
  void* sized = state.workspace.reserve(projection_bytes + planned.workspace_bytes(),
                                        std::string(kFunction) + ": projections and scores");
  if (sized != base) planned = plan_at(base = sized);

  project(*state.device, x, wq, at(base, 0));
  project(*state.device, x, wk, at(base, k_offset));
  project(*state.device, x, wv, at(base, v_offset));
  detail::run_planned(state, planned, at(base, projection_bytes));
  if (!wo) return;

  // out[b] = concat_heads(attended[b]) W^O: attended's bshd rows are already the concatenation.
  detail::GemmBatch g;
  g.m = int(wo->cols);
  g.n = int(seq);
  g.k = int(heads * head_dim);
  g.a = wo->data, g.a_type = dtype, g.lda = wo->row_stride, g.stride_a = 0;
  g.b = at(base, attended_offset), g.b_type = dtype, g.ldb = heads * head_dim, g.stride_b = seq * heads * head_dim;
  g.c = out.data, g.c_type = dtype, g.ldc = out.strides[2], g.stride_c = out.strides[0];
  g.batch_count = int(batch);
  if (g.m > 0) state.device->gemm_strided_batched(g);
}

}  // namespace selfattn
