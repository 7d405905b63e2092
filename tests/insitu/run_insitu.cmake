# ctest examples.insitu.np4 (docs/insitu.md): the in-situ example on 4 ranks, 2 of them the
# simulation that trains, 2 doing their own reductions, each run with the world_guard shim.
#   -DPROGRAM= -DPRELOAD="-x;LD_PRELOAD=<world_guard.so>" -DMPIEXEC="mpiexec;-n;4;..."
#   -DWORK_DIR= -DZERO_STAGE= [-DRUN_SECONDS=120] [-DLIBRARY=<libzerotrain.so> -DNM= -DGUARD_SOURCE=<world_guard.c>]
# 1. An uninterrupted run of 200 solver steps, training every 10: the loss must fall tenfold, and
#    the guard must see zerotrain's MPI calls on the simulation ranks, none on MPI_COMM_WORLD, and
#    no library MPI call at all on the other ranks.
# 2. A run of 120 steps with checkpoints, then a second run with --resume to 200: it must resume at
#    step 120 and give the uninterrupted run's losses for steps 130-200, digit for digit.
cmake_minimum_required(VERSION 3.24)  # script mode: the policies of the project (IN_LIST)
if(NOT DEFINED RUN_SECONDS)
  set(RUN_SECONDS 120)
endif()
foreach(variable PROGRAM PRELOAD MPIEXEC WORK_DIR ZERO_STAGE)
  if(NOT DEFINED ${variable})
    message(FATAL_ERROR "run_insitu.cmake: set -D${variable}=")
  endif()
endforeach()
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

# 0. The guard wraps every MPI function libzerotrain imports, except the ones listed here that
#    do not communicate nor change a communicator (local queries, datatypes, ops, requests, MPI's
#    own start and end, and MPI_Abort, which may name MPI_COMM_WORLD to end the job on an error).
#    A new import of the library fails this until it is wrapped in world_guard.c or listed here.
if(DEFINED LIBRARY)
  set(local_functions MPI_Abort MPI_Cancel MPI_Comm_compare MPI_Comm_create_keyval MPI_Comm_f2c MPI_Comm_free
      MPI_Comm_free_keyval MPI_Comm_get_attr MPI_Comm_group MPI_Comm_rank MPI_Comm_size MPI_Comm_test_inter
      MPI_Error_string MPI_Finalized MPI_Get_count MPI_Get_library_version MPI_Get_processor_name MPI_Get_version
      MPI_Group_free MPI_Group_size MPI_Group_translate_ranks MPI_Init MPI_Init_thread MPI_Initialized
      MPI_Op_create MPI_Op_free MPI_Query_thread MPI_Reduce_local MPI_Request_free MPI_Test MPI_Type_commit
      MPI_Type_contiguous
            MPI_Type_free MPI_Type_set_name MPI_Wait
      # The tool interface (`zerotrain report` reads Open MPI's control variables): no communicator.
      MPI_T_cvar_get_info MPI_T_cvar_get_num MPI_T_cvar_handle_alloc MPI_T_cvar_handle_free MPI_T_cvar_read
      MPI_T_finalize MPI_T_init_thread)
  execute_process(COMMAND ${NM} -D --undefined-only ${LIBRARY} RESULT_VARIABLE result OUTPUT_VARIABLE symbols
                  ERROR_VARIABLE symbols)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "${NM} -D --undefined-only ${LIBRARY} failed (${result}): ${symbols}")
  endif()
  string(REGEX MATCHALL " U MPI_[A-Za-z0-9_]+" imported "${symbols}")
  string(REPLACE " U " "" imported "${imported}")
  file(STRINGS ${GUARD_SOURCE} wrapped_lines REGEX "^int MPI_[A-Za-z0-9_]+\\(")
  string(REGEX MATCHALL "MPI_[A-Za-z0-9_]+\\(" wrapped "${wrapped_lines}")
  string(REPLACE "(" "" wrapped "${wrapped}")
  set(unguarded "")
  foreach(function IN LISTS imported)
    if(NOT function IN_LIST wrapped AND NOT function IN_LIST local_functions)
      list(APPEND unguarded ${function})
    endif()
  endforeach()
  if(unguarded)
    message(FATAL_ERROR "libzerotrain imports ${unguarded}, which ${GUARD_SOURCE} does not wrap: wrap it there "
                        "(or, if it neither communicates nor changes a communicator, list it in local_functions)")
  endif()
  list(LENGTH wrapped wrapped_count)
  message(STATUS "world_guard wraps ${wrapped_count} MPI functions: every one libzerotrain imports that communicates")
endif()

# Runs the example with `arguments`; sets <name>_output. Fails on a non-zero exit or a hang.
function(run_example name)
  set(command ${MPIEXEC} ${PRELOAD} ${PROGRAM} --train-every 10 --zero-stage ${ZERO_STAGE} ${ARGN})
  string(REPLACE ";" " " shown "${command}")
  message(STATUS "run '${name}': ${shown}")
  execute_process(COMMAND ${command} WORKING_DIRECTORY ${WORK_DIR} RESULT_VARIABLE result OUTPUT_VARIABLE output
                  ERROR_VARIABLE output TIMEOUT ${RUN_SECONDS})
  message(STATUS "${output}")
  if(result MATCHES "timeout")
    message(FATAL_ERROR "run '${name}' hung: stopped after ${RUN_SECONDS} s (no watchdog watches a runtime over a "
                        "sub-communicator)")
  elseif(NOT result EQUAL 0)
    message(FATAL_ERROR "run '${name}' failed (exit: ${result})")
  endif()
  set(${name}_output "${output}" PARENT_SCOPE)
endfunction()

# The "solver step N loss L" lines of `output`: sets <prefix>_steps (N, in order) and <prefix>_<N> = L.
function(parse_losses output prefix)
  string(REGEX MATCHALL "insitu: solver step [0-9]+ loss [^\n]+" lines "${output}")
  set(steps "")
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "insitu: solver step ([0-9]+) loss ([^\n]+)" "\\1;\\2" pair "${line}")
    list(GET pair 0 step)
    list(GET pair 1 loss)
    list(APPEND steps ${step})
    set(${prefix}_${step} "${loss}" PARENT_SCOPE)
  endforeach()
  set(${prefix}_steps "${steps}" PARENT_SCOPE)
endfunction()

function(check_guard output)
  foreach(rank 0 1)
    if(NOT output MATCHES "world_guard: rank ${rank}: [1-9][0-9]* MPI calls from libraries \\([^)]*libzerotrain[^)]*\\), 0 on MPI_COMM_WORLD")
      message(FATAL_ERROR "simulation rank ${rank}: the guard did not report zerotrain's MPI calls with none on "
                          "MPI_COMM_WORLD (or was not loaded)")
    endif()
  endforeach()
  foreach(rank 2 3)
    if(NOT output MATCHES "world_guard: rank ${rank}: 0 MPI calls from libraries \\(\\), 0 on MPI_COMM_WORLD")
      message(FATAL_ERROR "analysis rank ${rank}: a library made MPI calls on a rank that runs no zerotrain")
    endif()
  endforeach()
  if(output MATCHES "called MPI_[A-Za-z_]+ on MPI_COMM_WORLD")
    message(FATAL_ERROR "a library used MPI_COMM_WORLD: ${CMAKE_MATCH_0}")
  endif()
endfunction()

# 1. Uninterrupted.
run_example(uninterrupted --steps 200 --checkpoint-dir uninterrupted)
check_guard("${uninterrupted_output}")
if(NOT uninterrupted_output MATCHES "insitu: analysis on 2 other ranks: pi ~ 3\\.1[0-9]* [^\n]*step 200")
  message(FATAL_ERROR "the analysis ranks did not report pi and the simulation's summary")
endif()
parse_losses("${uninterrupted_output}" full)
list(LENGTH full_steps trainings)
if(NOT trainings EQUAL 20)
  message(FATAL_ERROR "expected 20 trainings (steps 10, 20, ..., 200), got ${trainings}: ${full_steps}")
endif()
set(first_loss ${full_10})
set(last_loss ${full_200})
# Tenfold: 10 * last < first, with 10 * last written as last's mantissa and exponent + 1 (the
# example prints %.9e; CMake compares floating-point numbers but has no floating-point arithmetic).
if(NOT last_loss MATCHES "^([0-9.]+)e([-+][0-9]+)$")
  message(FATAL_ERROR "the last loss '${last_loss}' is not a number in %e form")
endif()
math(EXPR exponent "${CMAKE_MATCH_2} + 1")
if(NOT "${CMAKE_MATCH_1}e${exponent}" LESS first_loss)
  message(FATAL_ERROR "the loss did not fall tenfold: step 10 ${first_loss}, step 200 ${last_loss}")
endif()

# 2. Interrupted at 120, resumed to 200.
run_example(first_part --steps 120 --checkpoint-dir resumed)
check_guard("${first_part_output}")
run_example(second_part --steps 200 --checkpoint-dir resumed --resume)
check_guard("${second_part_output}")
if(NOT second_part_output MATCHES "insitu: resumed from resumed at solver step 120 \\(optimizer step 120\\)")
  message(FATAL_ERROR "the second run did not resume at step 120")
endif()
parse_losses("${second_part_output}" resumed)
if(NOT resumed_steps STREQUAL "130;140;150;160;170;180;190;200")
  message(FATAL_ERROR "the resumed run trained at steps '${resumed_steps}', expected 130, 140, ..., 200")
endif()
foreach(step IN LISTS resumed_steps)
  if(NOT resumed_${step} STREQUAL full_${step})
    message(FATAL_ERROR "step ${step}: the resumed run's loss ${resumed_${step}} differs from the uninterrupted "
                        "run's ${full_${step}}")
  endif()
endforeach()
message(STATUS "insitu test: loss fell from ${first_loss} (step 10) to ${last_loss} (step 200); resumed at step 120, "
               "the losses of steps 130-200 equal the uninterrupted run's")
