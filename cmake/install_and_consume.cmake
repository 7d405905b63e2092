# The install.* ctests (tests/install/CMakeLists.txt): install this build into a fresh prefix, then
# build outside projects against it as a user would and run them across MPI ranks.
#   -DSTEP=install   -DBUILD_DIR= -DPREFIX=
#       cmake --install BUILD_DIR into PREFIX-staging, then move that tree to PREFIX (both removed
#       first): the consumers use an installed tree that has been moved, as a relocated one is.
#   -DSTEP=cmake     -DPREFIX= -DPROJECT_DIR= -DWORK_DIR= -DLANGUAGES= -DPROGRAM= -DMPIEXEC="mpiexec;-n;2;..."
#       configure PROJECT_DIR with find_package(zerotrain) and CMAKE_PREFIX_PATH=PREFIX, check that
#       the project enabled exactly LANGUAGES (and zerotrain's config file no other), build, run
#       PROGRAM under MPIEXEC.
#   -DSTEP=make      -DPREFIX= -DLIBDIR= -DPROJECT_DIR= -DWORK_DIR= -DMAKE= -DMAKE_ARGS="MPICC=..."
#                    -DPKG_CONFIG= -DPC_MODULE=zerotrain -DPROGRAM= -DMPIEXEC=
#       copy PROJECT_DIR to WORK_DIR, run its Makefile with PKG_CONFIG_PATH=PREFIX/LIBDIR/pkgconfig
#       and MAKE_ARGS, run PROGRAM under MPIEXEC without LD_LIBRARY_PATH (the .pc file's rpath).
#   -DSTEP=errors    -DPREFIX= -DWORK_DIR= [-DWITH_FORTRAN=ON]
#       find_package(zerotrain) where it must fail, each with its reason: a project without C, CXX or
#       Fortran, an unknown component, COMPONENTS Fortran in a project without Fortran; and where it
#       must succeed: a project with CMake 3.0's policies, a project with all three languages and
#       every target used.
# Output of every command goes to stdout, so that the ctest's EXPECT regexes see the programs' lines;
# a command that fails stops the step with its output.
cmake_minimum_required(VERSION 3.24)  # script mode: the policies of the project (IN_LIST)
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "failed (${result}): ${ARGN}\n${out}")
  endif()
  message(STATUS "${out}")
endfunction()

function(require)
  foreach(variable IN LISTS ARGN)
    if(NOT DEFINED ${variable} OR "${${variable}}" STREQUAL "")
      message(FATAL_ERROR "install_and_consume.cmake STEP=${STEP}: set -D${variable}=")
    endif()
  endforeach()
endfunction()

# The languages a configured build tree enabled: CMake writes CMakeFiles/<version>/CMake<LANG>Compiler.cmake
# for each, whoever enabled it (the project, or a package's config file).
function(enabled_languages build_dir out_var)
  file(GLOB compiler_files ${build_dir}/CMakeFiles/*/CMake*Compiler.cmake)
  set(languages "")
  foreach(file IN LISTS compiler_files)
    get_filename_component(name ${file} NAME)
    string(REGEX REPLACE "^CMake(.*)Compiler\\.cmake$" "\\1" language ${name})
    list(APPEND languages ${language})
  endforeach()
  list(SORT languages)
  set(${out_var} "${languages}" PARENT_SCOPE)
endfunction()

require(STEP PREFIX)
if(STEP STREQUAL "install")
  require(BUILD_DIR)
  file(REMOVE_RECURSE ${PREFIX} ${PREFIX}-staging)
  run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${PREFIX}-staging)
  file(RENAME ${PREFIX}-staging ${PREFIX})
  message(STATUS "moved the installed tree from ${PREFIX}-staging to ${PREFIX}")
elseif(STEP STREQUAL "cmake")
  require(PROJECT_DIR WORK_DIR LANGUAGES PROGRAM MPIEXEC)
  if(NOT IS_DIRECTORY ${PREFIX})
    message(FATAL_ERROR "nothing installed in ${PREFIX}: run the ctest install.prefix first")
  endif()
  file(REMOVE_RECURSE ${WORK_DIR})
  run(${CMAKE_COMMAND} -S ${PROJECT_DIR} -B ${WORK_DIR} -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${PREFIX})
  enabled_languages(${WORK_DIR} languages)
  set(expected ${LANGUAGES})
  list(SORT expected)
  if(NOT languages STREQUAL expected)
    message(FATAL_ERROR "${PROJECT_DIR} enabled the languages '${languages}', expected only '${expected}'")
  endif()
  message(STATUS "enabled languages: ${languages}")
  run(${CMAKE_COMMAND} --build ${WORK_DIR})
  run(${MPIEXEC} ${WORK_DIR}/${PROGRAM})
elseif(STEP STREQUAL "make")
  require(LIBDIR PROJECT_DIR WORK_DIR MAKE MAKE_ARGS PKG_CONFIG PC_MODULE PROGRAM MPIEXEC)
  file(REMOVE_RECURSE ${WORK_DIR})
  file(COPY ${PROJECT_DIR}/ DESTINATION ${WORK_DIR})
  set(environment --unset=LD_LIBRARY_PATH PKG_CONFIG_PATH=${PREFIX}/${LIBDIR}/pkgconfig)
  run(${CMAKE_COMMAND} -E env ${environment} ${PKG_CONFIG} --cflags --libs ${PC_MODULE})
  run(${CMAKE_COMMAND} -E env ${environment} ${MAKE} -C ${WORK_DIR} ${MAKE_ARGS})
  run(${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH ${MPIEXEC} ${WORK_DIR}/${PROGRAM})
elseif(STEP STREQUAL "errors")
  require(WORK_DIR)
  file(REMOVE_RECURSE ${WORK_DIR})
  # configure_project(<name> <expect: fail|succeed> <regex> <CMakeLists.txt body>)
  function(configure_project name expect regex body)
    if(NOT body MATCHES "^cmake_minimum_required")
      set(body "cmake_minimum_required(VERSION 3.24)\n${body}")
    endif()
    file(WRITE ${WORK_DIR}/${name}/CMakeLists.txt "${body}\n")
    file(WRITE ${WORK_DIR}/${name}/main.c "int main(void) { return 0; }\n")
    execute_process(COMMAND ${CMAKE_COMMAND} -S ${WORK_DIR}/${name} -B ${WORK_DIR}/${name}/build
                            -DCMAKE_PREFIX_PATH=${PREFIX} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE out)
    string(REGEX REPLACE "[ \n]+" " " flat "${out}")  # CMake wraps the package's message
    if(expect STREQUAL "fail" AND result EQUAL 0)
      message(FATAL_ERROR "${name}: find_package(zerotrain) succeeded; expected it to fail:\n${out}")
    elseif(expect STREQUAL "succeed" AND NOT result EQUAL 0)
      message(FATAL_ERROR "${name}: configuring failed (${result}):\n${out}")
    endif()
    if(NOT flat MATCHES "${regex}")
      message(FATAL_ERROR "${name}: the output does not match '${regex}':\n${out}")
    endif()
    message(STATUS "${name}: ${expect}ed as expected: ${CMAKE_MATCH_0}")
  endfunction()
  configure_project(no_language fail "zerotrain needs one of the languages C, CXX or Fortran enabled [^.]*\\(enabled: NONE\\)"
                    "project(x NONE)\nfind_package(zerotrain REQUIRED)")
  configure_project(unknown_component fail "unknown component 'Python' \\(the components are C, CXX, Fortran\\)"
                    "project(x C)\nfind_package(zerotrain REQUIRED COMPONENTS C Python)")
  set(reason "the project does not enable Fortran")
  if(NOT WITH_FORTRAN)
    set(reason "zerotrain was built without the Fortran module")
  endif()
  configure_project(fortran_component_without_fortran fail "the component Fortran is missing: ${reason}"
                    "project(x C)\nfind_package(zerotrain REQUIRED COMPONENTS Fortran)")
  # The config file runs under the policies of the project that reads it, however old.
  configure_project(old_policies succeed "Generating done"
                    "cmake_minimum_required(VERSION 3.0)\nproject(x C)\nfind_package(zerotrain REQUIRED COMPONENTS C)")
  set(languages "C CXX")
  set(fortran_lines "")
  if(WITH_FORTRAN)
    set(languages "C CXX Fortran")
    set(fortran_lines "target_link_libraries(with_fortran PRIVATE zerotrain::zerotrain_fortran)")
    file(WRITE ${WORK_DIR}/all_languages/main.f90 "program p\n  use zerotrain\nend program p\n")
    set(fortran_lines "add_executable(with_fortran main.f90)\n${fortran_lines}")
  endif()
  configure_project(all_languages succeed "zerotrain::mpi is MPI::MPI_C"
                    "project(x ${languages})\nfind_package(zerotrain REQUIRED COMPONENTS ${languages})
add_executable(with_c main.c)\ntarget_link_libraries(with_c PRIVATE zerotrain::zerotrain)\n${fortran_lines}
get_target_property(mpi zerotrain::mpi INTERFACE_LINK_LIBRARIES)\nmessage(STATUS \"zerotrain::mpi is \${mpi}\")")
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/all_languages/build)
else()
  message(FATAL_ERROR "install_and_consume.cmake: STEP=${STEP}; expected install, cmake, make or errors")
endif()
