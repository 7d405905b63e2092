# Shared by expect_success.cmake and expect_failure.cmake (included, not run on its own).
# Inputs: COMMAND (a list), TIMEOUT_SECONDS (a hang is stopped and reported after that many
# seconds), EXPECT_REGEX (a list of regexes, every one must match the output), optionally
# ABSENT_REGEX (a list of regexes, none may match it).

# Runs COMMAND; sets `result` (the exit code, or kwsys's text when it did not exit), `text` (stdout
# and stderr merged in the order written, as ctest would show them) and `elapsed` (whole seconds).
macro(zt_expect_run)
  if(NOT DEFINED TIMEOUT_SECONDS)
    message(FATAL_ERROR "set -DTIMEOUT_SECONDS=<s>: a hang must end with a report, not with ctest's kill")
  endif()
  string(TIMESTAMP zt_started "%s" UTC)
  execute_process(COMMAND ${COMMAND} RESULT_VARIABLE result OUTPUT_VARIABLE text ERROR_VARIABLE text
                  TIMEOUT ${TIMEOUT_SECONDS})
  string(TIMESTAMP zt_ended "%s" UTC)
  math(EXPR elapsed "${zt_ended} - ${zt_started}")
endmacro()

# Whether `result` says the command was stopped after TIMEOUT_SECONDS (or killed by a signal)
# rather than exiting with a code.
macro(zt_expect_hung out_var)
  if(result MATCHES "timeout|Process terminated")
    set(${out_var} TRUE)
  else()
    set(${out_var} FALSE)
  endif()
endmacro()

# Fails naming the first regex of EXPECT_REGEX that the output does not match, or the first of
# ABSENT_REGEX that it does.
macro(zt_expect_output_matches)
  foreach(zt_regex IN LISTS EXPECT_REGEX)
    if(NOT text MATCHES "${zt_regex}")
      message(FATAL_ERROR "output does not match '${zt_regex}' (exit: ${result}):\n${text}")
    endif()
  endforeach()
  foreach(zt_regex IN LISTS ABSENT_REGEX)
    if(text MATCHES "${zt_regex}")
      message(FATAL_ERROR "output matches '${zt_regex}', which it must not (exit: ${result}):\n${text}")
    endif()
  endforeach()
endmacro()
