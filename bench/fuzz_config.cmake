# libFuzzer target for the config parser (include()d from bench/CMakeLists.txt; docs/testing.md,
# "Fuzzing"). Built only on request (`cmake --build build --target zt_fuzz_config`), never in CI,
# and only where clang++ links -fsanitize=fuzzer: the parser's sources (src/config) are compiled
# with clang, libFuzzer and AddressSanitizer into the target, which takes everything else from the
# project's libzerotrain (whatever compiler built it; the target's own definitions take precedence).
find_program(ZT_FUZZ_CLANGXX NAMES clang++ clang++-18 clang++-17 clang++-16 clang++-15 clang++-14)
if(ZT_FUZZ_CLANGXX)
  execute_process(COMMAND ${CMAKE_COMMAND} -E echo "extern \"C\" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }"
                  OUTPUT_FILE ${CMAKE_CURRENT_BINARY_DIR}/fuzz_probe.cpp)
  execute_process(COMMAND ${ZT_FUZZ_CLANGXX} -fsanitize=fuzzer ${CMAKE_CURRENT_BINARY_DIR}/fuzz_probe.cpp
                          -o ${CMAKE_CURRENT_BINARY_DIR}/fuzz_probe
                  RESULT_VARIABLE zt_fuzz_probe_result OUTPUT_QUIET ERROR_QUIET)
endif()
if(ZT_FUZZ_CLANGXX AND zt_fuzz_probe_result EQUAL 0)
  set(zt_fuzz_config_sources ${PROJECT_SOURCE_DIR}/bench/fuzz/config_fuzz.cpp
      ${PROJECT_SOURCE_DIR}/src/config/config.cpp ${PROJECT_SOURCE_DIR}/src/config/config_json.cpp
      ${PROJECT_SOURCE_DIR}/src/config/json_reader.cpp)
  add_custom_command(
    OUTPUT ${CMAKE_BINARY_DIR}/bin/zt_fuzz_config
    COMMAND ${ZT_FUZZ_CLANGXX} -std=c++20 -g -O1 -fsanitize=fuzzer,address -I${PROJECT_SOURCE_DIR}
            -I${PROJECT_SOURCE_DIR}/include -I${CMAKE_BINARY_DIR}/generated ${zt_fuzz_config_sources}
            $<TARGET_LINKER_FILE:zerotrain> -Wl,-rpath,$<TARGET_FILE_DIR:zerotrain>
            -o ${CMAKE_BINARY_DIR}/bin/zt_fuzz_config
    DEPENDS ${zt_fuzz_config_sources} zerotrain
    COMMENT "zt_fuzz_config: the config parser under libFuzzer and AddressSanitizer (${ZT_FUZZ_CLANGXX})"
    VERBATIM)
  add_custom_target(zt_fuzz_config DEPENDS ${CMAKE_BINARY_DIR}/bin/zt_fuzz_config)
else()
  message(STATUS "zt_fuzz_config: not available (no clang++ that links -fsanitize=fuzzer)")
endif()
