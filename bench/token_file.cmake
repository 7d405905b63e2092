# The cost of checking a token file at open (include()d from bench/CMakeLists.txt): open() with and
# without the recorded token range, and with the CRC32C check `zerotrain train` does, against a
# plain read of the file (docs/benchmarks.md, "Token files").
add_executable(zt_bench_token_file ${CMAKE_CURRENT_LIST_DIR}/bench_token_file.cpp)
set_target_properties(zt_bench_token_file PROPERTIES OUTPUT_NAME zt_bench_token_file)
target_link_libraries(zt_bench_token_file PRIVATE zerotrain zt_warnings)
