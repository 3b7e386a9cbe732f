#pragma once
// What a backend needs to start one kernel instance. Every launch in the library goes through
// a KernelRef and the runtime's launch(); there is no <<<...>>> anywhere else.
#include <cstddef>
#include <type_traits>
#include <typeinfo>

#include <vector_types.h>  // dim3 (host and device)

#include "common/target.h"

namespace selfattn::kernels {

struct LaunchShape {
  dim3 grid;
  dim3 block;
  size_t dynamic_smem_bytes = 0;
};

// A kernel takes exactly one argument, a trivially copyable params struct, by value.
struct KernelRef {
  const char* name = nullptr;
  const void* device_entry = nullptr;               // the __global__ symbol (nvcc builds)
  void (*sim_entry)(const void* params) = nullptr;  // one CUDA thread's body (sim builds)
  size_t params_bytes = 0;
  // A mangled type name that demangles to the kernel function (the sim matches it with what ptxas
  // reported for the cuda build of the same template: sim::compiled_kernel_name).
  const char* compiled_key = nullptr;
  explicit operator bool() const { return device_entry != nullptr || sim_entry != nullptr; }
};

}  // namespace selfattn::kernels

SELFATTN_KERNELS_BEGIN

template <class Params, void (*Kernel)(Params)>
KernelRef make_kernel_ref(const char* name) {
  const char* key = typeid(std::integral_constant<void (*)(Params), Kernel>).name();
#if SELFATTN_SIM
  return KernelRef{name, nullptr, [](const void* p) { Kernel(*static_cast<const Params*>(p)); }, sizeof(Params), key};
#else
  return KernelRef{name, reinterpret_cast<const void*>(Kernel), nullptr, sizeof(Params), key};
#endif
}

SELFATTN_KERNELS_END
