# The NVMe swap benchmark (include()d from bench/CMakeLists.txt): zt::SwapEngine's sequential write and
# read bandwidth; bench/run_swap_vs_fio.sh compares it with fio on the same file system and settings.
add_executable(zt_bench_swap ${CMAKE_CURRENT_LIST_DIR}/bench_swap.cpp)
set_target_properties(zt_bench_swap PROPERTIES OUTPUT_NAME zt_bench_swap)
target_link_libraries(zt_bench_swap PRIVATE zerotrain zt_base zt_warnings)
