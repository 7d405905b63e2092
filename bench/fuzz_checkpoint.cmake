# zt_fuzz_checkpoint_reader: a libFuzzer target for the checkpoint reader (bench/fuzz/). It needs
# clang with libFuzzer, while the project may be built with GCC, so the reader's sources
# (io/hdf5_file.cpp, the checkpoint tools and validation) are compiled here by clang with coverage
# instrumentation and ASan/UBSan, and linked with the fuzz harness against libzerotrain for the
# rest. Built only by `cmake --build build --target zt_fuzz_checkpoint_reader` where a clang++ is
# found; never in the default build or in CI. Run it for a bounded time:
#   cmake --build build --target zt_fuzz_checkpoint_reader_run     (ZT_FUZZ_SECONDS, default 60)
find_program(ZT_FUZZ_CLANGXX NAMES clang++ clang++-16 clang++-15 clang++-14)
if(NOT ZT_FUZZ_CLANGXX)
  message(STATUS "fuzz targets: no clang++ found; zt_fuzz_checkpoint_reader is not defined")
  return()
endif()
set(ZT_FUZZ_SECONDS 60 CACHE STRING "How long zt_fuzz_checkpoint_reader_run fuzzes (seconds)")
set(zt_fuzz_binary ${CMAKE_BINARY_DIR}/bin/zt_fuzz_checkpoint_reader)
set(zt_fuzz_sources ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/checkpoint_reader_fuzz.cpp ${PROJECT_SOURCE_DIR}/io/hdf5_file.cpp
                    ${PROJECT_SOURCE_DIR}/src/engine/checkpoint_tools.cpp
                    ${PROJECT_SOURCE_DIR}/src/engine/checkpoint_validation.cpp)
set(zt_fuzz_includes -I${PROJECT_SOURCE_DIR} -I${PROJECT_SOURCE_DIR}/include -I${PROJECT_BINARY_DIR}/include)
get_target_property(zt_fuzz_json_includes nlohmann_json::nlohmann_json INTERFACE_INCLUDE_DIRECTORIES)
foreach(dir IN LISTS HDF5_INCLUDE_DIRS MPI_C_INCLUDE_DIRS zt_fuzz_json_includes)
  if(NOT dir STREQUAL "/usr/include")  # a system directory named again breaks #include_next
    list(APPEND zt_fuzz_includes -isystem ${dir})
  endif()
endforeach()
add_custom_command(
  OUTPUT ${zt_fuzz_binary}
  COMMAND ${ZT_FUZZ_CLANGXX} -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined ${zt_fuzz_includes}
          ${zt_fuzz_sources} -o ${zt_fuzz_binary} $<TARGET_FILE:zerotrain> ${HDF5_C_LIBRARIES} ${MPI_C_LIBRARIES}
          -Wl,-rpath,$<TARGET_FILE_DIR:zerotrain>
  DEPENDS ${zt_fuzz_sources} zerotrain
  COMMENT "clang++ -fsanitize=fuzzer: zt_fuzz_checkpoint_reader"
  COMMAND_EXPAND_LISTS VERBATIM)
add_custom_target(zt_fuzz_checkpoint_reader DEPENDS ${zt_fuzz_binary})
# The seed corpus: real checkpoints, made on one process by the ctest fixture's maker.
set(zt_fuzz_corpus ${CMAKE_BINARY_DIR}/fuzz-checkpoint-corpus)
add_custom_target(zt_fuzz_checkpoint_reader_run
  COMMAND ${CMAKE_COMMAND} -E make_directory ${zt_fuzz_corpus}
  COMMAND sh -c "ls ${zt_fuzz_corpus}/*.h5 >/dev/null 2>&1 || (cd ${zt_fuzz_corpus} && $<TARGET_FILE:zerotrain_cli> train --config ${PROJECT_SOURCE_DIR}/examples/configs/gpt-tiny.json --steps 1 --save-dir seed >/dev/null && cp seed/*.h5 . && rm -rf seed)"
  COMMAND ${zt_fuzz_binary} -max_total_time=${ZT_FUZZ_SECONDS} -rss_limit_mb=4096 -timeout=20 ${zt_fuzz_corpus}
  DEPENDS zt_fuzz_checkpoint_reader zerotrain_cli
  WORKING_DIRECTORY ${CMAKE_BINARY_DIR}
  USES_TERMINAL VERBATIM)
