# Runs selfattn-demo (-DDEMO=path) and checks that its output shows the worked example's numbers as
# computed by the library: the weights of 它 and its output, with both roundings of the output.
execute_process(COMMAND ${DEMO} RESULT_VARIABLE status OUTPUT_VARIABLE output ERROR_VARIABLE errors)
message("${output}${errors}")
if(NOT status EQUAL 0)
  message(FATAL_ERROR "selfattn-demo exited with ${status}")
endif()
foreach(expected
    "library weights of 它: +0\\.331 +0\\.340 +0\\.329"
    "library output of 它: +\\[0\\.032, 0\\.111\\]"
    "document prints +\\[0\\.031, 0\\.111\\]"
    "exact +\\[0\\.0319, 0\\.1113\\]"
    "whole sentence: 11 tokens, max \\|library - reference\\| [0-9.e-]+ OK")
  if(NOT output MATCHES "${expected}")
    message(FATAL_ERROR "selfattn-demo output lacks /${expected}/")
  endif()
endforeach()
