# The checkpoint benchmark (include()d from bench/CMakeLists.txt): Engine::save_checkpoint and
# load_checkpoint bandwidth against plain sequential O_DIRECT writes and reads of the same bytes on
# the same file system, in the same run (docs/benchmarks.md, "Checkpoint write and read bandwidth").
add_executable(zt_bench_checkpoint ${CMAKE_CURRENT_LIST_DIR}/bench_checkpoint.cpp)
set_target_properties(zt_bench_checkpoint PROPERTIES OUTPUT_NAME zt_bench_checkpoint)
target_link_libraries(zt_bench_checkpoint PRIVATE zerotrain zt_warnings)
target_include_directories(zt_bench_checkpoint PRIVATE ${PROJECT_SOURCE_DIR})
