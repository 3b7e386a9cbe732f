// Path 'naive': placeholder until its kernels land (owner: the naive-path engineer).
#include "paths.h"
#include "selfattn/error.h"

namespace selfattn::detail {

const char* naive_unsupported(const ContextState&, const AttentionCall&) { return "the naive path is not built yet"; }

void run_naive(ContextState&, const AttentionCall&) { throw NotAvailable("path naive: not built yet"); }

}  // namespace selfattn::detail
