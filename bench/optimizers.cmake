# The optimizer benchmark (include()d from bench/CMakeLists.txt): host AdamW against a STREAM triad.
add_executable(zt_bench_adamw ${CMAKE_CURRENT_LIST_DIR}/bench_adamw.cpp)
set_target_properties(zt_bench_adamw PROPERTIES OUTPUT_NAME zt_bench_adamw)
target_include_directories(zt_bench_adamw PRIVATE ${PROJECT_SOURCE_DIR})
target_link_libraries(zt_bench_adamw PRIVATE zerotrain OpenMP::OpenMP_CXX zt_warnings)
# The triad loop is the anchor: vectorize it like the kernels (no errno in this loop, but keep parity).
target_compile_options(zt_bench_adamw PRIVATE -fno-math-errno)
# The host kernels with ISA paths, each path side by side (anchor: the baseline path, same rounds).
add_executable(zt_bench_host_isa ${CMAKE_CURRENT_LIST_DIR}/bench_host_isa.cpp)
target_include_directories(zt_bench_host_isa PRIVATE ${PROJECT_SOURCE_DIR})
target_link_libraries(zt_bench_host_isa PRIVATE zerotrain zt_warnings)
