// selfattn._selfattn: the nanobind module behind `import selfattn`. It only translates: DLPack
// arrays become TensorViews, Python keywords become AttentionOptions, C++ exceptions become Python
// ones. This file holds one entry point per library function and the module's definition; the
// translation itself (arrays, staging, views, the checks the library cannot make) is call.h's.
//
// Where the arrays live decides how a call runs:
//   host memory (NumPy, kDLCPU)  -> the sim backend: the arrays are copied into guarded sim device
//                                   memory, the call runs, out (and lse) are copied back;
//   CUDA memory (kDLCUDA)        -> the cuda backend, zero-copy, on the context's stream.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <climits>
#include <mutex>
#include <optional>
#include <string>

#include "call.h"
#include "selfattn/selfattn.h"

namespace nb = nanobind;

namespace {

using namespace selfattn_python;

void attention(BoundContext& context, InArray q, InArray k, InArray v, OutArray out, std::optional<std::string> causal,
               std::optional<float> scale, std::string path, std::optional<InArray> key_lengths,
               std::optional<OutArray> lse, int window_left, int window_right, std::optional<float> softcap,
               std::optional<InArray> alibi_slopes, std::optional<InArray> bias, std::optional<InArray> sinks,
               bool bf16_as_uint16) {
  selfattn::AttentionOptions options = make_options(causal, scale, path, window_left, window_right, softcap);
  Call call(context);
  const AttentionArgs a = add_attention_args(call, q, k, v, out, bf16_as_uint16);
  const Arg* alengths = key_lengths ? &call.add(Arg("key_lengths", *key_lengths, false, Holds::vector)) : nullptr;
  const Arg* alse = lse ? &call.add(Arg("lse", *lse, true, Holds::vector)) : nullptr;
  const selfattn::TensorView q_shape = tensor_view(a.q);
  const ModArgs mods =
      add_mod_args(call, alibi_slopes, bias, sinks, q_shape.batch(), q_shape.heads(), bf16_as_uint16);
  if (alengths) expect_int32_vector(*alengths, key_lengths->dtype(), q_shape.batch(), "batch");
  if (alse) expect_lse(*alse, lse->dtype(), {q_shape.batch(), q_shape.heads(), q_shape.seq()}, "batch, heads, seq_q");
  run_call(context, call, [&] {
    options.key_lengths = alengths ? static_cast<const int32_t*>(alengths->data) : nullptr;
    options.lse = alse ? static_cast<float*>(alse->data) : nullptr;
    set_mod_options(options, mods);
    selfattn::attention(call.ctx(), tensor_view(a.q), tensor_view(a.k), tensor_view(a.v), tensor_view(a.out), options);
  });
}

void attention_varlen(BoundContext& context, InArray q, InArray k, InArray v, OutArray out, InArray cu_seqlens_q,
                      InArray cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, std::optional<std::string> causal,
                      std::optional<float> scale, std::string path, std::optional<OutArray> lse, int window_left,
                      int window_right, std::optional<float> softcap, std::optional<InArray> alibi_slopes,
                      std::optional<InArray> bias, std::optional<InArray> sinks, bool bf16_as_uint16) {
  selfattn::AttentionOptions options = make_options(causal, scale, path, window_left, window_right, softcap);
  Call call(context);
  const AttentionArgs a = add_attention_args(call, q, k, v, out, bf16_as_uint16);
  const CuSeqlens cu = add_cu_seqlens(call, cu_seqlens_q, cu_seqlens_k);
  const Arg* alse = lse ? &call.add(Arg("lse", *lse, true, Holds::vector)) : nullptr;
  const selfattn::TensorView q_shape = tensor_view(a.q);
  if (alse) expect_lse(*alse, lse->dtype(), {q_shape.heads(), q_shape.seq()}, "heads, total_q");
  const ModArgs mods = add_mod_args(call, alibi_slopes, bias, sinks, cu.batch, q_shape.heads(), bf16_as_uint16);
  run_call(context, call, [&] {
    options.lse = alse ? static_cast<float*>(alse->data) : nullptr;
    set_mod_options(options, mods);
    selfattn::attention_varlen(call.ctx(), tensor_view(a.q), tensor_view(a.k), tensor_view(a.v), tensor_view(a.out),
                               static_cast<const int32_t*>(cu.q.data), static_cast<const int32_t*>(cu.k.data),
                               int(cu.batch), max_seqlen_q, max_seqlen_k, options);
  });
}

// The backward (arrays as add_backward_args takes them).
void attention_backward(BoundContext& context, InArray q, InArray k, InArray v, InArray out, InArray dout, InArray lse,
                        OutArray dq, OutArray dk, OutArray dv, std::optional<std::string> causal,
                        std::optional<float> scale, std::string path, std::optional<InArray> key_lengths,
                        int window_left, int window_right, std::optional<float> softcap,
                        std::optional<InArray> alibi_slopes, std::optional<InArray> bias,
                        std::optional<InArray> sinks, bool deterministic, std::optional<InArray> dlse,
                        std::optional<OutArray> dsinks, bool bf16_as_uint16) {
  selfattn::AttentionOptions options = make_options(causal, scale, path, window_left, window_right, softcap);
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
  const ModArgs mods =
      add_mod_args(call, alibi_slopes, bias, sinks, q_shape.batch(), q_shape.heads(), bf16_as_uint16);
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
                               int window_left, int window_right, std::optional<float> softcap,
                               std::optional<InArray> alibi_slopes, std::optional<InArray> bias,
                               std::optional<InArray> sinks, bool deterministic, std::optional<InArray> dlse,
                               std::optional<OutArray> dsinks, bool bf16_as_uint16) {
  selfattn::AttentionOptions options = make_options(causal, scale, path, window_left, window_right, softcap);
  selfattn::BackwardOptions backward;
  backward.deterministic = deterministic;
  Call call(context);
  const BackwardArgs a = add_backward_args(call, q, k, v, out, dout, lse, dq, dk, dv, bf16_as_uint16);
  const CuSeqlens cu = add_cu_seqlens(call, cu_seqlens_q, cu_seqlens_k);
  const selfattn::TensorView q_shape = tensor_view(a.q);
  const std::vector<int64_t> lse_shape = {q_shape.heads(), q_shape.seq()};
  expect_lse(a.lse, lse.dtype(), lse_shape, "heads, total_q");
  const BackwardExtras extras = add_backward_extras(call, dlse, dsinks, lse_shape, q_shape.heads());
  const ModArgs mods = add_mod_args(call, alibi_slopes, bias, sinks, cu.batch, q_shape.heads(), bf16_as_uint16);
  run_call(context, call, [&] {
    set_backward_options(backward, extras);
    set_mod_options(options, mods);
    selfattn::attention_varlen_backward(call.ctx(), tensor_view(a.q), tensor_view(a.k), tensor_view(a.v),
                                        tensor_view(a.out), tensor_view(a.dout),
                                        static_cast<const float*>(a.lse.data), tensor_view(a.dq), tensor_view(a.dk),
                                        tensor_view(a.dv), static_cast<const int32_t*>(cu.q.data),
                                        static_cast<const int32_t*>(cu.k.data), int(cu.batch), max_seqlen_q,
                                        max_seqlen_k, options, backward);
  });
}

void self_attention(BoundContext& context, InArray x, InArray wq, InArray wk, InArray wv, int heads, OutArray out,
                    std::optional<InArray> wo, std::optional<std::string> causal, std::optional<float> scale,
                    std::string path, std::optional<InArray> key_lengths, int window_left, int window_right,
                    std::optional<float> softcap, std::optional<InArray> alibi_slopes, std::optional<InArray> bias,
                    std::optional<InArray> sinks, bool bf16_as_uint16) {
  selfattn::AttentionOptions options = make_options(causal, scale, path, window_left, window_right, softcap);
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
  const ModArgs mods = add_mod_args(call, alibi_slopes, bias, sinks, tensor_view(ax).batch(), heads, bf16_as_uint16);
  run_call(context, call, [&] {
    options.key_lengths = alengths ? static_cast<const int32_t*>(alengths->data) : nullptr;
    set_mod_options(options, mods);
    const selfattn::MatrixView wo_view = awo ? matrix_view(*awo) : selfattn::MatrixView{};
    selfattn::self_attention(call.ctx(), tensor_view(ax), matrix_view(aq), matrix_view(ak), matrix_view(av), heads,
                             tensor_view(aout), options, awo ? &wo_view : nullptr);
  });
}

// The KV cache (selfattn/kv_cache.h). k_cache and v_cache are the cache or the page pool as
// [batch or num_pages, kv_heads, capacity or page_size, head_dim] views; append_kv writes them.
void append_kv(BoundContext& context, OutArray k_cache, OutArray v_cache, InArray lengths,
               std::optional<InArray> block_table, InArray k_new, InArray v_new, std::optional<InArray> rotary_cos,
               std::optional<InArray> rotary_sin, bool rotary_interleaved, std::optional<OutArray> updated_lengths,
               bool validate_metadata, bool bf16_as_uint16) {
  const Holds data = data_kind(bf16_as_uint16);
  Call call(context);
  const KvCacheArgs cache = add_kv_cache(call, call.add(Arg("k_cache", k_cache, true, data)),
                                         call.add(Arg("v_cache", v_cache, true, data)), lengths, block_table);
  const Arg& ak = call.add(Arg("k_new", k_new, false, data));
  const Arg& av = call.add(Arg("v_new", v_new, false, data));
  const RotaryArgs tables = add_rotary(call, rotary_cos, rotary_sin, rotary_interleaved);
  const Arg* aupdated =
      updated_lengths ? &call.add(Arg("updated_lengths", *updated_lengths, true, Holds::vector)) : nullptr;
  if (aupdated) expect_int32_vector(*aupdated, updated_lengths->dtype(), cache.batch, "batch");
  run_call(context, call, [&] {
    selfattn::AppendKvOptions options;
    options.rotary = rotary(tables);
    options.updated_lengths = aupdated ? static_cast<int32_t*>(aupdated->data) : nullptr;
    options.validate_metadata = validate_metadata;
    selfattn::append_kv(call.ctx(), kv_cache(cache), tensor_view(ak), tensor_view(av), options);
  });
}

void attention_with_kv_cache(BoundContext& context, InArray q, InArray k_cache, InArray v_cache, InArray lengths,
                             std::optional<InArray> block_table, OutArray out, std::optional<std::string> causal,
                             std::optional<float> scale, std::string path, std::optional<OutArray> lse,
                             std::optional<InArray> rotary_cos, std::optional<InArray> rotary_sin,
                             bool rotary_interleaved, int num_splits, int window_left, int window_right,
                             std::optional<float> softcap, std::optional<InArray> alibi_slopes,
                             std::optional<InArray> bias, std::optional<InArray> sinks, bool validate_metadata,
                             bool bf16_as_uint16) {
  // The attention options parsed as attention()'s, then carried over with the cache's own.
  selfattn::AttentionOptions parsed = make_options(causal, scale, path, window_left, window_right, softcap);
  const Holds data = data_kind(bf16_as_uint16);
  Call call(context);
  const Arg& aq = call.add(Arg("q", q, false, data));
  const KvCacheArgs cache = add_kv_cache(call, call.add(Arg("k_cache", k_cache, false, data)),
                                         call.add(Arg("v_cache", v_cache, false, data)), lengths, block_table);
  const Arg& aout = call.add(Arg("out", out, true, data));
  const RotaryArgs tables = add_rotary(call, rotary_cos, rotary_sin, rotary_interleaved);
  const Arg* alse = lse ? &call.add(Arg("lse", *lse, true, Holds::vector)) : nullptr;
  const selfattn::TensorView q_shape = tensor_view(aq);
  if (alse) expect_lse(*alse, lse->dtype(), {q_shape.batch(), q_shape.heads(), q_shape.seq()}, "batch, heads, seq_q");
  const ModArgs mods =
      add_mod_args(call, alibi_slopes, bias, sinks, q_shape.batch(), q_shape.heads(), bf16_as_uint16);
  run_call(context, call, [&] {
    set_mod_options(parsed, mods);
    selfattn::KvAttentionOptions options;
    options.path = parsed.path;
    options.causal = parsed.causal;
    options.scale = parsed.scale;
    options.lse = alse ? static_cast<float*>(alse->data) : nullptr;
    options.rotary = rotary(tables);
    options.num_splits = num_splits;
    options.validate_metadata = validate_metadata;
    options.window_left = parsed.window_left;
    options.window_right = parsed.window_right;
    options.softcap = parsed.softcap;
    options.alibi_slopes = parsed.alibi_slopes;
    options.alibi_slopes_count = parsed.alibi_slopes_count;
    options.bias = parsed.bias;
    options.sinks = parsed.sinks;
    selfattn::attention_with_kv_cache(call.ctx(), tensor_view(aq), kv_cache(cache), tensor_view(aout), options);
  });
}

// lse_a, lse_b and lse_out: fp32 [batch, heads, seq] contiguous, as the library reads them.
void merge_states(BoundContext& context, InArray out_a, InArray lse_a, InArray out_b, InArray lse_b, OutArray out,
                  std::optional<OutArray> lse_out, bool bf16_as_uint16) {
  const Holds data = data_kind(bf16_as_uint16);
  Call call(context);
  const Arg& aa = call.add(Arg("out_a", out_a, false, data));
  const Arg& alse_a = call.add(Arg("lse_a", lse_a, false, Holds::vector));
  const Arg& ab = call.add(Arg("out_b", out_b, false, data));
  const Arg& alse_b = call.add(Arg("lse_b", lse_b, false, Holds::vector));
  const Arg& aout = call.add(Arg("out", out, true, data));
  const Arg* alse_out = lse_out ? &call.add(Arg("lse_out", *lse_out, true, Holds::vector)) : nullptr;
  const selfattn::TensorView shape = tensor_view(aa);
  const std::vector<int64_t> rows = {shape.batch(), shape.heads(), shape.seq()};
  expect_lse(alse_a, lse_a.dtype(), rows, "batch, heads, seq of out_a");
  expect_lse(alse_b, lse_b.dtype(), rows, "batch, heads, seq of out_a");
  if (alse_out) expect_lse(*alse_out, lse_out->dtype(), rows, "batch, heads, seq of out_a");
  run_call(context, call, [&] {
    selfattn::merge_states(call.ctx(), tensor_view(aa), static_cast<const float*>(alse_a.data), tensor_view(ab),
                           static_cast<const float*>(alse_b.data), tensor_view(aout),
                           alse_out ? static_cast<float*>(alse_out->data) : nullptr);
  });
}

void cu_seqlens_from_lengths(BoundContext& context, InArray lengths, OutArray cu_seqlens) {
  Call call(context);
  const Arg& alengths = call.add(Arg("lengths", lengths, false, Holds::vector));
  const Arg& acu = call.add(Arg("cu_seqlens", cu_seqlens, true, Holds::vector));
  if (alengths.ndim != 1) invalid("lengths expected a 1-D array, got " + shape_text(alengths));
  if (alengths.shape[0] > INT32_MAX - 1) invalid("lengths expected at most 2^31 - 2 entries");
  expect_int32_vector(alengths, lengths.dtype(), alengths.shape[0], "batch");
  expect_int32_vector(acu, cu_seqlens.dtype(), alengths.shape[0] + 1, "batch + 1");
  run_call(context, call, [&] {
    selfattn::cu_seqlens_from_lengths(call.ctx(), static_cast<const int32_t*>(alengths.data),
                                      int(alengths.shape[0]), static_cast<int32_t*>(acu.data));
  });
}

}  // namespace

NB_MODULE(_selfattn, m) {
  m.doc() = "selfattn's compiled core. Use the `selfattn` package, which wraps these functions.";

  // Python exception types that are both selfattn.Error and the matching built-in, carrying the
  // library's message. Registered base first: nanobind tries the latest translator first.
  nb::exception<selfattn::Error> error(m, "Error", PyExc_Exception);
  nb::exception<selfattn::InvalidArgument>(m, "InvalidArgument", nb::make_tuple(error, nb::handle(PyExc_ValueError)));
  nb::exception<selfattn::NotAvailable>(m, "NotAvailable",
                                        nb::make_tuple(error, nb::handle(PyExc_NotImplementedError)));
  nb::exception<selfattn::WorkspaceTooSmall>(m, "WorkspaceTooSmall",
                                             nb::make_tuple(error, nb::handle(PyExc_MemoryError)));
  nb::exception<selfattn::BackendError>(m, "BackendError", nb::make_tuple(error, nb::handle(PyExc_RuntimeError)));

  m.attr("__version__") = SELFATTN_VERSION_STRING;

  nb::class_<BoundContext>(m, "Context",
                        "A backend (\"sim\" or \"cuda\"), its stream and its reusable workspace. Host arrays run on a "
                        "sim context, CUDA arrays on a cuda context of their device.")
      .def(
          "__init__",
          [](BoundContext* self, const std::string& backend, int device, uintptr_t stream, size_t workspace_limit,
             std::optional<bool> hopper_kernels) {
            new (self) BoundContext(parse_backend(backend), device, stream, workspace_limit, hopper_kernels);
          },
          nb::arg("backend"), nb::arg("device") = 0, nb::arg("stream") = 0, nb::arg("workspace_limit") = size_t(1) << 30,
          nb::arg("hopper_kernels") = nb::none(),
          "backend: \"sim\" or \"cuda\" (NotAvailable without a usable GPU). device: the CUDA ordinal. stream: a "
          "cudaStream_t as an integer to run on (0: the legacy default stream). workspace_limit: bytes the "
          "workspace may hold. hopper_kernels: False pins the fused forward to the mma.sync kernel on a Hopper "
          "GPU (and the sim); None follows SELFATTN_HOPPER_KERNELS (default on).")
      .def_prop_ro("backend", [](const BoundContext& c) { return std::string(selfattn::to_string(c.backend)); })
      .def_ro("device", &BoundContext::device)
      .def_ro("stream", &BoundContext::stream)
      .def_prop_ro("device_name", [](const BoundContext& c) { return c.ctx.device_name(); })
      .def_prop_ro("uses_hopper_kernels", [](const BoundContext& c) { return c.ctx.uses_hopper_kernels(); },
                   "Whether the fused forward runs the Hopper (wgmma + TMA) kernel where it takes a call.")
      .def_prop_rw(
          "workspace_limit", [](const BoundContext& c) { return c.ctx.workspace_limit(); },
          [](BoundContext& c, size_t bytes) { c.ctx.set_workspace_limit(bytes); })
      .def_prop_ro("workspace_bytes", [](const BoundContext& c) { return c.ctx.workspace_bytes(); })
      .def("synchronize", [](BoundContext& c) {
        nb::gil_scoped_release unlocked;
        std::lock_guard<std::mutex> serial(c.mutex);
        c.ctx.synchronize();
      }, "Waits for all work queued on the context's stream.")
      .def(
          "path_available",
          [](const BoundContext& c, const std::string& path) { return selfattn::path_available(c.ctx, parse_path(path)); },
          nb::arg("path"), "Whether this build and backend provide the path at all.")
      .def("__repr__", [](const BoundContext& c) {
        return "selfattn.Context(backend='" + std::string(selfattn::to_string(c.backend)) + "', device_name='" +
               c.ctx.device_name() + "')";
      });

  m.def("attention", &attention, nb::arg("context"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"),
        nb::arg("causal").none(), nb::arg("scale").none(), nb::arg("path"), nb::arg("key_lengths").none(),
        nb::arg("lse").none(), nb::arg("window_left"), nb::arg("window_right"), nb::arg("softcap").none(),
        nb::arg("alibi_slopes").none(), nb::arg("bias").none(), nb::arg("sinks").none(), nb::arg("bf16_as_uint16"),
        "Low level: q, k, v, out as [batch, heads, seq, head_dim] views. Use selfattn.attention().");
  m.def("attention_varlen", &attention_varlen, nb::arg("context"), nb::arg("q"), nb::arg("k"), nb::arg("v"),
        nb::arg("out"), nb::arg("cu_seqlens_q"), nb::arg("cu_seqlens_k"), nb::arg("max_seqlen_q"),
        nb::arg("max_seqlen_k"), nb::arg("causal").none(), nb::arg("scale").none(), nb::arg("path"),
        nb::arg("lse").none(), nb::arg("window_left"), nb::arg("window_right"), nb::arg("softcap").none(),
        nb::arg("alibi_slopes").none(), nb::arg("bias").none(), nb::arg("sinks").none(), nb::arg("bf16_as_uint16"),
        "Low level: q, out as [1, heads, total_q, head_dim] views. Use selfattn.attention_varlen().");
  m.def("attention_backward", &attention_backward, nb::arg("context"), nb::arg("q"), nb::arg("k"), nb::arg("v"),
        nb::arg("out"), nb::arg("dout"), nb::arg("lse"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"),
        nb::arg("causal").none(), nb::arg("scale").none(), nb::arg("path"), nb::arg("key_lengths").none(),
        nb::arg("window_left"), nb::arg("window_right"), nb::arg("softcap").none(),
        nb::arg("alibi_slopes").none(), nb::arg("bias").none(), nb::arg("sinks").none(), nb::arg("deterministic"),
        nb::arg("dlse").none(), nb::arg("dsinks").none(), nb::arg("bf16_as_uint16"),
        "Low level: every array as a [batch, heads, seq, head_dim] view. Use selfattn.attention_backward().");
  m.def("attention_varlen_backward", &attention_varlen_backward, nb::arg("context"), nb::arg("q"), nb::arg("k"),
        nb::arg("v"), nb::arg("out"), nb::arg("dout"), nb::arg("lse"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"),
        nb::arg("cu_seqlens_q"), nb::arg("cu_seqlens_k"), nb::arg("max_seqlen_q"), nb::arg("max_seqlen_k"),
        nb::arg("causal").none(), nb::arg("scale").none(), nb::arg("path"), nb::arg("window_left"),
        nb::arg("window_right"), nb::arg("softcap").none(), nb::arg("alibi_slopes").none(), nb::arg("bias").none(),
        nb::arg("sinks").none(), nb::arg("deterministic"), nb::arg("dlse").none(), nb::arg("dsinks").none(),
        nb::arg("bf16_as_uint16"),
        "Low level: q, out, dout, dq as [1, heads, total_q, head_dim] views. Use "
        "selfattn.attention_varlen_backward().");
  m.def("self_attention", &self_attention, nb::arg("context"), nb::arg("x"), nb::arg("wq"), nb::arg("wk"),
        nb::arg("wv"), nb::arg("heads"), nb::arg("out"), nb::arg("wo").none(), nb::arg("causal").none(),
        nb::arg("scale").none(), nb::arg("path"), nb::arg("key_lengths").none(), nb::arg("window_left"),
        nb::arg("window_right"), nb::arg("softcap").none(), nb::arg("alibi_slopes").none(), nb::arg("bias").none(),
        nb::arg("sinks").none(), nb::arg("bf16_as_uint16"),
        "Low level: x as a [batch, 1, seq, d_model] view. Use selfattn.self_attention().");
  m.def("append_kv", &append_kv, nb::arg("context"), nb::arg("k_cache"), nb::arg("v_cache"), nb::arg("lengths"),
        nb::arg("block_table").none(), nb::arg("k_new"), nb::arg("v_new"), nb::arg("rotary_cos").none(),
        nb::arg("rotary_sin").none(), nb::arg("rotary_interleaved"), nb::arg("updated_lengths").none(),
        nb::arg("validate_metadata"), nb::arg("bf16_as_uint16"),
        "Low level: every array as a [batch or pages, kv_heads, seq, head_dim] view. Use selfattn.append_kv().");
  m.def("attention_with_kv_cache", &attention_with_kv_cache, nb::arg("context"), nb::arg("q"), nb::arg("k_cache"),
        nb::arg("v_cache"), nb::arg("lengths"), nb::arg("block_table").none(), nb::arg("out"),
        nb::arg("causal").none(), nb::arg("scale").none(), nb::arg("path"), nb::arg("lse").none(),
        nb::arg("rotary_cos").none(), nb::arg("rotary_sin").none(), nb::arg("rotary_interleaved"),
        nb::arg("num_splits"), nb::arg("window_left"), nb::arg("window_right"), nb::arg("softcap").none(),
        nb::arg("alibi_slopes").none(), nb::arg("bias").none(), nb::arg("sinks").none(), nb::arg("validate_metadata"),
        nb::arg("bf16_as_uint16"),
        "Low level: q, out and the cache as [batch or pages, heads, seq, head_dim] views. Use "
        "selfattn.attention_with_kv_cache().");
  m.def("merge_states", &merge_states, nb::arg("context"), nb::arg("out_a"), nb::arg("lse_a"), nb::arg("out_b"),
        nb::arg("lse_b"), nb::arg("out"), nb::arg("lse_out").none(), nb::arg("bf16_as_uint16"),
        "Low level: the outs as [batch, heads, seq, head_dim] views. Use selfattn.merge_states().");
  m.def("cu_seqlens_from_lengths", &cu_seqlens_from_lengths, nb::arg("context"), nb::arg("lengths"),
        nb::arg("cu_seqlens"), "Low level. Use selfattn.cu_seqlens_from_lengths().");
}
