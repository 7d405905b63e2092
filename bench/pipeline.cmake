# The pipeline benchmark (include()d from bench/CMakeLists.txt): bubble against the ideal, activation
# memory of 1F1B against GPipe, pipeline x data against ZeRO-2 (docs/benchmarks.md, "Pipeline").
add_executable(zt_bench_pipeline ${CMAKE_CURRENT_LIST_DIR}/bench_pipeline.cpp)
set_target_properties(zt_bench_pipeline PROPERTIES OUTPUT_NAME zt_bench_pipeline)
target_include_directories(zt_bench_pipeline PRIVATE ${PROJECT_SOURCE_DIR})
target_link_libraries(zt_bench_pipeline PRIVATE zerotrain nlohmann_json::nlohmann_json zt_warnings)
