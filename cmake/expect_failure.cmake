# cmake -DCOMMAND="a;b;c" -DEXPECT_REGEX="..." -DTIMEOUT_SECONDS=<s> -P expect_failure.cmake
# Passes when COMMAND exits non-zero and its output matches every regex in EXPECT_REGEX (a list).
# Optional: -DEXPECT_EXIT_CODE=<n> (the exit code must be n), -DMAX_SECONDS=<s> (it must end
# within s seconds, a tighter bound than TIMEOUT_SECONDS, which only stops a hang),
# -DANY_EXIT_CODE=ON (exit code 0 passes too: for launchers that hide the job's exit code).
include(${CMAKE_CURRENT_LIST_DIR}/expect_common.cmake)
zt_expect_run()
zt_expect_hung(hung)
if(hung)
  message(FATAL_ERROR "the command hung (${result}) instead of failing:\n${text}")
endif()
if(result EQUAL 0 AND NOT ANY_EXIT_CODE)
  message(FATAL_ERROR "expected a failure, but the command succeeded:\n${text}")
endif()
zt_expect_output_matches()
if(DEFINED EXPECT_EXIT_CODE AND NOT result EQUAL EXPECT_EXIT_CODE)
  message(FATAL_ERROR "expected exit code ${EXPECT_EXIT_CODE}, got ${result}:\n${text}")
endif()
if(DEFINED MAX_SECONDS AND elapsed GREATER MAX_SECONDS)
  message(FATAL_ERROR "the failure took ${elapsed} s, more than ${MAX_SECONDS} s:\n${text}")
endif()
message(STATUS "failed as expected (exit: ${result}, ${elapsed} s)")
