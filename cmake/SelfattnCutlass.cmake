# CUTLASS/CuTe headers (header-only), for the tests that check the sim's Hopper primitives (wgmma
# descriptors, GMMA layouts, TMA swizzles) against NVIDIA's own definitions. They come from PyPI's
# nvidia-cutlass (installed into .venv by scripts/setup-deps), which ships them under
# cutlass_library/source/include; -DSELFATTN_CUTLASS_INCLUDE=<dir> points at another copy.
# Defines the INTERFACE target selfattn_cutlass_headers.
if(NOT SELFATTN_CUTLASS_INCLUDE)
  set(_selfattn_python ${Python_EXECUTABLE})
  if(NOT _selfattn_python AND EXISTS ${PROJECT_SOURCE_DIR}/.venv/bin/python3)
    set(_selfattn_python ${PROJECT_SOURCE_DIR}/.venv/bin/python3)
  endif()
  if(_selfattn_python)
    execute_process(
      COMMAND ${_selfattn_python} -c
              "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))"
      OUTPUT_VARIABLE _selfattn_cutlass_dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  endif()
  if(_selfattn_cutlass_dir AND EXISTS ${_selfattn_cutlass_dir}/cute/arch/mma_sm90_desc.hpp)
    set(SELFATTN_CUTLASS_INCLUDE ${_selfattn_cutlass_dir} CACHE PATH "CUTLASS include directory (cute/, cutlass/)")
  endif()
endif()
if(NOT SELFATTN_CUTLASS_INCLUDE OR NOT EXISTS ${SELFATTN_CUTLASS_INCLUDE}/cute/arch/mma_sm90_desc.hpp)
  message(FATAL_ERROR "the tests need the CUTLASS 4.x headers (PyPI package nvidia-cutlass). Run scripts/setup-deps, "
                      "which installs it into .venv, or pass -DSELFATTN_CUTLASS_INCLUDE=<cutlass/include>, or "
                      "configure with -DSELFATTN_BUILD_TESTS=OFF.")
endif()
message(STATUS "selfattn: CUTLASS headers from ${SELFATTN_CUTLASS_INCLUDE}")
add_library(selfattn_cutlass_headers INTERFACE)
target_include_directories(selfattn_cutlass_headers SYSTEM INTERFACE ${SELFATTN_CUTLASS_INCLUDE})
# CUTLASS includes <cuda/std/...>, which CUDA 13 keeps under include/cccl; host-compiled users
# (the sim tests) need that directory too.
foreach(_selfattn_dir ${CUDAToolkit_INCLUDE_DIRS})
  if(EXISTS ${_selfattn_dir}/cccl/cuda/std/utility)
    target_include_directories(selfattn_cutlass_headers SYSTEM INTERFACE ${_selfattn_dir}/cccl)
  endif()
endforeach()
target_link_libraries(selfattn_cutlass_headers INTERFACE CUDA::toolkit)
