# zt_add_mpi_test(<name> <target> RANKS <n>... [TIMEOUT s] [ARGS ...] [LABELS ...])
# One ctest per rank count, named <name>.np<N>, run as `mpiexec -n N <target> ARGS`.
# With Open MPI it adds --oversubscribe (more ranks than cores) and allows running as root.
execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version OUTPUT_VARIABLE _zt_mpiexec_version ERROR_QUIET)
set(ZT_MPIEXEC_EXTRA_FLAGS "")
if(_zt_mpiexec_version MATCHES "Open MPI|OpenRTE")
  set(ZT_MPIEXEC_EXTRA_FLAGS --oversubscribe --allow-run-as-root)
endif()
set(ZT_MPIEXEC_EXTRA_FLAGS ${ZT_MPIEXEC_EXTRA_FLAGS} CACHE STRING "Extra flags for mpiexec in tests")

function(zt_add_mpi_test name target)
  cmake_parse_arguments(ARG "" "TIMEOUT" "RANKS;ARGS;LABELS" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  foreach(ranks IN LISTS ARG_RANKS)
    add_test(NAME ${name}.np${ranks}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${ranks} ${ZT_MPIEXEC_EXTRA_FLAGS}
                     ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${target}> ${MPIEXEC_POSTFLAGS} ${ARG_ARGS})
    set_tests_properties(${name}.np${ranks} PROPERTIES
      LABELS "mpi;np${ranks};${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT} PROCESSORS ${ranks}
      ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1;OMP_WAIT_POLICY=passive")
  endforeach()
endfunction()
