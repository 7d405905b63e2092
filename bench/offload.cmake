# The optimizer offload benchmark (include()d from bench/CMakeLists.txt): the optimizer step with
# offload_optimizer "cpu" and "nvme" against in memory, at the GPT shapes (docs/offload.md).
add_executable(zt_bench_offload ${CMAKE_CURRENT_LIST_DIR}/bench_offload.cpp)
set_target_properties(zt_bench_offload PROPERTIES OUTPUT_NAME zt_bench_offload)
target_include_directories(zt_bench_offload PRIVATE ${PROJECT_SOURCE_DIR})
target_link_libraries(zt_bench_offload PRIVATE zerotrain zt_warnings)

# The parameter offload benchmark: a ZeRO-3 training step with offload_param "nvme" against the
# parameters in memory, at the GPT shapes (docs/offload.md, "Parameters on NVMe").
add_executable(zt_bench_param_offload ${CMAKE_CURRENT_LIST_DIR}/bench_param_offload.cpp)
set_target_properties(zt_bench_param_offload PROPERTIES OUTPUT_NAME zt_bench_param_offload)
target_include_directories(zt_bench_param_offload PRIVATE ${PROJECT_SOURCE_DIR})
target_link_libraries(zt_bench_param_offload PRIVATE zerotrain zt_warnings)
