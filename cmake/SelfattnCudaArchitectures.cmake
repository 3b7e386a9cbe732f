# Which GPUs the CUDA backend is built for. The root CMakeLists.txt calls
# selfattn_cuda_architectures_before_language() before enable_language(CUDA) and
# selfattn_choose_cuda_architectures() after it.
#
# The kernels need compute capability 8.0 or newer (mma.sync m16n8k16 on bf16); the Hopper kernels
# (wgmma, TMA, setmaxnreg) exist for sm_90a alone and are built for it whenever the list holds a 9.0
# entry (kernels/CMakeLists.txt). The list is, the first that applies:
#   1. SELFATTN_CUDA_ARCHITECTURES: for selfattn's own targets only, so a parent project that builds
#      selfattn with add_subdirectory/FetchContent keeps its CMAKE_CUDA_ARCHITECTURES for its code;
#   2. CMAKE_CUDA_ARCHITECTURES (or CUDAARCHS in the environment), as set by the user or a parent project;
#   3. the GPUs visible at configure time, as CMake's `native` finds them, those of 8.0 or newer;
#   4. with no such GPU, SELFATTN_DEFAULT_CUDA_ARCHITECTURES below.
# `native`, `all` and `all-major` are resolved here to the numbers they stand for, so the Hopper check
# and the runtime's message see real architectures; `all` and `all-major` keep those of 8.0 or newer.

# sm_80 code runs on every GPU of compute capability 8.x (a cubin runs on its major version's later
# minors): A100/A30 (8.0), A10/A40/RTX 30 (8.6), Jetson Orin (8.7), L4/L40S/RTX 40 (8.9); separate
# 86 or 89 cubins would compile the same source again for no new GPU. `90` is sm_90 code for
# H100/H200 plus compute_90 PTX, which the driver compiles for newer GPUs (Blackwell: 10.0, 12.0)
# the first time the library loads there.
set(SELFATTN_DEFAULT_CUDA_ARCHITECTURES 80-real 90)
set(SELFATTN_MINIMUM_CUDA_ARCHITECTURE 80)

set(SELFATTN_CUDA_ARCHITECTURES "" CACHE STRING
  "CUDA architectures of selfattn's targets (empty: CMAKE_CUDA_ARCHITECTURES if set, else the visible GPUs, else ${SELFATTN_DEFAULT_CUDA_ARCHITECTURES})")

# Remembers whether anyone chose the architectures. When nobody did, it sets a placeholder the CUDA
# compiler check can build for, so that enable_language(CUDA) does not cache nvcc's own default as
# if it were a choice (the next configure would then take it for the user's).
macro(selfattn_cuda_architectures_before_language)
  if(NOT SELFATTN_CUDA_ARCHITECTURES STREQUAL "")
    set(selfattn_architectures_given "${SELFATTN_CUDA_ARCHITECTURES}")
    set(selfattn_architectures_origin "SELFATTN_CUDA_ARCHITECTURES")
  elseif(DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(selfattn_architectures_given "${CMAKE_CUDA_ARCHITECTURES}")
    set(selfattn_architectures_origin "CMAKE_CUDA_ARCHITECTURES")
  elseif(NOT "$ENV{CUDAARCHS}" STREQUAL "")
    set(selfattn_architectures_given "$ENV{CUDAARCHS}")
    set(selfattn_architectures_origin "CUDAARCHS in the environment")
  else()
    set(selfattn_architectures_given "")
    set(CMAKE_CUDA_ARCHITECTURES ${SELFATTN_MINIMUM_CUDA_ARCHITECTURE})
  endif()
endmacro()

# The number of an entry: 90 for "90", "90-real", "90-virtual" and "90a".
function(selfattn_architecture_number entry out)
  string(REGEX MATCH "^[0-9]+" number "${entry}")
  set(${out} "${number}" PARENT_SCOPE)
endfunction()

# Sets, in the caller's scope:
#   CMAKE_CUDA_ARCHITECTURES         the list for the targets made from here on (a directory-scope
#                                    variable: a parent project's own targets are not affected)
#   SELFATTN_CUDA_ARCHITECTURE_NUMBERS  e.g. "80;90", for the Hopper check
#   SELFATTN_CUDA_BUILT_FOR          what the library carries, in words, for the runtime's message when
#                                    a GPU has no kernel image in this build (host/src/runtime/device_cuda.cu)
function(selfattn_choose_cuda_architectures)
  set(architectures "${selfattn_architectures_given}")
  set(origin "${selfattn_architectures_origin}")
  # CMake's compiler check ran a program that lists the visible GPUs (what `native` builds for):
  # e.g. "90-real", or nothing when there is no GPU or no driver.
  set(visible "${CMAKE_CUDA_ARCHITECTURES_NATIVE}")
  if(architectures STREQUAL "")
    set(supported "")
    set(too_old "")
    foreach(entry IN LISTS visible)
      selfattn_architecture_number(${entry} number)
      if(number LESS SELFATTN_MINIMUM_CUDA_ARCHITECTURE)
        math(EXPR major "${number} / 10")
        math(EXPR minor "${number} % 10")
        list(APPEND too_old ${major}.${minor})
      else()
        list(APPEND supported ${entry})
      endif()
    endforeach()
    if(supported)
      set(architectures ${supported})
      set(origin "the GPUs visible at configure time")
    else()
      set(architectures ${SELFATTN_DEFAULT_CUDA_ARCHITECTURES})
      set(origin "the default list: no GPU visible at configure time")
      if(too_old)
        list(JOIN too_old ", " too_old)
        set(origin "the default list: the visible GPUs (compute capability ${too_old}) are older than 8.0")
      endif()
    endif()
  elseif(architectures STREQUAL "native")
    if(NOT visible)
      message(FATAL_ERROR "${origin} is 'native', but no GPU is visible at configure time; give architectures "
                          "(e.g. ${SELFATTN_DEFAULT_CUDA_ARCHITECTURES}) or leave it unset")
    endif()
    set(architectures ${visible})
  elseif(architectures STREQUAL "all" OR architectures STREQUAL "all-major")
    # The toolkit's list reaches back to GPUs the kernels cannot target: keep 8.0 and newer.
    if(architectures STREQUAL "all")
      set(every ${CMAKE_CUDA_ARCHITECTURES_ALL})
    else()
      set(every ${CMAKE_CUDA_ARCHITECTURES_ALL_MAJOR})
    endif()
    set(architectures "")
    foreach(entry IN LISTS every)
      selfattn_architecture_number(${entry} number)
      if(NOT number LESS SELFATTN_MINIMUM_CUDA_ARCHITECTURE)
        list(APPEND architectures ${entry})
      endif()
    endforeach()
  endif()

  set(numbers "")
  set(built_for "")
  foreach(entry IN LISTS architectures)
    selfattn_architecture_number(${entry} number)
    if(number STREQUAL "")
      message(FATAL_ERROR "${origin}: '${entry}' is not a CUDA architecture (e.g. 80, 90-real, 90-virtual)")
    endif()
    if(number LESS SELFATTN_MINIMUM_CUDA_ARCHITECTURE)
      message(FATAL_ERROR "${origin} (${architectures}) has ${entry}, but selfattn's kernels need compute capability "
                          "8.0 or newer (mma.sync m16n8k16 on bf16). Give a list of 80 or newer; a parent project "
                          "that builds for older GPUs can set SELFATTN_CUDA_ARCHITECTURES for selfattn's targets alone.")
    endif()
    list(APPEND numbers ${number})
    # In words, e.g. "9.0 (sm_90 with compute_90 PTX for newer GPUs)" for 90 (no ';': a CMake list separator).
    string(REGEX REPLACE "^[0-9]+(a?).*$" "\\1" suffix "${entry}")
    math(EXPR major "${number} / 10")
    math(EXPR minor "${number} % 10")
    set(name "${number}${suffix}")
    set(for_newer " for newer GPUs")
    if(suffix STREQUAL "a")
      set(for_newer "")  # architecture-specific PTX runs on its own GPU alone
    endif()
    if(entry MATCHES "-virtual$")
      list(APPEND built_for "${major}.${minor}${suffix} (compute_${name} PTX only${for_newer})")
    elseif(entry MATCHES "-real$")
      list(APPEND built_for "${major}.${minor}${suffix} (sm_${name})")
    else()
      list(APPEND built_for "${major}.${minor}${suffix} (sm_${name} with compute_${name} PTX${for_newer})")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES numbers)
  list(JOIN built_for ", " built_for)
  set(built_for "compute capability ${built_for}")
  message(STATUS "selfattn: CUDA architectures ${architectures} (${origin})")

  set(CMAKE_CUDA_ARCHITECTURES ${architectures} PARENT_SCOPE)
  set(SELFATTN_CUDA_ARCHITECTURE_NUMBERS ${numbers} PARENT_SCOPE)
  set(SELFATTN_CUDA_BUILT_FOR "${built_for}" PARENT_SCOPE)
endfunction()
