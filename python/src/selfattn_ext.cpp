// selfattn._selfattn: the nanobind module behind `import selfattn`. It only translates: DLPack
// arrays become TensorViews, Python keywords become AttentionOptions, C++ exceptions become Python
// ones. This file holds the module's definition: its exception types, Context, and the binding of
// each entry point. The entry points, one per library function, are entry_points.h's, defined by
// family as host/src has them (call_forward.cpp, call_backward.cpp, call_kv_cache.cpp); the
// translation they share (arrays, staging, views, the checks the library cannot make) is call.h's.
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

#include <mutex>
#include <optional>
#include <string>

#include "call.h"
#include "entry_points.h"
#include "selfattn/selfattn.h"

namespace nb = nanobind;

using namespace selfattn_python;

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

  bind_mask_args(m);
  m.def("attention", &attention, nb::arg("context"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"),
        nb::arg("causal").none(), nb::arg("scale").none(), nb::arg("path"), nb::arg("key_lengths").none(),
        nb::arg("lse").none(), nb::arg("masks"), nb::arg("bf16_as_uint16"), nb::arg("dropout_p") = 0.0f,
        nb::arg("dropout_seed") = uint64_t(0), nb::arg("dropout_offset") = uint64_t(0),
        nb::arg("fp8").none() = nb::none(), nb::arg("q_descale").none() = nb::none(),
        nb::arg("k_descale").none() = nb::none(), nb::arg("v_descale").none() = nb::none(),
        "Low level: q, k, v, out as [batch, heads, seq, head_dim] views (FP8 q, k, v as uint8 with fp8 their "
        "format). Use selfattn.attention().");
  m.def("attention_varlen", &attention_varlen, nb::arg("context"), nb::arg("q"), nb::arg("k"), nb::arg("v"),
        nb::arg("out"), nb::arg("cu_seqlens_q"), nb::arg("cu_seqlens_k"), nb::arg("max_seqlen_q"),
        nb::arg("max_seqlen_k"), nb::arg("causal").none(), nb::arg("scale").none(), nb::arg("path"),
        nb::arg("key_lengths").none(), nb::arg("lse").none(), nb::arg("masks"), nb::arg("bf16_as_uint16"), nb::arg("dropout_p") = 0.0f,
        nb::arg("dropout_seed") = uint64_t(0), nb::arg("dropout_offset") = uint64_t(0),
        nb::arg("fp8").none() = nb::none(), nb::arg("q_descale").none() = nb::none(),
        nb::arg("k_descale").none() = nb::none(), nb::arg("v_descale").none() = nb::none(),
        "Low level: q, out as [1, heads, total_q, head_dim] views (FP8 q, k, v as uint8 with fp8 their format; "
        "descales [batch, kv_heads], a row per sequence). Use selfattn.attention_varlen().");
  m.def("attention_probabilities", &attention_probabilities, nb::arg("context"), nb::arg("q"), nb::arg("k"),
        nb::arg("v"), nb::arg("probs"), nb::arg("cu_seqlens_q").none(), nb::arg("cu_seqlens_k").none(),
        nb::arg("max_seqlen_q"), nb::arg("max_seqlen_k"), nb::arg("causal").none(), nb::arg("scale").none(),
        nb::arg("path"), nb::arg("key_lengths").none(), nb::arg("masks"), nb::arg("bf16_as_uint16"), nb::arg("dropout_p"),
        nb::arg("dropout_seed"), nb::arg("dropout_offset"),
        "Low level: q, k, v as [batch, heads, seq, head_dim] views (varlen with cu_seqlens: [1, heads, total, "
        "head_dim]), probs fp32 [batch, heads, seq_q, seq_k]. Use selfattn.attention_probabilities().");
  m.def(
      "dropout_keep_mask",
      [](double dropout_p, uint64_t seed, uint64_t offset, int batch, int heads, int seq_q, int seq_k,
         int first_batch) {
        const std::vector<uint8_t> keep =
            selfattn::reference::dropout_keep_mask(dropout_p, seed, offset, batch, heads, seq_q, seq_k, first_batch);
        return nb::bytes(reinterpret_cast<const char*>(keep.data()), keep.size());
      },
      nb::arg("dropout_p"), nb::arg("seed"), nb::arg("offset"), nb::arg("batch"), nb::arg("heads"), nb::arg("seq_q"),
      nb::arg("seq_k"), nb::arg("first_batch"),
      "Low level: the keep flags (1 kept) as bytes [batch, heads, seq_q, seq_k]. Use selfattn.dropout_keep_mask().");
  m.def("attention_backward", &attention_backward, nb::arg("context"), nb::arg("q"), nb::arg("k"), nb::arg("v"),
        nb::arg("out"), nb::arg("dout"), nb::arg("lse"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"),
        nb::arg("causal").none(), nb::arg("scale").none(), nb::arg("path"), nb::arg("key_lengths").none(),
        nb::arg("masks"),
        nb::arg("deterministic"), nb::arg("dlse").none(), nb::arg("dsinks").none(), nb::arg("bf16_as_uint16"),
        nb::arg("dropout_p") = 0.0f, nb::arg("dropout_seed") = uint64_t(0), nb::arg("dropout_offset") = uint64_t(0),
        "Low level: every array as a [batch, heads, seq, head_dim] view. Use selfattn.attention_backward().");
  m.def("attention_varlen_backward", &attention_varlen_backward, nb::arg("context"), nb::arg("q"), nb::arg("k"),
        nb::arg("v"), nb::arg("out"), nb::arg("dout"), nb::arg("lse"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"),
        nb::arg("cu_seqlens_q"), nb::arg("cu_seqlens_k"), nb::arg("max_seqlen_q"), nb::arg("max_seqlen_k"),
        nb::arg("causal").none(), nb::arg("scale").none(), nb::arg("path"), nb::arg("key_lengths").none(),
        nb::arg("masks"),
        nb::arg("deterministic"), nb::arg("dlse").none(), nb::arg("dsinks").none(), nb::arg("bf16_as_uint16"),
        nb::arg("dropout_p") = 0.0f, nb::arg("dropout_seed") = uint64_t(0), nb::arg("dropout_offset") = uint64_t(0),
        "Low level: q, out, dout, dq as [1, heads, total_q, head_dim] views. Use "
        "selfattn.attention_varlen_backward().");
  m.def("self_attention", &self_attention, nb::arg("context"), nb::arg("x"), nb::arg("wq"), nb::arg("wk"),
        nb::arg("wv"), nb::arg("heads"), nb::arg("out"), nb::arg("wo").none(), nb::arg("causal").none(),
        nb::arg("scale").none(), nb::arg("path"), nb::arg("key_lengths").none(), nb::arg("masks"), nb::arg("bf16_as_uint16"),
        "Low level: x as a [batch, 1, seq, d_model] view. Use selfattn.self_attention().");
  m.def("append_kv", &append_kv, nb::arg("context"), nb::arg("k_cache"), nb::arg("v_cache"), nb::arg("lengths"),
        nb::arg("block_table").none(), nb::arg("batch_index").none(), nb::arg("k_new"), nb::arg("v_new"),
        nb::arg("rotary_cos").none(), nb::arg("rotary_sin").none(), nb::arg("rotary_interleaved"),
        nb::arg("rotary_positions").none(), nb::arg("rotary_position_step"), nb::arg("updated_lengths").none(),
        nb::arg("validate_metadata"), nb::arg("cu_seqlens_new").none(), nb::arg("max_seqlen_new"),
        nb::arg("bf16_as_uint16"), nb::arg("fp8").none() = nb::none(), nb::arg("k_scale").none() = nb::none(),
        nb::arg("v_scale").none() = nb::none(), nb::arg("rotary_first_dim") = 0,
        "Low level: every array as a [batch or pages, kv_heads, seq, head_dim] view (packed, with cu_seqlens_new: "
        "k_new, v_new as [1, kv_heads, total_new, head_dim]). Use selfattn.append_kv().");
  m.def("attention_with_kv_cache", &attention_with_kv_cache, nb::arg("context"), nb::arg("q"), nb::arg("k_cache"),
        nb::arg("v_cache"), nb::arg("lengths"), nb::arg("block_table").none(), nb::arg("batch_index").none(),
        nb::arg("out"), nb::arg("causal").none(), nb::arg("scale").none(), nb::arg("path"), nb::arg("lse").none(),
        nb::arg("rotary_cos").none(), nb::arg("rotary_sin").none(), nb::arg("rotary_interleaved"),
        nb::arg("rotary_positions").none(), nb::arg("rotary_position_step"), nb::arg("num_splits"),
        nb::arg("masks"),
        nb::arg("validate_metadata"), nb::arg("cu_seqlens_q").none(), nb::arg("max_seqlen_q"),
        nb::arg("bf16_as_uint16"), nb::arg("fp8").none() = nb::none(), nb::arg("k_scale").none() = nb::none(),
        nb::arg("v_scale").none() = nb::none(), nb::arg("rotary_first_dim") = 0,
        "Low level: q, out and the cache as [batch or pages, heads, seq, head_dim] views (packed, with cu_seqlens_q: "
        "q, out as [1, heads, total_q, head_dim]). Use selfattn.attention_with_kv_cache().");
  m.def("rotary_embedding", &rotary_embedding, nb::arg("context"), nb::arg("x"), nb::arg("out"), nb::arg("rotary_cos"),
        nb::arg("rotary_sin"), nb::arg("rotary_interleaved"), nb::arg("rotary_positions").none(),
        nb::arg("rotary_position_step"), nb::arg("bf16_as_uint16"), nb::arg("rotary_first_dim") = 0,
        "Low level: x, out as [batch, heads, seq, head_dim] views. Use selfattn.rotary_embedding().");
  m.def("merge_states", &merge_states, nb::arg("context"), nb::arg("out_a"), nb::arg("lse_a"), nb::arg("out_b"),
        nb::arg("lse_b"), nb::arg("out"), nb::arg("lse_out").none(), nb::arg("bf16_as_uint16"),
        "Low level: the outs as [batch, heads, seq, head_dim] views. Use selfattn.merge_states().");
  m.def("cu_seqlens_from_lengths", &cu_seqlens_from_lengths, nb::arg("context"), nb::arg("lengths"),
        nb::arg("cu_seqlens"), "Low level. Use selfattn.cu_seqlens_from_lengths().");
}
