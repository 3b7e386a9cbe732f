#pragma once
// What a Context holds. Library code reaches it through Context::state().
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/device.h"
#include "selfattn/context.h"

namespace selfattn::detail {

// One growable device allocation reused across calls. Each public call asks for everything it
// needs at once (self_attention(): its projections and the attention step's scores side by side),
// so the bytes counted against `limit` are exactly the bytes the call asked for, and the allocation
// never exceeds `limit`. Once a shape has run, the same shape never allocates again.
class Workspace {
 public:
  explicit Workspace(std::shared_ptr<Device> device, size_t limit);
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  // At least `bytes` bytes, 256-byte aligned; valid until the next reserve(). Contents are not
  // preserved when it grows. More than limit() throws WorkspaceTooSmall: "<what>: N bytes needed
  // but the workspace limit is L bytes; ..." (`what` names the entry point and the use).
  void* reserve(size_t bytes, const std::string& what);
  size_t limit() const { return limit_; }
  void set_limit(size_t bytes);  // releases the allocation if it holds more than the new limit
  size_t bytes() const { return bytes_; }  // held now
  void release();                // frees the allocation (waits for queued work first)

 private:
  std::shared_ptr<Device> device_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  size_t limit_ = 0;
};

struct ContextState {
  ContextState(std::shared_ptr<Device> device_in, size_t workspace_limit)
      : device(std::move(device_in)), workspace(device, workspace_limit) {}
  std::shared_ptr<Device> device;
  Workspace workspace;
  bool hopper_kernels = true;  // ContextOptions::hopper_kernels
  // decode_combine's grid cap (kv_cache.cpp): one block per row up to this many blocks, each
  // striding over the rows past it. Not an option: tests lower it to run the stride on the sim,
  // which could not run the 2^20 + 1 rows the default needs.
  int64_t decode_combine_max_blocks = int64_t(1) << 20;
};

}  // namespace selfattn::detail
