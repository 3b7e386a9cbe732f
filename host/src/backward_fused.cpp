// Path 'fused' of attention_backward(): not written yet.
#include "backward_paths.h"

namespace selfattn::detail {

const char* fused_backward_unsupported(const ContextState&, const BackwardCall&) {
  return "the fused backward is not written yet";
}
void plan_fused_backward(ContextState&, PlannedBackward&, const char*) {}
void run_fused_backward(ContextState&, const PlannedBackward&, void*) {}

}  // namespace selfattn::detail
