# The CUDA kernel benchmark (include()d from bench/CMakeLists.txt; only with CUDA): every CUDA kernel
# family and the cuBLASLt GEMMs at GPT-2 124M's shapes, bandwidth against a copy kernel and
# cudaMemcpyAsync timed in the same run, GEMM TFLOP/s against the data sheet's peak (docs/gpu.md,
# "What the kernel benchmark prints"). scripts/gpu-bundle.sh packs every zt_bench_cuda_* target and
# scripts/gpu-check.sh runs it; CI only builds it (without a GPU it says "no usable GPU", exit 0).
if(NOT ZT_HAVE_CUDA OR ZT_CUDA_ON_HOST)
  return()
endif()
add_executable(zt_bench_cuda_kernels ${CMAKE_CURRENT_LIST_DIR}/bench_cuda_kernels.cpp
                                     ${CMAKE_CURRENT_LIST_DIR}/cuda_copy_anchor.cu)
target_include_directories(zt_bench_cuda_kernels PRIVATE ${PROJECT_SOURCE_DIR})
# cudart for the timing events and the anchor kernel; it never links libcuda (the driver).
target_link_libraries(zt_bench_cuda_kernels PRIVATE zerotrain CUDA::cudart zt_warnings)
