// Path 'cublas': placeholder until its kernels land (owner: the cublas-path engineer).
#include "paths.h"
#include "selfattn/error.h"

namespace selfattn::detail {

const char* cublas_unsupported(const ContextState&, const AttentionCall&) { return "the cublas path is not built yet"; }

void run_cublas(ContextState&, const AttentionCall&) { throw NotAvailable("path cublas: not built yet"); }

}  // namespace selfattn::detail
