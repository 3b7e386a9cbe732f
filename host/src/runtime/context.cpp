// Context: backend choice, the device runtime, the workspace.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>

#include "runtime/context_state.h"
#include "runtime/capability.h"
#include "selfattn/context.h"
#include "selfattn/error.h"

namespace selfattn {
namespace {

std::optional<Backend> backend_from_environment() {
  const char* value = std::getenv("SELFATTN_BACKEND");
  if (value == nullptr || *value == '\0') return std::nullopt;
  const std::string name = value;
  if (name == "cuda") return Backend::cuda;
  if (name == "sim") return Backend::sim;
  throw InvalidArgument("environment variable SELFATTN_BACKEND: expected 'cuda' or 'sim', got '" + name + "'");
}

bool hopper_kernels_of(const ContextOptions& options) {
  if (options.hopper_kernels) return *options.hopper_kernels;
  const char* value = std::getenv("SELFATTN_HOPPER_KERNELS");
  if (value == nullptr || *value == '\0') return true;
  const std::string text = value;
  if (text == "1") return true;
  if (text == "0") return false;
  throw InvalidArgument("environment variable SELFATTN_HOPPER_KERNELS: expected '0' or '1', got '" + text + "'");
}

std::shared_ptr<detail::Device> make_device(const ContextOptions& options) {
  std::optional<Backend> wanted = options.backend;
  if (!wanted) wanted = backend_from_environment();
  if (wanted == Backend::sim) return detail::make_sim_device();
  if (wanted == Backend::cuda) return detail::make_cuda_device(options.device, options.stream);  // throws NotAvailable
  // Nothing asked for: a usable GPU if there is one, else the simulator. A GPU that works but that
  // this build has no kernels for is a build made for other GPUs, not a machine without one: that
  // refusal stands, instead of running every call on the CPU unasked.
  try {
    return detail::make_cuda_device(options.device, options.stream);
  } catch (const NotAvailable&) {
    if (detail::cuda_device_lacks_kernel_image(options.device)) throw;
    return detail::make_sim_device();
  }
}

}  // namespace

Context::Context(ContextOptions options)
    : state_(std::make_unique<detail::ContextState>(make_device(options), options.workspace_limit)) {
  state_->hopper_kernels = hopper_kernels_of(options);
}

Context::Context(Backend backend) : Context([&] {
        ContextOptions options;
        options.backend = backend;
        return options;
      }()) {}

Context::~Context() = default;
Context::Context(Context&&) noexcept = default;
Context& Context::operator=(Context&&) noexcept = default;

detail::ContextState& Context::state() {
  if (!state_) throw InvalidArgument("Context: used after being moved from");
  return *state_;
}

Backend Context::backend() const { return const_cast<Context*>(this)->state().device->backend(); }
bool Context::uses_hopper_kernels() const {
  return detail::hopper_kernels_usable(const_cast<Context*>(this)->state());
}

std::string Context::device_name() const { return const_cast<Context*>(this)->state().device->name(); }
void* Context::stream() const { return const_cast<Context*>(this)->state().device->stream(); }
void Context::synchronize() { state().device->synchronize(); }

size_t Context::workspace_limit() const { return const_cast<Context*>(this)->state().workspace.limit(); }
void Context::set_workspace_limit(size_t bytes) { state().workspace.set_limit(bytes); }
size_t Context::workspace_bytes() const { return const_cast<Context*>(this)->state().workspace.bytes(); }

namespace detail {

Workspace::Workspace(std::shared_ptr<Device> device, size_t limit) : device_(std::move(device)), limit_(limit) {}

Workspace::~Workspace() { release(); }

void Workspace::release() {
  if (data_ == nullptr) return;
  // Kernels queued on the stream may still read the old allocation.
  try {
    device_->synchronize();
  } catch (...) {
  }
  device_->deallocate(data_);
  data_ = nullptr;
  bytes_ = 0;
}

void* Workspace::reserve(size_t bytes, const std::string& what) {
  if (bytes <= bytes_) return data_;
  if (bytes > limit_) {
    throw WorkspaceTooSmall(what + ": " + std::to_string(bytes) + " bytes needed but the workspace limit is " +
                            std::to_string(limit_) +
                            " bytes; raise ContextOptions::workspace_limit or Context::set_workspace_limit");
  }
  // Grow geometrically (capped by the limit) so a slowly growing shape does not reallocate each call.
  const size_t grown = std::min(std::max(bytes, bytes_ * 2), limit_);
  if (data_ != nullptr) {
    device_->synchronize();  // kernels queued on the stream may still read the old allocation
    device_->deallocate(data_);
    data_ = nullptr;
    bytes_ = 0;
  }
  data_ = device_->allocate(grown, what.c_str());
  bytes_ = grown;
  return data_;
}

void Workspace::set_limit(size_t bytes) {
  limit_ = bytes;
  if (bytes_ > limit_) release();
}

}  // namespace detail
}  // namespace selfattn
