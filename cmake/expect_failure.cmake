# cmake -DCOMMAND="a;b;c" -DEXPECT_REGEX="..." -P expect_failure.cmake
# Passes when COMMAND exits non-zero and its output matches every regex in EXPECT_REGEX (a list).
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err
                TIMEOUT ${TIMEOUT_SECONDS})
set(text "${out}${err}")
if(result EQUAL 0)
  message(FATAL_ERROR "expected a failure, but the command succeeded:\n${text}")
endif()
if(result MATCHES "timeout|Process terminated")
  message(FATAL_ERROR "the command hung (${result}) instead of failing:\n${text}")
endif()
foreach(regex IN LISTS EXPECT_REGEX)
  if(NOT text MATCHES "${regex}")
    message(FATAL_ERROR "output does not match '${regex}' (exit: ${result}):\n${text}")
  endif()
endforeach()
message(STATUS "failed as expected (exit: ${result})")
