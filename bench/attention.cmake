# The host attention kernel against the square GEMMs of the attention it replaced, in the same run
# (include()d from bench/CMakeLists.txt; docs/benchmarks.md, "Attention: log-sum-exps").
add_executable(zt_bench_attention ${CMAKE_CURRENT_LIST_DIR}/bench_attention.cpp)
target_include_directories(zt_bench_attention PRIVATE ${PROJECT_SOURCE_DIR})
target_link_libraries(zt_bench_attention PRIVATE zerotrain OpenMP::OpenMP_CXX zt_warnings)
