// Path 'cublas' of attention_backward(): not written yet.
#include "backward_paths.h"

namespace selfattn::detail {

const char* cublas_backward_unsupported(const ContextState&, const BackwardCall&) {
  return "the cublas backward is not written yet";
}
void plan_cublas_backward(ContextState&, PlannedBackward&, const char*) {}
void run_cublas_backward(ContextState&, const PlannedBackward&, void*) {}

}  // namespace selfattn::detail
