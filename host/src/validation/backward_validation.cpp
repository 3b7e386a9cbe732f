// Argument checking for the backward entry points (backward_validation.h).
#include "validation/backward_validation.h"

#include <string>
#include <utility>

#include "validation/attention_validation.h"
#include "selfattn/error.h"

namespace selfattn::detail {
namespace {

[[noreturn]] void fail(const char* function, const std::string& message) {
  throw InvalidArgument(std::string(function) + ": " + message);
}

const char* const kDimNames[4] = {"batch", "heads", "seq", "head_dim"};

// `name` must have `like`'s batch, heads and seq (`like_name` in the message) and the head dim of
// `dim_like` (`dim_like_name`): a gradient's or dout's head dim is that of the tensor it stands
// for (out's and v's may differ from q's and k's: head_dim_v).
void expect_shape(const char* function, const char* name, const TensorView& view, const char* like_name,
                  const TensorView& like, const char* dim_like_name, const TensorView& dim_like) {
  for (int i = 0; i < 4; ++i) {
    const TensorView& ref = i < 3 ? like : dim_like;
    if (view.shape[i] != ref.shape[i]) {
      fail(function, std::string(name) + ".shape[" + std::to_string(i) + "] (" + kDimNames[i] + ") expected " +
                         std::to_string(ref.shape[i]) + " (" + (i < 3 ? like_name : dim_like_name) + ".shape[" +
                         std::to_string(i) + "]), got " + std::to_string(view.shape[i]));
    }
  }
}

void expect_gradient_dtype(const char* function, const char* name, const TensorView& view, DType input) {
  if (view.dtype != input && view.dtype != DType::f32) {
    fail(function, std::string(name) + ".dtype expected " + to_string(input) + " (q.dtype) or f32, got " +
                       to_string(view.dtype));
  }
}

// The backward's own arguments, on top of a forward call that passed the forward's validation.
BackwardCall check_backward(const char* function, AttentionCall forward, const TensorView& dout, const float* lse,
                            const TensorView& dq, const TensorView& dk, const TensorView& dv,
                            const AttentionOptions& options, const BackwardOptions& backward) {
  const TensorView& q = forward.q;
  const TensorView& k = forward.k;
  if (forward.fp8()) {
    fail(function, std::string("q.dtype expected f32, f16 or bf16, got ") + to_string(q.dtype) +
                       " (the backward does not take FP8 inputs)");
  }
  check_view(function, "dout", dout);
  check_view(function, "dq", dq);
  check_view(function, "dk", dk);
  check_view(function, "dv", dv);
  if (dout.dtype != q.dtype) {
    fail(function, std::string("dout.dtype expected ") + to_string(q.dtype) + " (q.dtype), got " + to_string(dout.dtype));
  }
  expect_shape(function, "dout", dout, "q", q, "out", forward.out);
  expect_shape(function, "dq", dq, "q", q, "q", q);
  expect_shape(function, "dk", dk, "k", k, "k", k);
  expect_shape(function, "dv", dv, "k", k, "v", forward.v);
  expect_gradient_dtype(function, "dq", dq, q.dtype);
  expect_gradient_dtype(function, "dk", dk, q.dtype);
  expect_gradient_dtype(function, "dv", dv, q.dtype);
  expect_distinct_addresses(function, "dq", dq);
  expect_distinct_addresses(function, "dk", dk);
  expect_distinct_addresses(function, "dv", dv);

  BackwardCall call;
  call.dout = dout;
  call.lse = lse;
  call.dq = dq;
  call.dk = dk;
  call.dv = dv;
  call.deterministic = backward.deterministic;
  call.dlse = backward.dlse;
  call.dsinks = backward.dsinks;
  call.forward = std::move(forward);
  const int64_t rows = backward_query_rows(call);
  // Without heads both arrays are empty, and an empty array's pointer may be null (PyTorch's often is).
  if (backward.dsinks != nullptr && call.forward.sinks == nullptr && call.forward.heads > 0) {
    fail(function, "backward.dsinks expected null without options.sinks (there is no sink to differentiate), got a "
                   "pointer");
  }
  // The sinks' gradient needs the LSE even where no key exists (each row's sink probability).
  if (rows > 0 && (k.seq() > 0 || backward.dsinks != nullptr) && lse == nullptr) {
    fail(function, "lse expected the forward's LSE (fp32, " + std::to_string(rows) + " rows), got null");
  }
  expect_aligned(function, "lse", lse, alignof(float));
  expect_aligned(function, "backward.dlse", backward.dlse, alignof(float));
  expect_aligned(function, "backward.dsinks", backward.dsinks, alignof(float));

  // Nothing written may overlap anything read, or another gradient.
  const AttentionCall& f = call.forward;
  const std::pair<const char*, ByteRange> written[] = {
      {"dq", byte_range(dq)},
      {"dk", byte_range(dk)},
      {"dv", byte_range(dv)},
      {"backward.dsinks", byte_range(backward.dsinks, size_t(f.heads) * sizeof(float))}};
  std::pair<const char*, ByteRange> read[] = {
      {"q", byte_range(q)},
      {"k", byte_range(k)},
      {"v", byte_range(f.v)},
      {"out", byte_range(f.out)},
      {"dout", byte_range(dout)},
      {"lse", byte_range(lse, size_t(rows) * sizeof(float))},
      {"backward.dlse", byte_range(backward.dlse, size_t(rows) * sizeof(float))},
      {"options.key_lengths", byte_range(options.key_lengths, size_t(f.batch) * sizeof(int32_t))},
      {"options.key_start", byte_range(options.key_start, size_t(f.batch) * sizeof(int32_t))},
      {"options.q_offset", byte_range(options.q_offset, size_t(f.batch) * sizeof(int32_t))},
      {"options.alibi_slopes", byte_range(options.alibi_slopes, size_t(options.alibi_slopes_count) * sizeof(float))},
      {"options.bias", f.bias ? byte_range(*f.bias) : ByteRange{}},
      {"options.sinks", byte_range(f.sinks, size_t(f.heads) * sizeof(float))},
      {"cu_seqlens_q", byte_range(f.cu_seqlens_q, f.varlen() ? size_t(f.batch + 1) * sizeof(int32_t) : 0)},
      {"cu_seqlens_k", byte_range(f.cu_seqlens_k, f.varlen() ? size_t(f.batch + 1) * sizeof(int32_t) : 0)},
  };
  constexpr size_t kWritten = sizeof(written) / sizeof(written[0]);
  for (size_t w = 0; w < kWritten; ++w) {
    for (const auto& [name, range] : read) expect_disjoint(function, written[w].first, written[w].second, name, range);
    for (size_t other = w + 1; other < kWritten; ++other) {
      expect_disjoint(function, written[w].first, written[w].second, written[other].first, written[other].second);
    }
  }
  return call;
}

void check_forward_options(const char* function, const AttentionOptions& options) {
  if (options.lse != nullptr) {
    fail(function, "options.lse expected null (the forward's LSE is the lse argument), got a pointer");
  }
}

}  // namespace

BackwardCall validate_backward(const char* function, const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& out, const TensorView& dout, const float* lse, const TensorView& dq,
                               const TensorView& dk, const TensorView& dv, const AttentionOptions& options,
                               const BackwardOptions& backward) {
  check_forward_options(function, options);
  AttentionCall forward = validate_attention(function, q, k, v, out, options);
  return check_backward(function, std::move(forward), dout, lse, dq, dk, dv, options, backward);
}

BackwardCall validate_varlen_backward(const char* function, const TensorView& q, const TensorView& k,
                                      const TensorView& v, const TensorView& out, const TensorView& dout,
                                      const float* lse, const TensorView& dq, const TensorView& dk,
                                      const TensorView& dv, const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k,
                                      int batch, int max_seqlen_q, int max_seqlen_k, const AttentionOptions& options,
                                      const BackwardOptions& backward) {
  check_forward_options(function, options);
  AttentionCall forward = validate_attention_varlen(q, k, v, out, cu_seqlens_q, cu_seqlens_k, batch, max_seqlen_q,
                                                    max_seqlen_k, options, function);
  return check_backward(function, std::move(forward), dout, lse, dq, dk, dv, options, backward);
}

}  // namespace selfattn::detail
