#pragma once
// What a Context holds. Library code reaches it through Context::state().
#include <cstddef>
#include <memory>

#include "device.h"
#include "selfattn/context.h"

namespace selfattn::detail {

// A single growable device allocation reused across calls. Grows (never shrinks on its own) up to
// `limit` bytes; asking for more than the limit throws WorkspaceTooSmall naming the limit.
class Workspace {
 public:
  explicit Workspace(std::shared_ptr<Device> device, size_t limit);
  ~Workspace();
  void* reserve(size_t bytes, const char* what);  // valid until the next reserve()
  size_t limit() const { return limit_; }
  void set_limit(size_t bytes);  // releases the allocation if it is larger than the new limit
  size_t bytes() const { return bytes_; }

 private:
  std::shared_ptr<Device> device_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  size_t limit_ = 0;
};

struct ContextState {
  std::shared_ptr<Device> device;
  Workspace workspace;
};

}  // namespace selfattn::detail
