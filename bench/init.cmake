# Model initialization (include()d from bench/CMakeLists.txt): fill_normal against its definition, the
# per-element libm Box-Muller loop it replaced, in the same run (docs/benchmarks.md, "Startup").
add_executable(zt_bench_fill_normal ${CMAKE_CURRENT_LIST_DIR}/bench_fill_normal.cpp)
target_include_directories(zt_bench_fill_normal PRIVATE ${PROJECT_SOURCE_DIR})
target_link_libraries(zt_bench_fill_normal PRIVATE zerotrain OpenMP::OpenMP_CXX zt_warnings)
