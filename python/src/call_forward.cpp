// The forward calls' entry points (host/src/attention.cpp, probabilities.cpp and self_attention.cpp):
// attention, attention_varlen, attention_probabilities (dense or varlen) and self_attention, and the arrays the first two take (call.h declares them).
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "entry_points.h"

namespace selfattn_python {

AttentionArgs add_attention_args(Call& call, const InArray& q, const InArray& k, const InArray& v, const OutArray& out,
                                 bool bf16_as_uint16, std::optional<selfattn::DType> fp8) {
  const Holds data = data_kind(bf16_as_uint16);
  return {call.add(Arg("q", q, false, data, fp8)), call.add(Arg("k", k, false, data, fp8)),
          call.add(Arg("v", v, false, data, fp8)), call.add(Arg("out", out, true, data, fp8))};
}

namespace {

// FP8 inputs' descales (AttentionOptions::q_descale, ...): fp32 [batch, kv_heads] contiguous each,
// read from bare pointers, so their shapes are checked here; the library refuses them beside
// 16- and 32-bit inputs.
struct Descales {
  const Arg *q, *k, *v;
};

Descales add_descales(Call& call, const std::optional<InArray>& q_descale, const std::optional<InArray>& k_descale,
                      const std::optional<InArray>& v_descale, int64_t batch, int64_t kv_heads) {
  const std::pair<const char*, const std::optional<InArray>*> named[] = {
      {"q_descale", &q_descale}, {"k_descale", &k_descale}, {"v_descale", &v_descale}};
  const Arg* added[3] = {nullptr, nullptr, nullptr};
  for (int i = 0; i < 3; ++i) {
    const std::optional<InArray>& array = *named[i].second;
    if (!array) continue;
    added[i] = &call.add(Arg(named[i].first, *array, false, Holds::vector));
    expect_lse(*added[i], array->dtype(), {batch, kv_heads}, "batch, kv_heads");
  }
  return {added[0], added[1], added[2]};
}

// After staging.
void set_descales(selfattn::AttentionOptions& options, const Descales& descales) {
  const auto pointer = [](const Arg* a) { return a ? static_cast<const float*>(a->data) : nullptr; };
  options.q_descale = pointer(descales.q);
  options.k_descale = pointer(descales.k);
  options.v_descale = pointer(descales.v);
}

}  // namespace

void attention(BoundContext& context, InArray q, InArray k, InArray v, OutArray out, std::optional<std::string> causal,
               std::optional<float> scale, std::string path, std::optional<InArray> key_lengths,
               std::optional<OutArray> lse, const MaskArgs& masks, bool bf16_as_uint16, float dropout_p,
               uint64_t dropout_seed, uint64_t dropout_offset, std::optional<std::string> fp8,
               std::optional<InArray> q_descale, std::optional<InArray> k_descale, std::optional<InArray> v_descale) {
  selfattn::AttentionOptions options = make_options(causal, scale, path, masks);
  set_dropout_options(options, dropout_p, dropout_seed, dropout_offset);
  Call call(context);
  const AttentionArgs a = add_attention_args(call, q, k, v, out, bf16_as_uint16, parse_fp8(fp8));
  const Arg* alengths = key_lengths ? &call.add(Arg("key_lengths", *key_lengths, false, Holds::vector)) : nullptr;
  const Arg* alse = lse ? &call.add(Arg("lse", *lse, true, Holds::vector)) : nullptr;
  const selfattn::TensorView q_shape = tensor_view(a.q);
  const Descales descales =
      add_descales(call, q_descale, k_descale, v_descale, q_shape.batch(), tensor_view(a.k).heads());
  const ModArgs mods = add_mod_args(call, masks, q_shape.batch(),
                                    q_shape.heads(), bf16_as_uint16);
  if (alengths) expect_int32_vector(*alengths, key_lengths->dtype(), q_shape.batch(), "batch");
  if (alse) expect_lse(*alse, lse->dtype(), {q_shape.batch(), q_shape.heads(), q_shape.seq()}, "batch, heads, seq_q");
  run_call(context, call, [&] {
    options.key_lengths = alengths ? static_cast<const int32_t*>(alengths->data) : nullptr;
    options.lse = alse ? static_cast<float*>(alse->data) : nullptr;
    set_mod_options(options, mods);
    set_descales(options, descales);
    selfattn::attention(call.ctx(), tensor_view(a.q), tensor_view(a.k), tensor_view(a.v), tensor_view(a.out), options);
  });
}

void attention_varlen(BoundContext& context, InArray q, InArray k, InArray v, OutArray out, InArray cu_seqlens_q,
                      InArray cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, std::optional<std::string> causal,
                      std::optional<float> scale, std::string path, std::optional<InArray> key_lengths,
                      std::optional<OutArray> lse, const MaskArgs& masks, bool bf16_as_uint16,
                      float dropout_p, uint64_t dropout_seed, uint64_t dropout_offset, std::optional<std::string> fp8,
                      std::optional<InArray> q_descale, std::optional<InArray> k_descale,
                      std::optional<InArray> v_descale) {
  selfattn::AttentionOptions options = make_options(causal, scale, path, masks);
  set_dropout_options(options, dropout_p, dropout_seed, dropout_offset);
  Call call(context);
  const AttentionArgs a = add_attention_args(call, q, k, v, out, bf16_as_uint16, parse_fp8(fp8));
  const CuSeqlens cu = add_cu_seqlens(call, cu_seqlens_q, cu_seqlens_k);
  // A row of descales per sequence.
  const Descales descales = add_descales(call, q_descale, k_descale, v_descale, cu.batch, tensor_view(a.k).heads());
  const Arg* alse = lse ? &call.add(Arg("lse", *lse, true, Holds::vector)) : nullptr;
  const selfattn::TensorView q_shape = tensor_view(a.q);
  if (alse) expect_lse(*alse, lse->dtype(), {q_shape.heads(), q_shape.seq()}, "heads, total_q");
  const ModArgs mods =
      add_mod_args(call, masks, cu.batch, q_shape.heads(), bf16_as_uint16);
  const Arg* alengths = key_lengths ? &call.add(Arg("key_lengths", *key_lengths, false, Holds::vector)) : nullptr;
  if (alengths) expect_int32_vector(*alengths, key_lengths->dtype(), cu.batch, "batch");
  run_call(context, call, [&] {
    options.key_lengths = alengths ? static_cast<const int32_t*>(alengths->data) : nullptr;
    options.lse = alse ? static_cast<float*>(alse->data) : nullptr;
    set_mod_options(options, mods);
    set_descales(options, descales);
    selfattn::attention_varlen(call.ctx(), tensor_view(a.q), tensor_view(a.k), tensor_view(a.v), tensor_view(a.out),
                               static_cast<const int32_t*>(cu.q.data), static_cast<const int32_t*>(cu.k.data),
                               int(cu.batch), max_seqlen_q, max_seqlen_k, options);
  });
}

void attention_probabilities(BoundContext& context, InArray q, InArray k, InArray v, OutArray probs,
                             std::optional<InArray> cu_seqlens_q, std::optional<InArray> cu_seqlens_k,
                             int max_seqlen_q, int max_seqlen_k, std::optional<std::string> causal,
                             std::optional<float> scale, std::string path, std::optional<InArray> key_lengths,
                             const MaskArgs& masks, bool bf16_as_uint16, float dropout_p,
                             uint64_t dropout_seed, uint64_t dropout_offset) {
  selfattn::AttentionOptions options = make_options(causal, scale, path, masks);
  set_dropout_options(options, dropout_p, dropout_seed, dropout_offset);
  const Holds data = data_kind(bf16_as_uint16);
  Call call(context);
  const Arg& aq = call.add(Arg("q", q, false, data));
  const Arg& ak = call.add(Arg("k", k, false, data));
  const Arg& av = call.add(Arg("v", v, false, data));
  const Arg& aprobs = call.add(Arg("probs", probs, true, Holds::data));
  const bool varlen = cu_seqlens_q.has_value();
  std::optional<CuSeqlens> cu;
  if (varlen) cu.emplace(add_cu_seqlens(call, *cu_seqlens_q, *cu_seqlens_k));
  const selfattn::TensorView q_shape = tensor_view(aq);
  const int64_t batch = varlen ? cu->batch : q_shape.batch();
  const ModArgs mods = add_mod_args(call, masks, batch, q_shape.heads(),
                                    bf16_as_uint16);
  const Arg* alengths = key_lengths ? &call.add(Arg("key_lengths", *key_lengths, false, Holds::vector)) : nullptr;
  if (alengths) expect_int32_vector(*alengths, key_lengths->dtype(), batch, "batch");
  run_call(context, call, [&] {
    options.key_lengths = alengths ? static_cast<const int32_t*>(alengths->data) : nullptr;
    set_mod_options(options, mods);
    if (varlen) {
      selfattn::attention_probabilities_varlen(call.ctx(), tensor_view(aq), tensor_view(ak), tensor_view(av),
                                               tensor_view(aprobs), static_cast<const int32_t*>(cu->q.data),
                                               static_cast<const int32_t*>(cu->k.data), int(cu->batch), max_seqlen_q,
                                               max_seqlen_k, options);
    } else {
      selfattn::attention_probabilities(call.ctx(), tensor_view(aq), tensor_view(ak), tensor_view(av),
                                        tensor_view(aprobs), options);
    }
  });
}

void self_attention(BoundContext& context, InArray x, InArray wq, InArray wk, InArray wv, int heads, OutArray out,
                    std::optional<InArray> wo, std::optional<std::string> causal, std::optional<float> scale,
                    std::string path, std::optional<InArray> key_lengths, const MaskArgs& masks,
                    bool bf16_as_uint16) {
  selfattn::AttentionOptions options = make_options(causal, scale, path, masks);
  const Holds data = data_kind(bf16_as_uint16);
  Call call(context);
  const Arg& ax = call.add(Arg("x", x, false, data));
  const Arg& aq = call.add(Arg("wq", wq, false, data));
  const Arg& ak = call.add(Arg("wk", wk, false, data));
  const Arg& av = call.add(Arg("wv", wv, false, data));
  const Arg& aout = call.add(Arg("out", out, true, data));
  const Arg* awo = wo ? &call.add(Arg("wo", *wo, false, data)) : nullptr;
  const Arg* alengths = key_lengths ? &call.add(Arg("key_lengths", *key_lengths, false, Holds::vector)) : nullptr;
  if (alengths) expect_int32_vector(*alengths, key_lengths->dtype(), tensor_view(ax).batch(), "batch");
  const ModArgs mods = add_mod_args(call, masks, tensor_view(ax).batch(),
                                    heads, bf16_as_uint16);
  run_call(context, call, [&] {
    options.key_lengths = alengths ? static_cast<const int32_t*>(alengths->data) : nullptr;
    set_mod_options(options, mods);
    const selfattn::MatrixView wo_view = awo ? matrix_view(*awo) : selfattn::MatrixView{};
    selfattn::self_attention(call.ctx(), tensor_view(ax), matrix_view(aq), matrix_view(ak), matrix_view(av), heads,
                             tensor_view(aout), options, awo ? &wo_view : nullptr);
  });
}

}  // namespace selfattn_python
