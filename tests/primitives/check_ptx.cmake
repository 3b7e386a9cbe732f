# Compiles the primitive test kernels to PTX for sm_90 with nvcc and checks that each primitive
# became its instruction (not, say, a silently taken fallback). Run by ctest (primitives.ptx):
#   cmake -DNVCC=... -DKERNELS_DIR=... -DTESTS_DIR=... -DOUT=... -P check_ptx.cmake
execute_process(
  COMMAND ${NVCC} -std=c++17 -arch=sm_90 -ptx -x cu -I${KERNELS_DIR} -I${TESTS_DIR}
          ${TESTS_DIR}/primitive_test_kernels.cuh -o ${OUT}
  RESULT_VARIABLE status ERROR_VARIABLE errors)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "nvcc -ptx failed:\n${errors}")
endif()
file(READ ${OUT} ptx)
foreach(instruction
    "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
    "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
    "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32"
    "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32"
    "ldmatrix.sync.aligned.m8n8.x1.shared.b16" "ldmatrix.sync.aligned.m8n8.x2.shared.b16"
    "ldmatrix.sync.aligned.m8n8.x4.shared.b16" "ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16"
    "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16" "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"
    "cp.async.cg.shared.global" "cp.async.ca.shared.global" "cp.async.commit_group"
    "cp.async.wait_group" "cp.async.wait_all" "shfl.sync.bfly.b32")
  string(FIND "${ptx}" "${instruction}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "the PTX of the primitive test kernels has no ${instruction}")
  endif()
endforeach()
# No local memory: the primitives' register arrays must stay in registers.
string(FIND "${ptx}" ".local" local_at)
if(NOT local_at EQUAL -1)
  message(FATAL_ERROR "the PTX of the primitive test kernels uses local memory")
endif()
message(STATUS "PTX holds every primitive's instruction")
