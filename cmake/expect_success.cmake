# cmake -DCOMMAND="a;b;c" -DEXPECT_REGEX="..." -DTIMEOUT_SECONDS=<s> -P expect_success.cmake
# Passes when COMMAND exits with EXPECT_EXIT_CODE (default 0) within TIMEOUT_SECONDS and its output
# matches every regex in EXPECT_REGEX (a list). ctest's PASS_REGULAR_EXPRESSION alone does not
# look at the exit code, so a program that printed the right lines and then crashed would pass.
# Optional: -DSKIP_EXIT_CODE=<n>: the command's way of saying "cannot run here"; the script then
# prints the output and the line "SKIPPED: exit code <n>" (zt_add_checked_test makes ctest
# report the test as skipped on that line).
include(${CMAKE_CURRENT_LIST_DIR}/expect_common.cmake)
if(NOT DEFINED EXPECT_EXIT_CODE)
  set(EXPECT_EXIT_CODE 0)
endif()
zt_expect_run()
zt_expect_hung(hung)
if(hung)
  message(FATAL_ERROR "the command hung: stopped after ${TIMEOUT_SECONDS} s (${result}); its output so far:\n"
                      "${text}")
endif()
if(DEFINED SKIP_EXIT_CODE AND result EQUAL SKIP_EXIT_CODE)
  message(STATUS "${text}")
  message(STATUS "SKIPPED: exit code ${SKIP_EXIT_CODE}")
  return()
endif()
if(NOT result EQUAL EXPECT_EXIT_CODE)
  message(FATAL_ERROR "expected exit code ${EXPECT_EXIT_CODE}, got ${result} after ${elapsed} s:\n${text}")
endif()
zt_expect_output_matches()
message(STATUS "${text}")
message(STATUS "succeeded as expected (exit: ${result}, ${elapsed} s)")
