#pragma once
// A test's stand-in for CUDA graph capture on the sim: while a SimCaptureScope lives, the sim
// device (on any thread) refuses what a captured stream may not contain - a synchronous copy
// (host reads of device data among them), an allocation or free, a stream synchronisation -
// with BackendError naming the call. Kernel launches, fills and asynchronous copies still run.
// Used by the tests that prove a call graph-safe (kv_cache.h says which calls are).
namespace selfattn::detail {

class SimCaptureScope {
 public:
  SimCaptureScope();
  ~SimCaptureScope();
  SimCaptureScope(const SimCaptureScope&) = delete;
  SimCaptureScope& operator=(const SimCaptureScope&) = delete;
};

}  // namespace selfattn::detail
