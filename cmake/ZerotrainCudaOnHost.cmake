# The CUDA path built for a machine without a GPU, as a check before the GPU run (docs/gpu.md, "The
# CUDA path on the CPU"). Never a product: nvcc is not used; the .cu files are translated to C++
# (tests/cuda_on_host/translate.py) and their kernels run on the CPU (tests/cuda_on_host/cuda_fibers:
# each block's threads as fibers); the CUDA runtime is tests/cuda_on_host/cuda_fibers.cpp (a device
# whose work runs late, on a thread of its own), cuBLASLt a host implementation of its matmul
# (cublaslt_on_host.cpp), NCCL its functions over MPI (nccl_on_host.cpp). cuDNN stays the real
# library, which refuses without a GPU.
#
# Used two ways:
# - ZT_CUDA_ON_HOST=ON (cmake/ZerotrainCuda.cmake): a tree of its own whose libzerotrain is this
#   build; scripts/cuda-on-host.sh, and with AddressSanitizer ZT_ON_HOST_SANITIZE=1.
# - In the CUDA build with tests (tests/cuda_on_host/CMakeLists.txt): a second libzerotrain.so.0
#   made of the same engine, io, MPI and host-kernel objects and these, in lib/cuda_on_host/; the
#   GPU test programs run against it through LD_LIBRARY_PATH (ctest on_host.*).
find_package(CUDAToolkit REQUIRED)
find_package(Python3 REQUIRED COMPONENTS Interpreter)
find_path(ZT_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_HOME PATH_SUFFIXES include REQUIRED)
set(ZT_CUDA_ON_HOST_TOOLS ${PROJECT_SOURCE_DIR}/tests/cuda_on_host)
# The stand-ins the kernels run on, called for every thread and every element, at -O2 whatever the
# tree's optimization (scripts/cuda-on-host.sh builds its tree at -O1; the last -O given wins).
set(ZT_CUDA_ON_HOST_HOT_OPTIONS -O2)

# The CUDA runtime: the fibers' device.
add_library(zt_cuda_fibers STATIC ${ZT_CUDA_ON_HOST_TOOLS}/cuda_fibers.cpp)
set_target_properties(zt_cuda_fibers PROPERTIES POSITION_INDEPENDENT_CODE ON)
target_include_directories(zt_cuda_fibers PUBLIC ${ZT_CUDA_ON_HOST_TOOLS} SYSTEM PUBLIC ${CUDAToolkit_INCLUDE_DIRS})
target_compile_definitions(zt_cuda_fibers PUBLIC CUDA_FIBERS_KEEP_NAMES)
target_compile_options(zt_cuda_fibers PRIVATE -ffp-contract=off ${ZT_CUDA_ON_HOST_HOT_OPTIONS})

# NCCL: its functions over MPI (one node), as device work on the runtime's streams
# (cuda_fibers_streams.hpp).
add_library(zt_nccl_on_host STATIC ${ZT_CUDA_ON_HOST_TOOLS}/nccl_on_host.cpp)
set_target_properties(zt_nccl_on_host PROPERTIES POSITION_INDEPENDENT_CODE ON)
target_include_directories(zt_nccl_on_host PUBLIC ${ZT_NCCL_INCLUDE_DIR} PRIVATE ${PROJECT_SOURCE_DIR}/include)
target_include_directories(zt_nccl_on_host SYSTEM PUBLIC ${CUDAToolkit_INCLUDE_DIRS})
target_link_libraries(zt_nccl_on_host PUBLIC MPI::MPI_C zt_cuda_fibers)
target_compile_definitions(zt_nccl_on_host PRIVATE OMPI_SKIP_MPICXX MPICH_SKIP_MPICXX)
target_compile_options(zt_nccl_on_host PRIVATE ${ZT_CUDA_ON_HOST_HOT_OPTIONS})

# zt_add_kernels_on_host(TARGET): the object library TARGET holding the CUDA kernels' part that
# differs on the host: every kernels/cuda .cu translated under the build tree (the .cu as
# <file>.cpp, compiled with the device built-ins of cuda_fibers.hpp force-included; the .cuh and
# .hpp beside them, found before the sources'), and the host cuBLASLt in place of the dlopen'ed one
# (kernels/cuda/cublaslt_library.cpp). The rest of kernels/cuda is zt_kernels', as in the CUDA build.
function(zt_add_kernels_on_host target)
  file(GLOB device_files CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/kernels/cuda/*.cu
       ${PROJECT_SOURCE_DIR}/kernels/cuda/*.cuh ${PROJECT_SOURCE_DIR}/kernels/cuda/*.hpp)
  add_library(${target} OBJECT ${ZT_CUDA_ON_HOST_TOOLS}/cublaslt_on_host.cpp)
  target_link_libraries(${target} PRIVATE zt_kernels zt_base zt_cuda_fibers zt_warnings)
  # zt_kernels' own math options (kernels/CMakeLists.txt): the same roundings as the host kernels.
  target_compile_options(${target} PRIVATE -fno-math-errno -fno-trapping-math -ffp-contract=off)
  set_source_files_properties(${ZT_CUDA_ON_HOST_TOOLS}/cublaslt_on_host.cpp PROPERTIES COMPILE_OPTIONS
                              "${ZT_CUDA_ON_HOST_HOT_OPTIONS}")
  set(root ${CMAKE_CURRENT_BINARY_DIR}/${target}_sources)
  foreach(file IN LISTS device_files)
    get_filename_component(name ${file} NAME)
    if(name MATCHES "\\.cu$")
      set(output ${root}/kernels/cuda/${name}.cpp)
      target_sources(${target} PRIVATE ${output})
      set_source_files_properties(${output} PROPERTIES COMPILE_OPTIONS
                                  "-include;${ZT_CUDA_ON_HOST_TOOLS}/cuda_fibers.hpp")
    else()
      set(output ${root}/kernels/cuda/${name})
      target_sources(${target} PRIVATE ${output})
    endif()
    add_custom_command(OUTPUT ${output}
                       COMMAND Python3::Interpreter ${ZT_CUDA_ON_HOST_TOOLS}/translate.py --keep-namespace ${file} ${output}
                       DEPENDS ${file} ${ZT_CUDA_ON_HOST_TOOLS}/translate.py VERBATIM)
  endforeach()
  target_include_directories(${target} BEFORE PRIVATE ${root})
endfunction()
