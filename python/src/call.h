// The Python module's translation layer (entry_points.h declares the entry points): one call's
// DLPack arrays (Arg), where they live, the sim's staging of host arrays (SimStaging), and the
// library's views and options made from them. Beyond mapping DLPack dtypes and dimensions, every
// check of shapes, dtypes, strides and overlaps is the library's own; this layer adds only what the
// library cannot see from a pointer (the length of key_lengths, cu_seqlens and lse, the shape of
// alibi_slopes, sinks and dsinks) and where each array lives.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "selfattn/selfattn.h"

namespace selfattn_python {

namespace nb = nanobind;

// Any DLPack array; read-only sources are accepted for inputs.
using InArray = nb::ndarray<nb::ro>;
using OutArray = nb::ndarray<>;

constexpr int kDLCPU = 1;
constexpr int kDLCUDA = 2;

[[noreturn]] inline void invalid(const std::string& message) { throw selfattn::InvalidArgument(message); }

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

// The Python keywords as the library's enums (InvalidArgument naming the argument otherwise).
selfattn::Backend parse_backend(const std::string& name);
selfattn::Path parse_path(const std::string& name);
selfattn::Causal parse_causal(const std::optional<std::string>& name);

// A DLPack dtype as a message names it ("float32", "bfloat16", "int64x2").
std::string dtype_name(nb::dlpack::dtype dt);

// The library's dtype of a float array. NumPy cannot export ml_dtypes' bfloat16 through DLPack, so
// the Python layer passes such arrays viewed as uint16 with `bf16_as_uint16` set. FP8 arrays
// (ml_dtypes' and torch's float8_e4m3fn / float8_e5m2) come the same way, viewed as uint8, with
// `fp8_as_uint8` their format: DLPack has no FP8 codes that NumPy or every torch version exports.
selfattn::DType dtype_of(const char* name, const nb::dlpack::dtype& dt, bool bf16_as_uint16,
                         std::optional<selfattn::DType> fp8_as_uint8 = std::nullopt);

// The Python layer's name of an FP8 format ("e4m3", "e5m2", or None: no FP8 array in the call).
std::optional<selfattn::DType> parse_fp8(const std::optional<std::string>& name);

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

  // fp8_as_uint8: the FP8 format of the call's data arrays that arrive as uint8 (see dtype_of).
  template <class Array>
  Arg(const char* name, const Array& a, bool written, Holds holds,
      std::optional<selfattn::DType> fp8_as_uint8 = std::nullopt)
      : name(name), data(const_cast<void*>(static_cast<const void*>(a.data()))), device_type(a.device_type()),
        device_id(a.device_id()), ndim(a.ndim()), item(a.dtype().bits / 8), written(written) {
    if (holds != Holds::vector) dtype = dtype_of(name, a.dtype(), holds == Holds::data_bf16_as_uint16, fp8_as_uint8);
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
  void stage(selfattn::Context& ctx, std::vector<Arg*>& args);
  // Copies the elements of `a` (data already a device address) back to the host array; only its elements
  // are written, so the bytes between them (and any input sharing the region) are untouched.
  void copy_back(const Arg& a) const;

 private:
  struct Region {
    uintptr_t host_begin, host_end;
    selfattn::DeviceBuffer<unsigned char> buffer;
  };
  void* to_device(void* host) const;
  const Region& region_of_device(const void* device) const;
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
  void prepare();
  // After the library returned: on the sim, wait and copy the written arrays back.
  void finish();

  selfattn::Context& ctx() { return context_.ctx; }

 private:
  BoundContext& context_;
  std::vector<std::unique_ptr<Arg>> args_;
  SimStaging staging_;
};

// A 4-D view [batch, heads, seq, head_dim] of an array (the Python layer has already turned BSHD
// into this order by swapping axes, which only changes strides).
selfattn::TensorView tensor_view(const Arg& a);
// A row-major 2-D view [rows, cols] (the weights of self_attention).
selfattn::MatrixView matrix_view(const Arg& a);
// "[2, 3]", for messages.
std::string shape_text(const Arg& a);

// An int32 vector of exactly `count` contiguous entries (key_lengths, cu_seqlens): the library
// reads `count` of them from the pointer alone, so the length is checked here.
void expect_int32_vector(const Arg& a, const nb::dlpack::dtype& dt, int64_t count, const std::string& what);

// Elements stored contiguously (row-major): what the library reads from a bare pointer.
void expect_contiguous(const Arg& a);
// fp32 elements stored contiguously (row-major): what the library reads from a bare float pointer.
void expect_contiguous_float32(const Arg& a, const nb::dlpack::dtype& dt);

int64_t element_count(const Arg& a);  // the product of the shape

// An LSE array (lse, lse_a, ...), or another fp32 array read from a bare pointer (dlse, sinks,
// dsinks), as the library reads or writes it: fp32, contiguous, of `shape` (`dims` names its axes
// for the message: "batch, heads, seq_q").
void expect_lse(const Arg& a, const nb::dlpack::dtype& dt, const std::vector<int64_t>& shape, const char* dims);

// The masks and score modifiers as Python hands them over: selfattn::MaskOptions's fields, the
// arrays still Python's. One object every attention entry point takes (`masks`), bound once as
// _selfattn.MaskArgs (bind_mask_args) and made once, by _calls._score_mods: a new modifier is a
// field here, its keyword there, and its conversion in add_mod_args / set_mod_options.
struct MaskArgs {
  int window_left = -1, window_right = -1;
  std::optional<float> softcap;
  std::optional<InArray> alibi_slopes, bias, sinks, key_start, q_offset;
};
void bind_mask_args(nb::module_& m);

// The scalar options, the masks' window and softcap among them; the library checks their values
// (window sides >= -1, softcap finite > 0).
selfattn::AttentionOptions make_options(const std::optional<std::string>& causal, std::optional<float> scale,
                                        const std::string& path, const MaskArgs& masks);
// Dropout (AttentionOptions::dropout_p, dropout_seed, dropout_offset); the library checks the rate.
void set_dropout_options(selfattn::AttentionOptions& options, float dropout_p, uint64_t dropout_seed,
                         uint64_t dropout_offset);

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

// How attention data arrive: as float arrays, or bfloat16 as uint16 (see dtype_of).
Holds data_kind(bool bf16_as_uint16);

// The four views every attention call takes: q, k, v read, out written.
struct AttentionArgs {
  const Arg &q, &k, &v, &out;
};
// fp8: the format of FP8 q, k, v (passed as uint8, see dtype_of), or nullopt.
AttentionArgs add_attention_args(Call& call, const InArray& q, const InArray& k, const InArray& v, const OutArray& out,
                                 bool bf16_as_uint16, std::optional<selfattn::DType> fp8 = std::nullopt);

// The arrays every backward call takes: q, k, v, out, dout and the forward's lse read; dq, dk, dv
// written (each q's dtype or float32).
struct BackwardArgs {
  const Arg &q, &k, &v, &out, &dout, &lse, &dq, &dk, &dv;
};
BackwardArgs add_backward_args(Call& call, const InArray& q, const InArray& k, const InArray& v, const InArray& out,
                               const InArray& dout, const InArray& lse, const OutArray& dq, const OutArray& dk,
                               const OutArray& dv, bool bf16_as_uint16);

// A varlen call's cu_seqlens_q and cu_seqlens_k: int32 [batch + 1] each, batch from the first.
struct CuSeqlens {
  const Arg &q, &k;
  int64_t batch;
};
CuSeqlens add_cu_seqlens(Call& call, const InArray& cu_seqlens_q, const InArray& cu_seqlens_k);

// The arrays of the score modifiers, each optional: ALiBi slopes (fp32 [heads] or [batch, heads],
// read from a bare pointer, so their shape is checked here), the bias (a 4-D view in q's dtype or
// fp32; the library checks its dtype, shape and strides) and the attention sinks (fp32 [heads]
// contiguous, from a bare pointer too), and the per-sequence key starts and query offsets (int32
// [batch] each: `batch` is the number of sequences of a varlen call).
struct ModArgs {
  const Arg* alibi_slopes;
  const Arg* bias;
  const Arg* sinks;
  const Arg* key_start;
  const Arg* q_offset;
};
ModArgs add_mod_args(Call& call, const MaskArgs& masks, int64_t batch, int64_t heads, bool bf16_as_uint16);

// After staging (the data pointers are the device's from here on, valid until run_call returns).
void set_mod_options(selfattn::MaskOptions& options, const ModArgs& mods);

// A backward call's optional arrays beyond add_backward_args': dlse (fp32, lse's shape `lse_shape`)
// read, and dsinks (fp32 [heads], the sinks' gradient) written.
struct BackwardExtras {
  const Arg *dlse, *dsinks;
};
BackwardExtras add_backward_extras(Call& call, const std::optional<InArray>& dlse,
                                   const std::optional<OutArray>& dsinks, const std::vector<int64_t>& lse_shape,
                                   int64_t heads);
// After staging.
void set_backward_options(selfattn::BackwardOptions& backward, const BackwardExtras& extras);

// A KV cache's arrays (selfattn/kv_cache.h): k and v (the cache, or the page pool, as 4-D views;
// added by the caller, written or not), lengths (int32 [batch]) and, for a paged pool,
// block_table (int32 [batch, max_pages_per_seq], row-major: the library reads it from a bare
// pointer, so its layout is checked here). batch is block_table's rows, else k's batch extent.
// batch_index (contiguous only, int32 [batch]): sequence b's row of the cache; with it the batch
// is no extent of the cache, so lengths and batch_index are each checked against the call's own
// (`call_batch`: q's or k_new's batch, a packed call's offsets less one; unknown: count -1), each
// named when it is the one that differs. k_scale, v_scale:
// an FP8 cache's fp32 scales, 1-D contiguous and of one length (the library takes one
// scale_count for both; the Python layer broadcasts a per-tensor one beside a per-head one); the
// library checks that they are there exactly for an FP8 cache and their count.
struct KvCacheArgs {
  const Arg &k, &v, &lengths;
  const Arg* block_table;
  const Arg* batch_index;
  int64_t batch, max_pages_per_seq;
  const Arg* k_scale;
  const Arg* v_scale;
};
// The batch a KV-cache call's other arguments give, and where it comes from ("q.shape[0]").
struct CallBatch {
  int64_t count = -1;
  std::string what;
};
KvCacheArgs add_kv_cache(Call& call, const Arg& k, const Arg& v, const InArray& lengths,
                         const std::optional<InArray>& block_table, const std::optional<InArray>& batch_index,
                         const CallBatch& call_batch, const std::optional<InArray>& k_scale = std::nullopt,
                         const std::optional<InArray>& v_scale = std::nullopt);
// After staging.
selfattn::KvCache kv_cache(const KvCacheArgs& cache);

// Rotary tables: cos and sin, [max_position, rotary_dim / 2] contiguous each, float32, float16 or
// bfloat16, both of one dtype (read from bare pointers, so their shapes are checked here), both or
// neither; positions (int32 [batch]), the step and the first rotated element as selfattn::Rotary
// takes them.
struct RotaryArgs {
  const Arg *cos, *sin;
  bool interleaved;
  const Arg* positions;
  int position_step;
  selfattn::DType table_dtype;
  int first_dim;
};
RotaryArgs add_rotary(Call& call, const std::optional<InArray>& cos, const std::optional<InArray>& sin,
                      bool interleaved, const std::optional<InArray>& positions, int position_step, int64_t batch,
                      int first_dim);
// After staging; nullopt without tables.
std::optional<selfattn::Rotary> rotary(const RotaryArgs& tables);

}  // namespace selfattn_python
