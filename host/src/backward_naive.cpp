// Path 'naive' of attention_backward(): not written yet.
#include "backward_paths.h"

namespace selfattn::detail {

const char* naive_backward_unsupported(const ContextState&, const BackwardCall&) {
  return "the naive backward is not written yet";
}
void plan_naive_backward(ContextState&, PlannedBackward&, const char*) {}
void run_naive_backward(ContextState&, const PlannedBackward&, void*) {}

}  // namespace selfattn::detail
