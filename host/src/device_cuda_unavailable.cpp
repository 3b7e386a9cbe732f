// make_cuda_device in a build without nvcc: the cuda backend says why it is missing.
#include "device.h"
#include "selfattn/error.h"

#if !SELFATTN_HAVE_CUDA
namespace selfattn::detail {

std::shared_ptr<Device> make_cuda_device(int, void*) {
  throw NotAvailable(
      "cuda backend: not in this build (configured without nvcc or with -DSELFATTN_ENABLE_CUDA=OFF); use the sim backend");
}

}  // namespace selfattn::detail
#endif
