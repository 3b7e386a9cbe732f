#pragma once
// What a Context holds. Library code reaches it through Context::state().
#include <array>
#include <cstddef>
#include <memory>

#include "device.h"
#include "selfattn/context.h"

namespace selfattn::detail {

// Independent regions of the workspace, so that one caller's data survives another's reserve():
// self_attention() keeps its projected Q, K, V in `projections` while the path it calls reserves
// `scratch` for S and P.
enum class WorkspaceSlot : int { scratch = 0, projections = 1 };

// Growable device allocations reused across calls, one per slot. A slot grows (never shrinks on
// its own) while the sum over all slots stays within `limit` bytes; asking for more throws
// WorkspaceTooSmall naming the limit. Once a shape has run, the same shape never allocates again.
class Workspace {
 public:
  explicit Workspace(std::shared_ptr<Device> device, size_t limit);
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  // At least `bytes` bytes, 256-byte aligned; valid until the next reserve() of the same slot.
  // Contents are not preserved across growth. `what` names the user in the error message.
  void* reserve(size_t bytes, const char* what, WorkspaceSlot slot = WorkspaceSlot::scratch);
  size_t limit() const { return limit_; }
  void set_limit(size_t bytes);  // releases the allocations if they hold more than the new limit
  size_t bytes() const;          // held in all slots together
  void release();                // frees every slot (waits for queued work first)

 private:
  struct Region {
    void* data = nullptr;
    size_t bytes = 0;
  };
  static constexpr int kSlots = 2;
  std::shared_ptr<Device> device_;
  std::array<Region, kSlots> regions_{};
  size_t limit_ = 0;
};

struct ContextState {
  ContextState(std::shared_ptr<Device> device_in, size_t workspace_limit)
      : device(std::move(device_in)), workspace(device, workspace_limit) {}
  std::shared_ptr<Device> device;
  Workspace workspace;
};

}  // namespace selfattn::detail
