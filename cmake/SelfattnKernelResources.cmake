# What ptxas gives each CUDA kernel instance (registers, static shared memory, stack frame, per
# architecture), recorded at build time so the sim can refuse a launch the GPU would refuse
# (sim/README.md, "Launch resources"; sim.h, CompiledKernel).
#   selfattn_record_ptxas(target): the target's CUDA objects are compiled with -Xptxas -v through
#     cmake/ptxas_report.sh, which keeps each object's report beside it (<object>.ptxas). No second
#     compile: the report comes with the build.
#   selfattn_compiled_kernels_source(out targets...): a generated C++ file that registers every
#     report of the targets' objects with the sim at load time (cmake/compiled_kernels.cmake).
function(selfattn_record_ptxas target)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xptxas=-v>)
  # Before any launcher of the user's (ccache replays a cached compile's messages, report included).
  set(launcher ${PROJECT_SOURCE_DIR}/cmake/ptxas_report.sh ${CMAKE_CUDA_COMPILER_LAUNCHER})
  set_target_properties(${target} PROPERTIES CUDA_COMPILER_LAUNCHER "${launcher}")
  # The launcher writes part of each object's output: a change to it recompiles them.
  get_target_property(sources ${target} SOURCES)
  list(FILTER sources INCLUDE REGEX "\\.cu$")
  set_property(SOURCE ${sources} APPEND PROPERTY OBJECT_DEPENDS ${PROJECT_SOURCE_DIR}/cmake/ptxas_report.sh)
endfunction()

function(selfattn_compiled_kernels_source out)
  set(objects "")
  foreach(target ${ARGN})
    list(APPEND objects "$<TARGET_OBJECTS:${target}>")
  endforeach()
  set(source ${CMAKE_CURRENT_BINARY_DIR}/compiled_kernels.cpp)
  add_custom_command(OUTPUT ${source}
    COMMAND ${CMAKE_COMMAND} "-DOBJECTS=${objects}" -DOUT=${source}
            -P ${PROJECT_SOURCE_DIR}/cmake/compiled_kernels.cmake
    DEPENDS ${objects} ${PROJECT_SOURCE_DIR}/cmake/compiled_kernels.cmake
    COMMENT "Recording ptxas's reports of the kernel instances for the sim" VERBATIM)
  set(${out} ${source} PARENT_SCOPE)
endfunction()
