# zt_add_mpi_test(<name> <target> RANKS <n>... [TIMEOUT s] [ARGS ...] [LABELS ...] [DEFAULT_WATCHDOG]
#                 [ENVIRONMENT VAR=value...])
# One ctest per rank count, named <name>.np<N>, run as `mpiexec -n N <target> ARGS`, in
# ZT_MPI_TEST_ENVIRONMENT (DEFAULT_WATCHDOG: without ZT_COLLECTIVE_TIMEOUT, for the tests of the
# runtime's default timeout); ENVIRONMENT adds variables to it.
# With Open MPI it adds --oversubscribe (more ranks than cores) and allows running as root.
execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version OUTPUT_VARIABLE _zt_mpiexec_version ERROR_QUIET)
set(ZT_MPIEXEC_EXTRA_FLAGS "")
set(ZT_MPIEXEC_IS_OPEN_MPI FALSE)  # tests of Open MPI's mpirun output (--quiet) check it
if(_zt_mpiexec_version MATCHES "Open MPI|OpenRTE")
  set(ZT_MPIEXEC_EXTRA_FLAGS --oversubscribe --allow-run-as-root)
  set(ZT_MPIEXEC_IS_OPEN_MPI TRUE)
endif()
set(ZT_MPIEXEC_EXTRA_FLAGS ${ZT_MPIEXEC_EXTRA_FLAGS} CACHE STRING "Extra flags for mpiexec in tests")

# The collective watchdog's timeout in the MPI jobs of the tests (ZT_COLLECTIVE_TIMEOUT,
# docs/fault-detection.md), so that a hang ends with the watchdog's report (exit 86, naming the
# operation, the communicator and the ranks that did not arrive) before the test's time limit
# (ctest's TIMEOUT, 300 s for most MPI tests) kills the job silently. It must stay above the
# longest legitimate wait of one rank for another in a test: a checkpoint written or checksummed
# while the others wait in the next collective, NVMe swaps, the first step, with 4 ranks on 2
# cores and another test beside them (ctest -j2). No whole MPI test takes more than 20 s on the
# 2-core development machine even under load (the longest, mpi.checkpoint.np4, took 19 s with a
# load average of 8), so 120 s is 6x a whole test's run, let alone one wait; and 300 - 120 s
# leaves time for the report. The heartbeat timeout stays 60 s
# (min(timeout, 60 s)), as with the default 600 s. Tests that need another value set their own
# (the watchdog scenarios of tests/harness); tests that expect a failure within their own limit
# (expect_failure.cmake) do not get it, so that a hang cannot pass for the expected failure.
set(ZT_TEST_COLLECTIVE_TIMEOUT 120)
# The environment of MPI jobs that are expected to succeed; passive OpenMP threads, since ranks
# share the cores.
set(ZT_MPI_TEST_ENVIRONMENT "OMP_WAIT_POLICY=passive;ZT_COLLECTIVE_TIMEOUT=${ZT_TEST_COLLECTIVE_TIMEOUT}")

function(zt_add_mpi_test name target)
    cmake_parse_arguments(ARG "DEFAULT_WATCHDOG" "TIMEOUT" "RANKS;ARGS;LABELS;ENVIRONMENT" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  set(environment "OMPI_MCA_rmaps_base_oversubscribe=1;${ZT_MPI_TEST_ENVIRONMENT}")
  if(ARG_DEFAULT_WATCHDOG)
    set(environment "OMPI_MCA_rmaps_base_oversubscribe=1;OMP_WAIT_POLICY=passive")
  elseif(NOT ARG_TIMEOUT GREATER ZT_TEST_COLLECTIVE_TIMEOUT)
    message(FATAL_ERROR "zt_add_mpi_test(${name}): TIMEOUT ${ARG_TIMEOUT} s must exceed the watchdog's "
                        "ZT_TEST_COLLECTIVE_TIMEOUT (${ZT_TEST_COLLECTIVE_TIMEOUT} s)")
  endif()
    list(APPEND environment ${ARG_ENVIRONMENT})
  foreach(ranks IN LISTS ARG_RANKS)
    add_test(NAME ${name}.np${ranks}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${ranks} ${ZT_MPIEXEC_EXTRA_FLAGS}
                     ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${target}> ${MPIEXEC_POSTFLAGS} ${ARG_ARGS})
    set_tests_properties(${name}.np${ranks} PROPERTIES
      LABELS "mpi;np${ranks};${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT} PROCESSORS ${ranks}
      ENVIRONMENT "${environment}")
  endforeach()
endfunction()
