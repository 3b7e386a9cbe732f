// make_cuda_device in a build without nvcc: the cuda backend says why it is missing.
#include "runtime/device.h"
#include "selfattn/error.h"

#if !SELFATTN_HAVE_CUDA
namespace selfattn::detail {

std::shared_ptr<Device> make_cuda_device(int, void*) {
  throw NotAvailable(
      "cuda backend: not in this build (configured without nvcc or with -DSELFATTN_ENABLE_CUDA=OFF); use the sim backend");
}

// No kernels for any GPU, and no GPU is looked at: the sim is the backend (context.cpp).
bool cuda_device_lacks_kernel_image(int) { return false; }

}  // namespace selfattn::detail
#endif
