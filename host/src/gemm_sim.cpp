// The sim's strided-batched GEMM with cuBLAS's conventions: placeholder (owner: the cublas-path engineer).
#include "device.h"
#include "selfattn/error.h"

namespace selfattn::detail {

void sim_gemm_strided_batched(const GemmBatch&) { throw NotAvailable("sim GEMM: not built yet"); }

}  // namespace selfattn::detail
