// selfattn._selfattn: the nanobind module behind `import selfattn`. It only translates: DLPack
// arrays become TensorViews, Python keywords become AttentionOptions, C++ exceptions become Python
// ones. Beyond mapping DLPack dtypes and dimensions, every check of shapes, dtypes, strides and
// overlaps is the library's own; this file adds only what the library cannot see from a pointer
// (the length of key_lengths, cu_seqlens and lse, the shape of alibi_slopes) and where each array
// lives.
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

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "selfattn/selfattn.h"

namespace nb = nanobind;

namespace {

// Any DLPack array; read-only sources are accepted for inputs.
using InArray = nb::ndarray<nb::ro>;
using OutArray = nb::ndarray<>;

constexpr int kDLCPU = 1;
constexpr int kDLCUDA = 2;

[[noreturn]] void invalid(const std::string& message) { throw selfattn::InvalidArgument(message); }

// A context as Python sees it: the library's Context plus what it was made for, so a call can
// check that its arrays live where the context runs.
struct BoundContext {
  selfattn::Context ctx;
  selfattn::Backend backend;
  int device;
  uintptr_t stream;
  std::mutex mutex;  // held by each call that uses ctx

  static selfattn::ContextOptions options(selfattn::Backend backend, int device, uintptr_t stream,
                                          size_t workspace_limit, std::optional<bool> hopper_kernels) {
    selfattn::ContextOptions o;
    o.backend = backend;
    o.device = device;
    o.hopper_kernels = hopper_kernels;
    // The library takes a null stream to mean "make your own"; the caller's legacy default stream
    // (handle 0) is named by CUDA's cudaStreamLegacy handle, 0x1, so work still runs on it.
    o.stream = backend == selfattn::Backend::cuda ? reinterpret_cast<void*>(stream == 0 ? 1 : stream) : nullptr;
    o.workspace_limit = workspace_limit;
    return o;
  }
  BoundContext(selfattn::Backend backend, int device, uintptr_t stream, size_t workspace_limit,
               std::optional<bool> hopper_kernels)
      : ctx(options(backend, device, stream, workspace_limit, hopper_kernels)),
        backend(backend),
        device(device),
        stream(stream) {}
};

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

// The library's dtype of a float array. NumPy cannot export ml_dtypes' bfloat16 through DLPack, so
// the Python layer passes such arrays viewed as uint16 with `bf16_as_uint16` set.
selfattn::DType dtype_of(const char* name, const nb::dlpack::dtype& dt, bool bf16_as_uint16) {
  using code = nb::dlpack::dtype_code;
  if (dt.lanes == 1) {
    if (dt.code == uint8_t(code::Float) && dt.bits == 32) return selfattn::DType::f32;
    if (dt.code == uint8_t(code::Float) && dt.bits == 16) return selfattn::DType::f16;
    if (dt.code == uint8_t(code::Bfloat) && dt.bits == 16) return selfattn::DType::bf16;
    if (bf16_as_uint16 && dt.code == uint8_t(code::UInt) && dt.bits == 16) return selfattn::DType::bf16;
  }
  invalid(std::string(name) + ".dtype expected float32, float16 or bfloat16, got " + dtype_name(dt));
}

// What an argument holds: attention data (f32/f16/bf16, checked on arrival) or an index/LSE vector
// (int32/fp32, checked by expect_int32_vector / expect_contiguous_float32).
enum class Holds { data, data_bf16_as_uint16, vector };

// One array argument of a call: where it lives and the bytes its elements span.
struct Arg {
  const char* name;
  void* data;
  int device_type;
  int device_id;
  size_t ndim;
  std::vector<int64_t> shape, strides;  // strides in elements, from the array
  size_t item;                          // bytes per element
  bool written;                         // out, lse: copied back after a sim run
  selfattn::DType dtype = selfattn::DType::f32;  // for Holds::data*

  template <class Array>
  Arg(const char* name, const Array& a, bool written, Holds holds)
      : name(name), data(const_cast<void*>(static_cast<const void*>(a.data()))), device_type(a.device_type()),
        device_id(a.device_id()), ndim(a.ndim()), item(a.dtype().bits / 8), written(written) {
    if (holds != Holds::vector) dtype = dtype_of(name, a.dtype(), holds == Holds::data_bf16_as_uint16);
    for (size_t i = 0; i < ndim; ++i) {
      shape.push_back(int64_t(a.shape(i)));
      strides.push_back(a.stride(i));
    }
  }
  bool empty() const { return std::any_of(shape.begin(), shape.end(), [](int64_t n) { return n == 0; }); }
  // Bytes [begin, end) relative to data that the elements occupy (strides may be negative).
  int64_t lowest() const {
    int64_t low = 0;
    for (size_t i = 0; i < ndim; ++i) low += std::min<int64_t>(0, (shape[i] - 1) * strides[i]);
    return low * int64_t(item);
  }
  int64_t highest() const {
    int64_t high = 0;
    for (size_t i = 0; i < ndim; ++i) high += std::max<int64_t>(0, (shape[i] - 1) * strides[i]);
    return (high + 1) * int64_t(item);
  }
};

// Copies a call's host arrays into sim device memory and back. Arrays whose bytes overlap (views of
// one packed QKV array, say) share one device allocation at the same relative offsets, so the
// library sees exactly the aliasing the caller made and its own overlap checks judge it.
// Allocations keep the host address's alignment modulo 256 (the library checks alignment).
class SimStaging {
 public:
  void stage(selfattn::Context& ctx, std::vector<Arg*>& args) {
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

  // Copies the elements of `a` (data already a device address) back to the host array; only its elements
  // are written, so the bytes between them (and any input sharing the region) are untouched.
  void copy_back(const Arg& a) const {
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

 private:
  struct Region {
    uintptr_t host_begin, host_end;
    selfattn::DeviceBuffer<unsigned char> buffer;
  };
  void* to_device(void* host) const {
    const uintptr_t p = reinterpret_cast<uintptr_t>(host);
    for (const Region& r : regions_) {
      if (p >= r.host_begin && p < r.host_end) return r.buffer.data() + (r.host_begin % 256) + (p - r.host_begin);
    }
    invalid("internal: an array's address lies in no staged region");
  }
  const Region& region_of_device(const void* device) const {
    const unsigned char* p = static_cast<const unsigned char*>(device);
    for (const Region& r : regions_) {
      if (p >= r.buffer.data() && p < r.buffer.data() + r.buffer.size()) return r;
    }
    invalid("internal: an output lies in no staged region");
  }
  std::vector<Region> regions_;
};

// Everything one call needs: its arrays, where they run, and the context to run them on.
class Call {
 public:
  explicit Call(BoundContext& context) : context_(context) {}

  Arg& add(Arg arg) {
    args_.push_back(std::make_unique<Arg>(std::move(arg)));
    return *args_.back();
  }

  // Checks that every array lives where the context runs, then (sim) copies them in.
  void prepare() {
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

  // After the library returned: on the sim, wait and copy the written arrays back.
  void finish() {
    if (context_.backend != selfattn::Backend::sim) return;
    context_.ctx.synchronize();
    for (const auto& a : args_) {
      if (a->written) staging_.copy_back(*a);
    }
  }

  selfattn::Context& ctx() { return context_.ctx; }

 private:
  BoundContext& context_;
  std::vector<std::unique_ptr<Arg>> args_;
  SimStaging staging_;
};

// A 4-D view [batch, heads, seq, head_dim] of an array (the Python layer has already turned BSHD
// into this order by swapping axes, which only changes strides).
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

// An int32 vector of exactly `count` contiguous entries (key_lengths, cu_seqlens): the library
// reads `count` of them from the pointer alone, so the length is checked here.
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

// fp32 elements stored contiguously (row-major): what the library reads from a bare float pointer.
void expect_contiguous_float32(const Arg& a, const nb::dlpack::dtype& dt) {
  int64_t expected_stride = 1;
  for (size_t i = a.ndim; i-- > 0;) {
    if (a.shape[i] > 1 && a.strides[i] != expected_stride) {
      invalid(std::string(a.name) + " expected a contiguous array");
    }
    expected_stride *= a.shape[i];
  }
  if (dt.code != uint8_t(nb::dlpack::dtype_code::Float) || dt.bits != 32 || dt.lanes != 1) {
    invalid(std::string(a.name) + ".dtype expected float32, got " + dtype_name(dt));
  }
}

int64_t element_count(const Arg& a) {
  int64_t n = 1;
  for (int64_t extent : a.shape) n *= extent;
  return n;
}

// lse as the library writes it: fp32, contiguous, `rows` elements.
void expect_lse(const Arg& a, const nb::dlpack::dtype& dt, int64_t rows) {
  expect_contiguous_float32(a, dt);
  const int64_t n = element_count(a);
  if (n != rows) invalid("lse expected " + std::to_string(rows) + " elements, got " + std::to_string(n));
}

// The scalar options; the library checks their values (window sides >= -1, softcap finite > 0).
selfattn::AttentionOptions make_options(const std::optional<std::string>& causal, std::optional<float> scale,
                                        const std::string& path, int window_left = -1, int window_right = -1,
                                        std::optional<float> softcap = std::nullopt) {
  selfattn::AttentionOptions options;
  options.causal = parse_causal(causal);
  options.scale = scale;
  options.path = parse_path(path);
  options.window_left = window_left;
  options.window_right = window_right;
  options.softcap = softcap;
  return options;
}

// Without the GIL (the sim takes a while; other Python threads go on), one call at a time per
// context (its workspace and stream are not shared safely); `body` runs after staging.
template <class Body>
void run_call(BoundContext& context, Call& call, Body body) {
  nb::gil_scoped_release unlocked;
  std::lock_guard<std::mutex> serial(context.mutex);
  call.prepare();
  body();
  call.finish();
}

Holds data_kind(bool bf16_as_uint16) { return bf16_as_uint16 ? Holds::data_bf16_as_uint16 : Holds::data; }

// The four views every attention call takes: q, k, v read, out written.
struct AttentionArgs {
  const Arg &q, &k, &v, &out;
};
AttentionArgs add_attention_args(Call& call, const InArray& q, const InArray& k, const InArray& v, const OutArray& out,
                                 bool bf16_as_uint16) {
  const Holds data = data_kind(bf16_as_uint16);
  return {call.add(Arg("q", q, false, data)), call.add(Arg("k", k, false, data)), call.add(Arg("v", v, false, data)),
          call.add(Arg("out", out, true, data))};
}

// The arrays every backward call takes: q, k, v, out, dout and the forward's lse read; dq, dk, dv
// written (each q's dtype or float32).
struct BackwardArgs {
  const Arg &q, &k, &v, &out, &dout, &lse, &dq, &dk, &dv;
};
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

// A varlen call's cu_seqlens_q and cu_seqlens_k: int32 [batch + 1] each, batch from the first.
struct CuSeqlens {
  const Arg &q, &k;
  int64_t batch;
};
CuSeqlens add_cu_seqlens(Call& call, const InArray& cu_seqlens_q, const InArray& cu_seqlens_k) {
  const Arg& acq = call.add(Arg("cu_seqlens_q", cu_seqlens_q, false, Holds::vector));
  const Arg& ack = call.add(Arg("cu_seqlens_k", cu_seqlens_k, false, Holds::vector));
  if (acq.ndim != 1 || acq.shape[0] < 1) invalid("cu_seqlens_q expected a 1-D array of batch + 1 >= 1 entries");
  const int64_t batch = acq.shape[0] - 1;
  expect_int32_vector(acq, cu_seqlens_q.dtype(), batch + 1, "batch + 1");
  expect_int32_vector(ack, cu_seqlens_k.dtype(), batch + 1, "batch + 1, as cu_seqlens_q");
  return {acq, ack, batch};
}

// The arrays of the score modifiers, each optional: ALiBi slopes (fp32 [heads] or [batch, heads],
// read from a bare pointer, so their shape is checked here) and the bias (a 4-D view in q's
// dtype or fp32; the library checks its dtype, shape and strides).
struct ModArgs {
  const Arg* alibi_slopes;
  const Arg* bias;
};
ModArgs add_mod_args(Call& call, const std::optional<InArray>& alibi_slopes, const std::optional<InArray>& bias,
                     int64_t batch, int64_t heads, bool bf16_as_uint16) {
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
  return {alibi, abias};
}

// After staging (the data pointers are the device's from here on, valid until run_call returns).
void set_mod_options(selfattn::AttentionOptions& options, const ModArgs& mods) {
  if (mods.alibi_slopes) {
    options.alibi_slopes = static_cast<const float*>(mods.alibi_slopes->data);
    options.alibi_slopes_count = element_count(*mods.alibi_slopes);
  }
  if (mods.bias) options.bias = tensor_view(*mods.bias);
}

void attention(BoundContext& context, InArray q, InArray k, InArray v, OutArray out, std::optional<std::string> causal,
               std::optional<float> scale, std::string path, std::optional<InArray> key_lengths,
               std::optional<OutArray> lse, int window_left, int window_right, std::optional<float> softcap,
               std::optional<InArray> alibi_slopes, std::optional<InArray> bias, bool bf16_as_uint16) {
  selfattn::AttentionOptions options = make_options(causal, scale, path, window_left, window_right, softcap);
  Call call(context);
  const AttentionArgs a = add_attention_args(call, q, k, v, out, bf16_as_uint16);
  const Arg* alengths = key_lengths ? &call.add(Arg("key_lengths", *key_lengths, false, Holds::vector)) : nullptr;
  const Arg* alse = lse ? &call.add(Arg("lse", *lse, true, Holds::vector)) : nullptr;
  const selfattn::TensorView q_shape = tensor_view(a.q);
  const ModArgs mods = add_mod_args(call, alibi_slopes, bias, q_shape.batch(), q_shape.heads(), bf16_as_uint16);
  if (alengths) expect_int32_vector(*alengths, key_lengths->dtype(), q_shape.batch(), "batch");
  if (alse) expect_lse(*alse, lse->dtype(), q_shape.batch() * q_shape.heads() * q_shape.seq());
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
                      std::optional<InArray> bias, bool bf16_as_uint16) {
  selfattn::AttentionOptions options = make_options(causal, scale, path, window_left, window_right, softcap);
  Call call(context);
  const AttentionArgs a = add_attention_args(call, q, k, v, out, bf16_as_uint16);
  const CuSeqlens cu = add_cu_seqlens(call, cu_seqlens_q, cu_seqlens_k);
  const Arg* alse = lse ? &call.add(Arg("lse", *lse, true, Holds::vector)) : nullptr;
  const selfattn::TensorView q_shape = tensor_view(a.q);
  if (alse) expect_lse(*alse, lse->dtype(), q_shape.heads() * q_shape.seq());
  const ModArgs mods = add_mod_args(call, alibi_slopes, bias, cu.batch, q_shape.heads(), bf16_as_uint16);
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
                        std::optional<InArray> alibi_slopes, std::optional<InArray> bias, bool deterministic,
                        bool bf16_as_uint16) {
  selfattn::AttentionOptions options = make_options(causal, scale, path, window_left, window_right, softcap);
  selfattn::BackwardOptions backward;
  backward.deterministic = deterministic;
  Call call(context);
  const BackwardArgs a = add_backward_args(call, q, k, v, out, dout, lse, dq, dk, dv, bf16_as_uint16);
  const Arg* alengths = key_lengths ? &call.add(Arg("key_lengths", *key_lengths, false, Holds::vector)) : nullptr;
  const selfattn::TensorView q_shape = tensor_view(a.q);
  if (alengths) expect_int32_vector(*alengths, key_lengths->dtype(), q_shape.batch(), "batch");
  expect_lse(a.lse, lse.dtype(), q_shape.batch() * q_shape.heads() * q_shape.seq());
  const ModArgs mods = add_mod_args(call, alibi_slopes, bias, q_shape.batch(), q_shape.heads(), bf16_as_uint16);
  run_call(context, call, [&] {
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
                               std::optional<InArray> alibi_slopes, std::optional<InArray> bias, bool deterministic,
                               bool bf16_as_uint16) {
  selfattn::AttentionOptions options = make_options(causal, scale, path, window_left, window_right, softcap);
  selfattn::BackwardOptions backward;
  backward.deterministic = deterministic;
  Call call(context);
  const BackwardArgs a = add_backward_args(call, q, k, v, out, dout, lse, dq, dk, dv, bf16_as_uint16);
  const CuSeqlens cu = add_cu_seqlens(call, cu_seqlens_q, cu_seqlens_k);
  const selfattn::TensorView q_shape = tensor_view(a.q);
  expect_lse(a.lse, lse.dtype(), q_shape.heads() * q_shape.seq());
  const ModArgs mods = add_mod_args(call, alibi_slopes, bias, cu.batch, q_shape.heads(), bf16_as_uint16);
  run_call(context, call, [&] {
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
                    std::string path, std::optional<InArray> key_lengths, bool bf16_as_uint16) {
  selfattn::AttentionOptions options = make_options(causal, scale, path);
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
  run_call(context, call, [&] {
    options.key_lengths = alengths ? static_cast<const int32_t*>(alengths->data) : nullptr;
    const selfattn::MatrixView wo_view = awo ? matrix_view(*awo) : selfattn::MatrixView{};
    selfattn::self_attention(call.ctx(), tensor_view(ax), matrix_view(aq), matrix_view(ak), matrix_view(av), heads,
                             tensor_view(aout), options, awo ? &wo_view : nullptr);
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
        nb::arg("alibi_slopes").none(), nb::arg("bias").none(), nb::arg("bf16_as_uint16"),
        "Low level: q, k, v, out as [batch, heads, seq, head_dim] views. Use selfattn.attention().");
  m.def("attention_varlen", &attention_varlen, nb::arg("context"), nb::arg("q"), nb::arg("k"), nb::arg("v"),
        nb::arg("out"), nb::arg("cu_seqlens_q"), nb::arg("cu_seqlens_k"), nb::arg("max_seqlen_q"),
        nb::arg("max_seqlen_k"), nb::arg("causal").none(), nb::arg("scale").none(), nb::arg("path"),
        nb::arg("lse").none(), nb::arg("window_left"), nb::arg("window_right"), nb::arg("softcap").none(),
        nb::arg("alibi_slopes").none(), nb::arg("bias").none(), nb::arg("bf16_as_uint16"),
        "Low level: q, out as [1, heads, total_q, head_dim] views. Use selfattn.attention_varlen().");
  m.def("attention_backward", &attention_backward, nb::arg("context"), nb::arg("q"), nb::arg("k"), nb::arg("v"),
        nb::arg("out"), nb::arg("dout"), nb::arg("lse"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"),
        nb::arg("causal").none(), nb::arg("scale").none(), nb::arg("path"), nb::arg("key_lengths").none(),
        nb::arg("window_left"), nb::arg("window_right"), nb::arg("softcap").none(),
        nb::arg("alibi_slopes").none(), nb::arg("bias").none(), nb::arg("deterministic"), nb::arg("bf16_as_uint16"),
        "Low level: every array as a [batch, heads, seq, head_dim] view. Use selfattn.attention_backward().");
  m.def("attention_varlen_backward", &attention_varlen_backward, nb::arg("context"), nb::arg("q"), nb::arg("k"),
        nb::arg("v"), nb::arg("out"), nb::arg("dout"), nb::arg("lse"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"),
        nb::arg("cu_seqlens_q"), nb::arg("cu_seqlens_k"), nb::arg("max_seqlen_q"), nb::arg("max_seqlen_k"),
        nb::arg("causal").none(), nb::arg("scale").none(), nb::arg("path"), nb::arg("window_left"),
        nb::arg("window_right"), nb::arg("softcap").none(), nb::arg("alibi_slopes").none(), nb::arg("bias").none(),
        nb::arg("deterministic"), nb::arg("bf16_as_uint16"),
        "Low level: q, out, dout, dq as [1, heads, total_q, head_dim] views. Use "
        "selfattn.attention_varlen_backward().");
  m.def("self_attention", &self_attention, nb::arg("context"), nb::arg("x"), nb::arg("wq"), nb::arg("wk"),
        nb::arg("wv"), nb::arg("heads"), nb::arg("out"), nb::arg("wo").none(), nb::arg("causal").none(),
        nb::arg("scale").none(), nb::arg("path"), nb::arg("key_lengths").none(), nb::arg("bf16_as_uint16"),
        "Low level: x as a [batch, 1, seq, d_model] view. Use selfattn.self_attention().");
}
