#pragma once
#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "selfattn/types.h"

namespace selfattn {

namespace detail {
class Device;  // one backend's runtime (host/src/runtime/device.h)
struct ContextState;
}  // namespace detail

struct ContextOptions {
  // Unset: the environment variable SELFATTN_BACKEND (cuda|sim) if set, else cuda when a usable
  // GPU is present, else sim. Asking for cuda without a usable GPU throws NotAvailable saying why.
  // A GPU this build has no kernels for (built for other compute capabilities: see README.md on
  // CMAKE_CUDA_ARCHITECTURES) is refused when the context is made, not at the first launch: the
  // constructor throws NotAvailable naming the GPU's compute capability and the ones built, with
  // the backend unset too (the sim runs only when asked for then).
  std::optional<Backend> backend;
  int device = 0;                  // CUDA device ordinal
  void* stream = nullptr;          // a cudaStream_t to run on (not owned); nullptr: the context makes its own
  // Bytes the context's workspace may hold; its one allocation never exceeds this. What a call
  // counts against it, in bytes:
  //   attention(), attention_varlen() on the naive or cublas path: the scores of a chunk of query
  //     rows, each row max(16, 4 * round_up(seq_k, 4)) (fp32 S, P written over it), on the cublas
  //     path for f16/bf16 plus 2 * round_up(seq_k, 8) (P in that dtype). seq_k is the call's; for
  //     attention_varlen each sequence's own key count (read from cu_seqlens_k). The chunk is the
  //     whole problem when it fits, else as many rows as fit. The fused path counts nothing for
  //     attention(); for attention_varlen() 2 * round_up(4 * (batch + 1), 256) (the running
  //     maximum of cu_seqlens_q and of cu_seqlens_k: attention.h).
  //   self_attention(): Q, K, V and, with wo, the attention output, each round_up(bytes, 256),
  //     plus the attention step's scores as above in what remains.
  //   attention_with_kv_cache(), append_kv(), cu_seqlens_from_lengths(): what kv_cache.h says at each.
  //   attention_backward(), attention_varlen_backward(): what backward.h says (D, the fused path's dQ
  //     accumulator, the naive/cublas paths' dK/dV accumulators and score rows).
  // A call throws WorkspaceTooSmall, before it writes anything, exactly when this count with a
  // chunk of one query row (of the sequence whose row counts most) exceeds the limit.
  size_t workspace_limit = size_t(1) << 30;
  // The fused path's forward on compute capability 9.0 (H100/H200; and on the sim, which models
  // one): true runs the Hopper kernel (wgmma, TMA, warp-specialised) where it takes the call
  // (f16/bf16, head_dim 64/128/256, rows on 16 bytes), the mma.sync kernel elsewhere; false runs
  // the mma.sync kernel always (to compare the two, or to rule the Hopper kernels out; FP8 inputs
  // are then dequantized). Unset: the environment variable SELFATTN_HOPPER_KERNELS (0 or 1) if set,
  // else true. Kernels for one architecture alone run wherever the build and the device have them;
  // this is the Hopper case of that choice, the one a context may turn off.
  std::optional<bool> hopper_kernels;
};

// Device choice, stream, lazily created cuBLAS handle and reusable workspace. Move-only.
// Once warm (the workspace grown to what a shape needs), attention calls do not allocate.
class Context {
 public:
  explicit Context(ContextOptions options = {});
  explicit Context(Backend backend);
  ~Context();
  Context(Context&&) noexcept;
  Context& operator=(Context&&) noexcept;
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  Backend backend() const;
  std::string device_name() const;  // "NVIDIA H200" or "sim (CPU, N worker threads)"
  void* stream() const;             // cudaStream_t on cuda, nullptr on sim
  void synchronize();               // waits for all work queued on the context's stream

  // Whether the fused forward runs the Hopper kernel where it takes a call (ContextOptions::
  // hopper_kernels, a 9.0 device or the sim, and a build with the sm_90a kernels).
  bool uses_hopper_kernels() const;

  size_t workspace_limit() const;
  void set_workspace_limit(size_t bytes);  // ContextOptions::workspace_limit; frees the workspace if it holds more
  size_t workspace_bytes() const;          // currently held (at most the limit)

  // Internal: the library's own code reaches the runtime through this.
  detail::ContextState& state();

 private:
  std::unique_ptr<detail::ContextState> state_;
};

}  // namespace selfattn
