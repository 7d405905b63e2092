# The GPT step benchmark (include()d from bench/CMakeLists.txt): one process, forward + backward +
# AdamW through zt::Engine; bench/run_gpt_vs_pytorch.sh compares it with PyTorch in the same run.
add_executable(zt_bench_gpt_step ${CMAKE_CURRENT_LIST_DIR}/bench_gpt_step.cpp)
set_target_properties(zt_bench_gpt_step PROPERTIES OUTPUT_NAME zt_bench_gpt_step)
target_include_directories(zt_bench_gpt_step PRIVATE ${PROJECT_SOURCE_DIR})
target_link_libraries(zt_bench_gpt_step PRIVATE zerotrain nlohmann_json::nlohmann_json zt_warnings)
