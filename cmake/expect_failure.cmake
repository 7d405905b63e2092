# cmake -DCOMMAND="a;b;c" -DEXPECT_REGEX="..." -P expect_failure.cmake
# Passes when COMMAND exits non-zero and its output matches every regex in EXPECT_REGEX (a list).
# Optional: -DEXPECT_EXIT_CODE=<n> (the exit code must be n), -DMAX_SECONDS=<s> (it must end
# within s seconds, a tighter bound than TIMEOUT_SECONDS, which only stops a hang),
# -DANY_EXIT_CODE=ON (exit code 0 passes too: for launchers that hide the job's exit code).
string(TIMESTAMP started "%s" UTC)
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err
                TIMEOUT ${TIMEOUT_SECONDS})
string(TIMESTAMP ended "%s" UTC)
math(EXPR elapsed "${ended} - ${started}")
set(text "${out}${err}")
if(result EQUAL 0 AND NOT ANY_EXIT_CODE)
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
if(DEFINED EXPECT_EXIT_CODE AND NOT result EQUAL EXPECT_EXIT_CODE)
  message(FATAL_ERROR "expected exit code ${EXPECT_EXIT_CODE}, got ${result}:\n${text}")
endif()
if(DEFINED MAX_SECONDS AND elapsed GREATER MAX_SECONDS)
  message(FATAL_ERROR "the failure took ${elapsed} s, more than ${MAX_SECONDS} s:\n${text}")
endif()
message(STATUS "failed as expected (exit: ${result}, ${elapsed} s)")
