// Path 'fused': placeholder until its kernels land (owner: the fused-path engineer).
#include "paths.h"
#include "selfattn/error.h"

namespace selfattn::detail {

const char* fused_unsupported(const ContextState&, const AttentionCall&) { return "the fused path is not built yet"; }

void run_fused(ContextState&, const AttentionCall&) { throw NotAvailable("path fused: not built yet"); }

}  // namespace selfattn::detail
