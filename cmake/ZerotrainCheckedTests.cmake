# zt_add_checked_test(<name> TIMEOUT <s> EXPECT <regex>... [ABSENT <regex>...] [EXIT_CODE <n>]
#                     [SKIP_EXIT_CODE <n>] COMMAND <command>...)
# A ctest that passes when <command> exits with EXIT_CODE (default 0), its output matches every
# EXPECT regex and none of the ABSENT ones, through cmake/expect_success.cmake. Use it instead of
# PASS_REGULAR_EXPRESSION, which makes ctest ignore the exit code. The command is stopped and
# reported as hung after TIMEOUT seconds; the ctest TIMEOUT is set 30 s later so that the report,
# not ctest's kill, ends a hang. With SKIP_EXIT_CODE, that exit code marks the test skipped. The
# function sets TIMEOUT (and SKIP_REGULAR_EXPRESSION); set the other properties (LABELS,
# ENVIRONMENT, ...) afterwards.
function(zt_add_checked_test name)
  # PARSE_ARGV keeps an argument that holds a list (-DMPIEXEC=mpiexec;-n;2) one argument.
  cmake_parse_arguments(PARSE_ARGV 1 ARG "" "TIMEOUT;EXIT_CODE;SKIP_EXIT_CODE" "EXPECT;ABSENT;COMMAND")
  if(NOT ARG_TIMEOUT OR NOT ARG_EXPECT OR NOT ARG_COMMAND OR ARG_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "zt_add_checked_test(${name}): needs TIMEOUT, EXPECT and COMMAND "
                        "(unparsed: ${ARG_UNPARSED_ARGUMENTS})")
  endif()
  string(REPLACE ";" "\\;" command "${ARG_COMMAND}")
  string(REPLACE ";" "\\;" regex "${ARG_EXPECT}")
  set(options -DTIMEOUT_SECONDS=${ARG_TIMEOUT})
  if(ARG_ABSENT)
    string(REPLACE ";" "\\;" absent "${ARG_ABSENT}")
    list(APPEND options -DABSENT_REGEX=${absent})
  endif()
  if(DEFINED ARG_EXIT_CODE)
    list(APPEND options -DEXPECT_EXIT_CODE=${ARG_EXIT_CODE})
  endif()
  if(DEFINED ARG_SKIP_EXIT_CODE)
    list(APPEND options -DSKIP_EXIT_CODE=${ARG_SKIP_EXIT_CODE})
  endif()
  add_test(NAME ${name} COMMAND ${CMAKE_COMMAND} -DCOMMAND=${command} -DEXPECT_REGEX=${regex} ${options}
                                -P ${PROJECT_SOURCE_DIR}/cmake/expect_success.cmake)
  math(EXPR ctest_timeout "${ARG_TIMEOUT} + 30")
  set_tests_properties(${name} PROPERTIES TIMEOUT ${ctest_timeout})
  if(DEFINED ARG_SKIP_EXIT_CODE)
    set_tests_properties(${name} PROPERTIES SKIP_REGULAR_EXPRESSION "SKIPPED: exit code ${ARG_SKIP_EXIT_CODE}")
  endif()
endfunction()

# zt_add_skipped_test(<name> <reason>): a ctest for a test that cannot be built here (a tool or an
# optional part missing at configure time): it prints "SKIPPED: <reason>" and ctest reports it as
# skipped, so the test shows with its reason instead of being silently absent. Set LABELS afterwards.
function(zt_add_skipped_test name reason)
  add_test(NAME ${name} COMMAND ${CMAKE_COMMAND} -E echo "SKIPPED: ${reason}")
  set_tests_properties(${name} PROPERTIES SKIP_REGULAR_EXPRESSION "SKIPPED: ")
endfunction()
