# The Hopper primitives' nvcc bodies are inline asm the sim never sees (primitives_hopper.cuh,
# wgmma_ptx.inc): a wrong operand there (a generic 64-bit address where the instruction takes a
# 32-bit shared one, a swapped transpose flag, the wrong accumulator count) compiles and would
# only show on a GPU. This compiles the Hopper test kernels and one Hopper kernel instance to PTX
# for sm_90a and matches every use of each primitive against the operand shapes the PTX ISA gives
# the instruction, as the primitives mean to use it. Run by ctest (primitives_hopper.ptx):
#   cmake -DNVCC=... -DKERNELS_DIR=... -DTESTS_DIR=... -DOUT=<dir> -P check_hopper_ptx.cmake
cmake_minimum_required(VERSION 3.25)  # today's policies: list() keeps empty elements
set(ptx "")
foreach(source "${TESTS_DIR}/hopper_test_kernels.cuh" "${KERNELS_DIR}/instances/sm90a/flash_fwd_hopper_bf16.cu"
               "${KERNELS_DIR}/instances/sm90a/flash_fwd_hopper_e4m3.cu")
  get_filename_component(name "${source}" NAME_WE)
  execute_process(
    COMMAND ${NVCC} -std=c++17 --expt-relaxed-constexpr -gencode arch=compute_90a,code=sm_90a -ptx -x cu
            -I${KERNELS_DIR} -I${TESTS_DIR} "${source}" -o "${OUT}/${name}.ptx"
    RESULT_VARIABLE status ERROR_VARIABLE errors)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "nvcc -ptx ${source} failed:\n${errors}")
  endif()
  file(READ "${OUT}/${name}.ptx" text)
  string(APPEND ptx "${text}")
endforeach()

# setmaxnreg's count: an immediate, a multiple of 8 in [24, 256] (PTX ISA).
set(COUNTS "")
foreach(count RANGE 24 256 8)
  list(APPEND COUNTS ${count})
endforeach()
string(JOIN "|" COUNTS ${COUNTS})
set(R "%r[0-9]+")    # a 32-bit register: a shared-memory address, a count, a coordinate
set(RD "%rd[0-9]+")  # a 64-bit register: a descriptor, a generic address
# instruction prefix -> the operands every use of it must have (CMake regex, whole operand list)
set(checks
  "mbarrier.init.shared::cta.b64 " "\\[${R}\\], ${R}"
  "mbarrier.arrive.expect_tx.shared::cta.b64 " "_, \\[${R}\\], ${R}"
  "mbarrier.try_wait.parity.shared::cta.b64 " "[a-z_0-9%]+, \\[${R}\\], ${R}"
  "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
  "\\[${R}\\], \\[${RD}, {${R}, ${R}, ${R}, ${R}}\\], \\[${R}\\]"
  "fence.mbarrier_init.release.cluster" ""
  "fence.proxy.async.shared::cta" ""
  "wgmma.fence.sync.aligned" ""
  "wgmma.commit_group.sync.aligned" ""
  "wgmma.wait_group.sync.aligned " "[0-9]"
  "setmaxnreg.dec.sync.aligned.u32 " "(${COUNTS})"
  "setmaxnreg.inc.sync.aligned.u32 " "(${COUNTS})")
list(LENGTH checks length)
math(EXPR last "${length} - 1")
foreach(i RANGE 0 ${last} 2)
  math(EXPR j "${i} + 1")
  list(GET checks ${i} prefix)
  list(GET checks ${j} operands)
  string(REPLACE "." "\\." pattern "${prefix}")
  string(REGEX MATCHALL "${pattern}[^;\n]*" uses "${ptx}")  # up to the ';' (a list separator here)
  if(NOT uses)
    message(FATAL_ERROR "the PTX has no ${prefix}")
  endif()
  foreach(use IN LISTS uses)
    if(NOT use MATCHES "^${pattern}${operands}$")
      message(FATAL_ERROR "${use}\n  does not have the operands ${prefix}takes here: ${operands}")
    endif()
  endforeach()
endforeach()

# wgmma.mma_async: D is N/2 f32 registers for m64nNk16 (f16/bf16) and m64nNk32 (e4m3); the
# descriptors 64-bit; scale-d a predicate; scale-a and scale-b +1; 16-bit: A K-major (shared-memory
# A: its transpose flag 0), B's transpose 0 or 1; 8-bit: no transpose operands (K-major only).
string(REGEX MATCHALL "wgmma\\.mma_async[^;]*" uses "${ptx}")
if(NOT uses)
  message(FATAL_ERROR "the PTX has no wgmma.mma_async")
endif()
foreach(use IN LISTS uses)
  if(use MATCHES "^wgmma\\.mma_async\\.sync\\.aligned\\.m64n([0-9]+)k32\\.f32\\.e4m3\\.e4m3 {([^}]*)}, (.*)$")
    set(n "${CMAKE_MATCH_1}")
    set(accumulators "${CMAKE_MATCH_2}")
    if(NOT CMAKE_MATCH_3 MATCHES "^(${RD}, ${RD}, p, 1, 1|{${R}, ${R}, ${R}, ${R}}, ${RD}, p, 1, 1)$")
      message(FATAL_ERROR "${use}\n  does not have the operands A-descriptor or 4 A registers, a B descriptor, "
                          "predicate scale-d, scale-a 1, scale-b 1 (8-bit: no transpose operands)")
    endif()
    string(REGEX MATCHALL "%f[0-9]+" registers "${accumulators}")
    list(LENGTH registers count)
    math(EXPR want "${n} / 2")
    if(NOT count EQUAL want)
      message(FATAL_ERROR "${use}\n  has ${count} accumulator registers; m64n${n}k32 has ${want} per thread")
    endif()
    continue()
  endif()
  if(NOT use MATCHES "^wgmma\\.mma_async\\.sync\\.aligned\\.m64n([0-9]+)k16\\.f32\\.(f16\\.f16|bf16\\.bf16) {([^}]*)}, (.*)$")
    message(FATAL_ERROR "${use}\n  is not an m64nNk16 f32 += f16/bf16 or m64nNk32 f32 += e4m3 wgmma")
  endif()
  set(n "${CMAKE_MATCH_1}")
  set(accumulators "${CMAKE_MATCH_3}")
  set(rest "${CMAKE_MATCH_4}")
  string(REGEX MATCHALL "%f[0-9]+" registers "${accumulators}")
  list(LENGTH registers count)
  math(EXPR want "${n} / 2")
  if(NOT count EQUAL want)
    message(FATAL_ERROR "${use}\n  has ${count} accumulator registers; m64n${n}k16 has ${want} per thread")
  endif()
  if(NOT rest MATCHES "^(${RD}, ${RD}, p, 1, 1, 0, [01]|{${R}, ${R}, ${R}, ${R}}, ${RD}, p, 1, 1, [01])$")
    message(FATAL_ERROR "${use}\n  does not have the operands A-descriptor or 4 A registers, a B descriptor, "
                        "predicate scale-d, scale-a 1, scale-b 1, [transpose-a 0,] transpose-b")
  endif()
endforeach()
list(LENGTH uses wgmmas)
message(STATUS "PTX: every Hopper primitive has its operands (${wgmmas} wgmma uses)")
