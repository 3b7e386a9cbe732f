# cmake -P script: build the consumer app as an outside project and run it (sim backend).
#   MODE=find_package:     install BUILD_DIR's `library` component to a temporary prefix, then
#                          configure APP_SOURCE against it with CMAKE_PREFIX_PATH;
#   MODE=add_subdirectory: configure APP_SOURCE with SELFATTN_CHECKOUT=SOURCE_DIR, which builds the
#                          library from the sources inside the app's build.
# Both: WORK_DIR (scratch), GENERATOR, CXX_COMPILER; CONFIGURE_ARGS (a list) is added to the app's
# configure; CONFIGURE_ONLY=ON stops after the configure.
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE status OUTPUT_VARIABLE output ERROR_VARIABLE output)
  if(NOT status EQUAL 0)
    string(REPLACE ";" " " command "${ARGN}")
    message(FATAL_ERROR "failed (${status}): ${command}\n${output}")
  endif()
  message("${output}")
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
set(configure_args -S ${APP_SOURCE} -B ${WORK_DIR}/build -G ${GENERATOR} -DCMAKE_BUILD_TYPE=Release
                   -DCMAKE_CXX_COMPILER=${CXX_COMPILER} ${CONFIGURE_ARGS})
if(MODE STREQUAL "find_package")
  run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix --component library)
  list(APPEND configure_args -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
elseif(MODE STREQUAL "add_subdirectory")
  list(APPEND configure_args -DSELFATTN_CHECKOUT=${SOURCE_DIR})
else()
  message(FATAL_ERROR "MODE: expected find_package or add_subdirectory, got '${MODE}'")
endif()
run(${CMAKE_COMMAND} ${configure_args})
if(CONFIGURE_ONLY)
  return()
endif()
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/consumer_app)
