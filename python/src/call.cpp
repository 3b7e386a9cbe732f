// The translation layer's definitions that every family of entry points uses (call.h says what
// each does); call_forward.cpp, call_backward.cpp and call_kv_cache.cpp define their own arrays.
#include "call.h"

#include <cstring>
#include <utility>

#include <nanobind/stl/optional.h>

namespace selfattn_python {

selfattn::Backend parse_backend(const std::string& name) {
  if (name == "sim") return selfattn::Backend::sim;
  if (name == "cuda") return selfattn::Backend::cuda;
  invalid("backend expected 'sim' or 'cuda', got '" + name + "'");
}

selfattn::Path parse_path(const std::string& name) {
  if (name == "auto") return selfattn::Path::automatic;
  if (name == "naive") return selfattn::Path::naive;
  if (name == "cublas") return selfattn::Path::cublas;
  if (name == "fused") return selfattn::Path::fused;
  invalid("path expected 'auto', 'naive', 'cublas' or 'fused', got '" + name + "'");
}

selfattn::Causal parse_causal(const std::optional<std::string>& name) {
  if (!name) return selfattn::Causal::none;
  if (*name == "top_left") return selfattn::Causal::top_left;
  if (*name == "bottom_right") return selfattn::Causal::bottom_right;
  invalid("causal expected None, 'top_left' or 'bottom_right', got '" + *name + "'");
}

std::string dtype_name(nb::dlpack::dtype dt) {
  static const char* codes[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
  std::string code = dt.code < 7 ? codes[dt.code] : "code" + std::to_string(dt.code);
  return code + std::to_string(dt.bits) + (dt.lanes != 1 ? "x" + std::to_string(dt.lanes) : "");
}

selfattn::DType dtype_of(const char* name, const nb::dlpack::dtype& dt, bool bf16_as_uint16,
                         std::optional<selfattn::DType> fp8_as_uint8) {
  using code = nb::dlpack::dtype_code;
  const bool is_bias = std::string(name) == "bias";
  if (dt.lanes == 1) {
    if (fp8_as_uint8 && dt.code == uint8_t(code::UInt) && dt.bits == 8) return *fp8_as_uint8;
    if (dt.code == uint8_t(code::Float) && dt.bits == 32) return selfattn::DType::f32;
    if (dt.code == uint8_t(code::Float) && dt.bits == 16) return selfattn::DType::f16;
    if (dt.code == uint8_t(code::Bfloat) && dt.bits == 16) return selfattn::DType::bf16;
    if (bf16_as_uint16 && dt.code == uint8_t(code::UInt) && dt.bits == 16) return selfattn::DType::bf16;
    // Only a bias may be boolean (a mask, read by the kernels as bytes).
    if (is_bias && dt.code == uint8_t(code::Bool) && dt.bits == 8) return selfattn::DType::b8;
  }
  invalid(std::string(name) + ".dtype expected float32, float16" + (is_bias ? ", bfloat16 or bool" : " or bfloat16") +
          ", got " + dtype_name(dt));
}

std::optional<selfattn::DType> parse_fp8(const std::optional<std::string>& name) {
  if (!name) return std::nullopt;
  if (*name == "e4m3") return selfattn::DType::e4m3;
  if (*name == "e5m2") return selfattn::DType::e5m2;
  invalid("fp8 expected None, 'e4m3' or 'e5m2', got '" + *name + "'");
}

void SimStaging::stage(selfattn::Context& ctx, std::vector<Arg*>& args) {
  struct Span {
    uintptr_t begin, end;
  };
  std::vector<Span> spans;
  for (Arg* a : args) {
    if (a->empty()) continue;
    const uintptr_t base = reinterpret_cast<uintptr_t>(a->data);
    spans.push_back({base + uintptr_t(a->lowest()), base + uintptr_t(a->highest())});
  }
  std::sort(spans.begin(), spans.end(), [](const Span& x, const Span& y) { return x.begin < y.begin; });
  for (const Span& s : spans) {
    if (!regions_.empty() && s.begin < regions_.back().host_end) {
      regions_.back().host_end = std::max(regions_.back().host_end, s.end);
    } else {
      regions_.push_back(Region{s.begin, s.end, {}});
    }
  }
  for (Region& r : regions_) {
    const size_t lead = r.host_begin % 256;
    r.buffer = selfattn::DeviceBuffer<unsigned char>(ctx, lead + (r.host_end - r.host_begin), "selfattn python array");
    r.buffer.copy_from_host(reinterpret_cast<const unsigned char*>(r.host_begin), r.host_end - r.host_begin, lead);
  }
  for (Arg* a : args) a->data = a->empty() ? nullptr : to_device(a->data);
}

void SimStaging::copy_back(const Arg& a) const {
  if (a.empty()) return;
  const Region& r = region_of_device(a.data);
  std::vector<unsigned char> staged(r.buffer.size());
  r.buffer.copy_to_host(staged.data(), staged.size());
  const unsigned char* device_base = r.buffer.data();
  const size_t lead = r.host_begin % 256;
  const int64_t first = static_cast<const unsigned char*>(a.data) - device_base - int64_t(lead);
  unsigned char* host_region = reinterpret_cast<unsigned char*>(r.host_begin);
  // Walk the elements in index order (the array has at most four dimensions).
  std::vector<int64_t> shape = a.shape, strides = a.strides;
  while (shape.size() < 4) {
    shape.insert(shape.begin(), 1);
    strides.insert(strides.begin(), 0);
  }
  const int64_t item = int64_t(a.item);
  for (int64_t i0 = 0; i0 < shape[0]; ++i0)
    for (int64_t i1 = 0; i1 < shape[1]; ++i1)
      for (int64_t i2 = 0; i2 < shape[2]; ++i2)
        for (int64_t i3 = 0; i3 < shape[3]; ++i3) {
          const int64_t at = first + (i0 * strides[0] + i1 * strides[1] + i2 * strides[2] + i3 * strides[3]) * item;
          std::memcpy(host_region + at, staged.data() + lead + at, size_t(item));
        }
}

void* SimStaging::to_device(void* host) const {
  const uintptr_t p = reinterpret_cast<uintptr_t>(host);
  for (const Region& r : regions_) {
    if (p >= r.host_begin && p < r.host_end) return r.buffer.data() + (r.host_begin % 256) + (p - r.host_begin);
  }
  invalid("internal: an array's address lies in no staged region");
}

const SimStaging::Region& SimStaging::region_of_device(const void* device) const {
  const unsigned char* p = static_cast<const unsigned char*>(device);
  for (const Region& r : regions_) {
    if (p >= r.buffer.data() && p < r.buffer.data() + r.buffer.size()) return r;
  }
  invalid("internal: an output lies in no staged region");
}

void Call::prepare() {
  const bool sim = context_.backend == selfattn::Backend::sim;
  for (const auto& a : args_) {
    if (a->device_type == kDLCPU && !sim) {
      invalid(std::string(a->name) + " is a host array, but the context runs on cuda: host arrays (NumPy) run on "
              "the sim backend, CUDA tensors on cuda");
    }
    if (a->device_type == kDLCUDA && sim) {
      invalid(std::string(a->name) + " is a CUDA array, but the context runs on the sim: pass a cuda context "
              "(or none)");
    }
    if (a->device_type != kDLCPU && a->device_type != kDLCUDA) {
      throw selfattn::NotAvailable(std::string(a->name) + " lives on DLPack device type " +
                                   std::to_string(a->device_type) +
                                   "; selfattn runs host arrays (1, on the sim) and CUDA arrays (2)");
    }
    if (a->device_type == kDLCUDA && a->device_id != context_.device) {
      invalid(std::string(a->name) + " is on CUDA device " + std::to_string(a->device_id) +
              ", but the context runs on device " + std::to_string(context_.device));
    }
  }
  if (sim) {
    std::vector<Arg*> all;
    for (auto& a : args_) all.push_back(a.get());
    staging_.stage(context_.ctx, all);
  }
}

void Call::finish() {
  if (context_.backend != selfattn::Backend::sim) return;
  context_.ctx.synchronize();
  for (const auto& a : args_) {
    if (a->written) staging_.copy_back(*a);
  }
}

selfattn::TensorView tensor_view(const Arg& a) {
  if (a.ndim != 4) {
    invalid(std::string(a.name) + " expected 4 dimensions [batch, heads, seq, head_dim], got " +
            std::to_string(a.ndim));
  }
  selfattn::TensorView view;
  view.data = a.data;
  view.dtype = a.dtype;
  for (int i = 0; i < 4; ++i) {
    view.shape[i] = a.shape[i];
    view.strides[i] = a.strides[i];
  }
  return view;
}

selfattn::MatrixView matrix_view(const Arg& a) {
  if (a.ndim != 2) invalid(std::string(a.name) + " expected 2 dimensions [rows, cols], got " + std::to_string(a.ndim));
  if (a.shape[1] > 1 && a.strides[1] != 1) {
    invalid(std::string(a.name) + ".strides[1] expected 1 (rows stored contiguously), got " +
            std::to_string(a.strides[1]));
  }
  return selfattn::MatrixView{a.data, a.dtype, a.shape[0], a.shape[1], a.shape[0] > 1 ? a.strides[0] : a.shape[1]};
}

std::string shape_text(const Arg& a) {
  std::string text = "[";
  for (size_t i = 0; i < a.ndim; ++i) text += (i ? ", " : "") + std::to_string(a.shape[i]);
  return text + "]";
}

void expect_int32_vector(const Arg& a, const nb::dlpack::dtype& dt, int64_t count, const std::string& what) {
  if (dt.code != uint8_t(nb::dlpack::dtype_code::Int) || dt.bits != 32 || dt.lanes != 1) {
    invalid(std::string(a.name) + ".dtype expected int32, got " + dtype_name(dt));
  }
  if (a.ndim != 1 || a.shape[0] != count) {
    invalid(std::string(a.name) + " expected shape [" + std::to_string(count) + "] (" + what + "), got " +
            shape_text(a));
  }
  if (count > 1 && a.strides[0] != 1) {
    invalid(std::string(a.name) + ".strides[0] expected 1 (contiguous), got " + std::to_string(a.strides[0]));
  }
}

void expect_contiguous(const Arg& a) {
  int64_t expected_stride = 1;
  // No elements, no layout to check (frameworks give empty arrays arbitrary strides).
  for (size_t i = a.ndim; i-- > 0 && !a.empty();) {
    if (a.shape[i] > 1 && a.strides[i] != expected_stride) {
      invalid(std::string(a.name) + " expected a contiguous array");
    }
    expected_stride *= a.shape[i];
  }
}

void expect_contiguous_float32(const Arg& a, const nb::dlpack::dtype& dt) {
  expect_contiguous(a);
  if (dt.code != uint8_t(nb::dlpack::dtype_code::Float) || dt.bits != 32 || dt.lanes != 1) {
    invalid(std::string(a.name) + ".dtype expected float32, got " + dtype_name(dt));
  }
}

int64_t element_count(const Arg& a) {
  int64_t n = 1;
  for (int64_t extent : a.shape) n *= extent;
  return n;
}

void expect_lse(const Arg& a, const nb::dlpack::dtype& dt, const std::vector<int64_t>& shape, const char* dims) {
  expect_contiguous_float32(a, dt);
  if (a.shape != shape) {
    std::string want = "[";
    for (size_t i = 0; i < shape.size(); ++i) want += (i ? ", " : "") + std::to_string(shape[i]);
    invalid(std::string(a.name) + " expected shape " + want + "] (" + dims + "), got " + shape_text(a));
  }
}

void bind_mask_args(nb::module_& m) {
  nb::class_<MaskArgs>(m, "MaskArgs", "Low level: the masks and score modifiers of one call. Use the keywords.")
      .def(
          "__init__",
          [](MaskArgs* self, int window_left, int window_right, std::optional<float> softcap,
             std::optional<InArray> alibi_slopes, std::optional<InArray> bias, std::optional<InArray> sinks,
             std::optional<InArray> key_start, std::optional<InArray> q_offset) {
            new (self) MaskArgs{window_left, window_right, softcap, std::move(alibi_slopes), std::move(bias),
                                std::move(sinks), std::move(key_start), std::move(q_offset)};
          },
          nb::arg("window_left"), nb::arg("window_right"), nb::arg("softcap").none(), nb::arg("alibi_slopes").none(),
          nb::arg("bias").none(), nb::arg("sinks").none(), nb::arg("key_start").none(), nb::arg("q_offset").none());
}

selfattn::AttentionOptions make_options(const std::optional<std::string>& causal, std::optional<float> scale,
                                        const std::string& path, const MaskArgs& masks) {
  selfattn::AttentionOptions options;
  options.causal = parse_causal(causal);
  options.scale = scale;
  options.path = parse_path(path);
  options.window_left = masks.window_left;
  options.window_right = masks.window_right;
  options.softcap = masks.softcap;
  return options;
}

void set_dropout_options(selfattn::AttentionOptions& options, float dropout_p, uint64_t dropout_seed,
                         uint64_t dropout_offset) {
  options.dropout_p = dropout_p;
  options.dropout_seed = dropout_seed;
  options.dropout_offset = dropout_offset;
}

Holds data_kind(bool bf16_as_uint16) { return bf16_as_uint16 ? Holds::data_bf16_as_uint16 : Holds::data; }

CuSeqlens add_cu_seqlens(Call& call, const InArray& cu_seqlens_q, const InArray& cu_seqlens_k) {
  const Arg& acq = call.add(Arg("cu_seqlens_q", cu_seqlens_q, false, Holds::vector));
  const Arg& ack = call.add(Arg("cu_seqlens_k", cu_seqlens_k, false, Holds::vector));
  if (acq.ndim != 1 || acq.shape[0] < 1) invalid("cu_seqlens_q expected a 1-D array of batch + 1 >= 1 entries");
  const int64_t batch = acq.shape[0] - 1;
  expect_int32_vector(acq, cu_seqlens_q.dtype(), batch + 1, "batch + 1");
  expect_int32_vector(ack, cu_seqlens_k.dtype(), batch + 1, "batch + 1, as cu_seqlens_q");
  return {acq, ack, batch};
}

ModArgs add_mod_args(Call& call, const MaskArgs& masks, int64_t batch, int64_t heads, bool bf16_as_uint16) {
  const std::optional<InArray>& alibi_slopes = masks.alibi_slopes;
  const std::optional<InArray>& bias = masks.bias;
  const std::optional<InArray>& sinks = masks.sinks;
  const std::optional<InArray>& key_start = masks.key_start;
  const std::optional<InArray>& q_offset = masks.q_offset;
  const Arg* alibi = alibi_slopes ? &call.add(Arg("alibi_slopes", *alibi_slopes, false, Holds::vector)) : nullptr;
  if (alibi) {
    expect_contiguous_float32(*alibi, alibi_slopes->dtype());
    const bool per_head = alibi->ndim == 1 && alibi->shape[0] == heads;
    const bool per_batch_and_head = alibi->ndim == 2 && alibi->shape[0] == batch && alibi->shape[1] == heads;
    if (!per_head && !per_batch_and_head) {
      invalid("alibi_slopes expected shape [" + std::to_string(heads) + "] (heads) or [" + std::to_string(batch) +
              ", " + std::to_string(heads) + "] (batch, heads), got " + shape_text(*alibi));
    }
  }
  const Arg* abias = bias ? &call.add(Arg("bias", *bias, false, data_kind(bf16_as_uint16))) : nullptr;
  const Arg* asinks = sinks ? &call.add(Arg("sinks", *sinks, false, Holds::vector)) : nullptr;
  if (asinks) expect_lse(*asinks, sinks->dtype(), {heads}, "heads");
  const Arg* astart = key_start ? &call.add(Arg("key_start", *key_start, false, Holds::vector)) : nullptr;
  if (astart) expect_int32_vector(*astart, key_start->dtype(), batch, "batch");
  const Arg* aoffset = q_offset ? &call.add(Arg("q_offset", *q_offset, false, Holds::vector)) : nullptr;
  if (aoffset) expect_int32_vector(*aoffset, q_offset->dtype(), batch, "batch");
  return {alibi, abias, asinks, astart, aoffset};
}

void set_mod_options(selfattn::MaskOptions& options, const ModArgs& mods) {
  if (mods.alibi_slopes) {
    options.alibi_slopes = static_cast<const float*>(mods.alibi_slopes->data);
    options.alibi_slopes_count = element_count(*mods.alibi_slopes);
  }
  if (mods.bias) options.bias = tensor_view(*mods.bias);
  if (mods.sinks) options.sinks = static_cast<const float*>(mods.sinks->data);
  if (mods.key_start) options.key_start = static_cast<const int32_t*>(mods.key_start->data);
  if (mods.q_offset) options.q_offset = static_cast<const int32_t*>(mods.q_offset->data);
}

}  // namespace selfattn_python
