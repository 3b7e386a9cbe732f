// The backward calls' entry points (host/src/attention_backward.cpp): attention_backward and
// attention_varlen_backward, and the arrays they take (call.h declares them).
#include <optional>
#include <string>
#include <vector>

#include "entry_points.h"

namespace selfattn_python {

BackwardArgs add_backward_args(Call& call, const InArray& q, const InArray& k, const InArray& v, const InArray& out,
                               const InArray& dout, const InArray& lse, const OutArray& dq, const OutArray& dk,
                               const OutArray& dv, bool bf16_as_uint16) {
  const Holds data = data_kind(bf16_as_uint16);
  return {call.add(Arg("q", q, false, data)),      call.add(Arg("k", k, false, data)),
          call.add(Arg("v", v, false, data)),      call.add(Arg("out", out, false, data)),
          call.add(Arg("dout", dout, false, data)), call.add(Arg("lse", lse, false, Holds::vector)),
          call.add(Arg("dq", dq, true, data)),     call.add(Arg("dk", dk, true, data)),
          call.add(Arg("dv", dv, true, data))};
}

BackwardExtras add_backward_extras(Call& call, const std::optional<InArray>& dlse,
                                   const std::optional<OutArray>& dsinks, const std::vector<int64_t>& lse_shape,
                                   int64_t heads) {
  const Arg* adlse = dlse ? &call.add(Arg("dlse", *dlse, false, Holds::vector)) : nullptr;
  if (adlse) expect_lse(*adlse, dlse->dtype(), lse_shape, "lse's");
  const Arg* adsinks = dsinks ? &call.add(Arg("dsinks", *dsinks, true, Holds::vector)) : nullptr;
  if (adsinks) expect_lse(*adsinks, dsinks->dtype(), {heads}, "heads");
  return {adlse, adsinks};
}

void set_backward_options(selfattn::BackwardOptions& backward, const BackwardExtras& extras) {
  backward.dlse = extras.dlse ? static_cast<const float*>(extras.dlse->data) : nullptr;
  backward.dsinks = extras.dsinks ? static_cast<float*>(extras.dsinks->data) : nullptr;
}

// The backward (arrays as add_backward_args takes them).
void attention_backward(BoundContext& context, InArray q, InArray k, InArray v, InArray out, InArray dout, InArray lse,
                        OutArray dq, OutArray dk, OutArray dv, std::optional<std::string> causal,
                        std::optional<float> scale, std::string path, std::optional<InArray> key_lengths,
                        const MaskArgs& masks, bool deterministic,
                        std::optional<InArray> dlse, std::optional<OutArray> dsinks, bool bf16_as_uint16,
                        float dropout_p, uint64_t dropout_seed, uint64_t dropout_offset) {
  selfattn::AttentionOptions options = make_options(causal, scale, path, masks);
  set_dropout_options(options, dropout_p, dropout_seed, dropout_offset);
  selfattn::BackwardOptions backward;
  backward.deterministic = deterministic;
  Call call(context);
  const BackwardArgs a = add_backward_args(call, q, k, v, out, dout, lse, dq, dk, dv, bf16_as_uint16);
  const Arg* alengths = key_lengths ? &call.add(Arg("key_lengths", *key_lengths, false, Holds::vector)) : nullptr;
  const selfattn::TensorView q_shape = tensor_view(a.q);
  if (alengths) expect_int32_vector(*alengths, key_lengths->dtype(), q_shape.batch(), "batch");
  const std::vector<int64_t> lse_shape = {q_shape.batch(), q_shape.heads(), q_shape.seq()};
  expect_lse(a.lse, lse.dtype(), lse_shape, "batch, heads, seq_q");
  const BackwardExtras extras = add_backward_extras(call, dlse, dsinks, lse_shape, q_shape.heads());
  const ModArgs mods = add_mod_args(call, masks, q_shape.batch(),
                                    q_shape.heads(), bf16_as_uint16);
  run_call(context, call, [&] {
    set_backward_options(backward, extras);
    options.key_lengths = alengths ? static_cast<const int32_t*>(alengths->data) : nullptr;
    set_mod_options(options, mods);
    selfattn::attention_backward(call.ctx(), tensor_view(a.q), tensor_view(a.k), tensor_view(a.v),
                                 tensor_view(a.out), tensor_view(a.dout), static_cast<const float*>(a.lse.data),
                                 tensor_view(a.dq), tensor_view(a.dk), tensor_view(a.dv), options, backward);
  });
}

// The varlen backward: as attention_backward, every array packed as attention_varlen takes it (q,
// out, dout, dq as [1, heads, total_q, head_dim] views; k, v, dk, dv over total_k), lse
// [heads, total_q].
void attention_varlen_backward(BoundContext& context, InArray q, InArray k, InArray v, InArray out, InArray dout,
                               InArray lse, OutArray dq, OutArray dk, OutArray dv, InArray cu_seqlens_q,
                               InArray cu_seqlens_k, int max_seqlen_q, int max_seqlen_k,
                               std::optional<std::string> causal, std::optional<float> scale, std::string path,
                               std::optional<InArray> key_lengths, const MaskArgs& masks, bool deterministic,
                               std::optional<InArray> dlse, std::optional<OutArray> dsinks, bool bf16_as_uint16,
                               float dropout_p, uint64_t dropout_seed, uint64_t dropout_offset) {
  selfattn::AttentionOptions options = make_options(causal, scale, path, masks);
  set_dropout_options(options, dropout_p, dropout_seed, dropout_offset);
  selfattn::BackwardOptions backward;
  backward.deterministic = deterministic;
  Call call(context);
  const BackwardArgs a = add_backward_args(call, q, k, v, out, dout, lse, dq, dk, dv, bf16_as_uint16);
  const CuSeqlens cu = add_cu_seqlens(call, cu_seqlens_q, cu_seqlens_k);
  const selfattn::TensorView q_shape = tensor_view(a.q);
  const std::vector<int64_t> lse_shape = {q_shape.heads(), q_shape.seq()};
  expect_lse(a.lse, lse.dtype(), lse_shape, "heads, total_q");
  const BackwardExtras extras = add_backward_extras(call, dlse, dsinks, lse_shape, q_shape.heads());
  const ModArgs mods =
      add_mod_args(call, masks, cu.batch, q_shape.heads(), bf16_as_uint16);
  const Arg* alengths = key_lengths ? &call.add(Arg("key_lengths", *key_lengths, false, Holds::vector)) : nullptr;
  if (alengths) expect_int32_vector(*alengths, key_lengths->dtype(), cu.batch, "batch");
  run_call(context, call, [&] {
    set_backward_options(backward, extras);
    options.key_lengths = alengths ? static_cast<const int32_t*>(alengths->data) : nullptr;
    set_mod_options(options, mods);
    selfattn::attention_varlen_backward(call.ctx(), tensor_view(a.q), tensor_view(a.k), tensor_view(a.v),
                                        tensor_view(a.out), tensor_view(a.dout),
                                        static_cast<const float*>(a.lse.data), tensor_view(a.dq), tensor_view(a.dk),
                                        tensor_view(a.dv), static_cast<const int32_t*>(cu.q.data),
                                        static_cast<const int32_t*>(cu.k.data), int(cu.batch), max_seqlen_q,
                                        max_seqlen_k, options, backward);
  });
}

}  // namespace selfattn_python
