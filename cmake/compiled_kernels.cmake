# cmake -DOBJECTS=<objects> -DOUT=<file.cpp> -P compiled_kernels.cmake
# Reads the ptxas report kept beside each object (cmake/ptxas_report.sh: <object>.ptxas) and writes
# a C++ file that registers them with the sim (sim::register_compiled_kernels). Rewritten only when
# its content changes. A report's lines, per entry function and architecture:
#   ptxas info    : Compiling entry function '_ZN...' for 'sm_90a'
#   ptxas info    : Function properties for _ZN...
#       24 bytes stack frame, 24 bytes spill stores, 36 bytes spill loads
#   ptxas info    : Used 168 registers, used 1 barriers, 400 bytes cmem[0]   (", N bytes smem" if any)
# and, from the PTX, each entry's __launch_bounds__ (none: the hardware's 1024 threads):
#   launch bounds of '_ZN...': 128 1 1
set(entries "")
set(count 0)
foreach(object IN LISTS OBJECTS)
  if(NOT EXISTS "${object}.ptxas")
    message(FATAL_ERROR "${object}.ptxas is missing: the object was not compiled through cmake/ptxas_report.sh")
  endif()
  file(STRINGS "${object}.ptxas" lines)
  foreach(line IN LISTS lines)
    if(line MATCHES "^launch bounds of '([A-Za-z0-9_]+)': ([0-9]+) ([0-9]+) ([0-9]+)")
      math(EXPR "max_threads_${CMAKE_MATCH_1}" "${CMAKE_MATCH_2} * ${CMAKE_MATCH_3} * ${CMAKE_MATCH_4}")
    endif()
  endforeach()
  set(name "")
  foreach(line IN LISTS lines)
    if(line MATCHES "Compiling entry function '([^']+)' for '([^']+)'")
      set(name "${CMAKE_MATCH_1}")
      set(arch "${CMAKE_MATCH_2}")
      set(stack 0)
    elseif(name AND line MATCHES "^ +([0-9]+) bytes stack frame")
      set(stack "${CMAKE_MATCH_1}")
    elseif(name AND line MATCHES "Used ([0-9]+) registers")
      set(registers "${CMAKE_MATCH_1}")
      set(smem 0)
      if(line MATCHES "([0-9]+) bytes smem")
        set(smem "${CMAKE_MATCH_1}")
      endif()
      set(max_threads 0)
      if(DEFINED "max_threads_${name}")
        set(max_threads "${max_threads_${name}}")
      endif()
      string(APPEND entries "    {\"${name}\", \"${arch}\", ${registers}, ${smem}, ${stack}, ${max_threads}},\n")
      math(EXPR count "${count} + 1")
      set(name "")
    endif()
  endforeach()
endforeach()
if(count EQUAL 0)
  set(entries "    {nullptr, nullptr, 0, 0, 0, 0},\n")  # no CUDA kernel in this build
endif()
set(text "// Generated at build time by cmake/compiled_kernels.cmake from ptxas's -v reports of the kernel
// instances and their PTX's launch bounds (${count} entry functions): the sim checks each launch against what the GPU would be
// given (sim.h, CompiledKernel). Do not edit.
#include <cstddef>

#include <selfattn_sim/sim.h>

namespace {

const selfattn::sim::CompiledKernel kCompiledKernels[] = {
${entries}};

[[maybe_unused]] const bool kRegistered =
    (selfattn::sim::register_compiled_kernels(kCompiledKernels, ${count}), true);

}  // namespace
")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
  if(old STREQUAL text)
    return()
  endif()
endif()
file(WRITE "${OUT}" "${text}")
