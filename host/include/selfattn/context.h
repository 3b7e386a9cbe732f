#pragma once
#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "selfattn/types.h"

namespace selfattn {

namespace detail {
class Device;  // one backend's runtime (host/src/device.h)
struct ContextState;
}  // namespace detail

struct ContextOptions {
  // Unset: the environment variable SELFATTN_BACKEND (cuda|sim) if set, else cuda when a usable
  // GPU is present, else sim. Asking for cuda without a usable GPU throws NotAvailable saying why.
  std::optional<Backend> backend;
  int device = 0;                  // CUDA device ordinal
  void* stream = nullptr;          // a cudaStream_t to run on (not owned); nullptr: the context makes its own
  // Bytes the context's workspace may hold: the naive and cublas paths' S and P, and
  // self_attention()'s projected Q, K, V. A call needing more throws WorkspaceTooSmall.
  size_t workspace_limit = size_t(1) << 30;
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

  size_t workspace_limit() const;
  void set_workspace_limit(size_t bytes);
  size_t workspace_bytes() const;  // currently held

  // Internal: the library's own code reaches the runtime through this.
  detail::ContextState& state();

 private:
  std::unique_ptr<detail::ContextState> state_;
};

}  // namespace selfattn
