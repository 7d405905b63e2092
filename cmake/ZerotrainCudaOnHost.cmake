# ZT_CUDA_ON_HOST=ON: the CUDA path built for a machine without a GPU, as a check before the GPU run
# (docs/gpu.md, "The CUDA path on the CPU"). Never a product: nvcc is not used; the .cu files are
# translated to C++ (tests/cuda_on_host/translate.py) and their kernels run on the CPU
# (tests/cuda_on_host/cuda_fibers: each block's threads as fibers), and the CUDA runtime the library
# links is tests/cuda_on_host/cuda_fibers.cpp (a device whose work runs late, on a thread of its
# own), cuBLASLt a host implementation of its matmul (cublaslt_on_host.cpp), NCCL its functions over
# MPI (nccl_on_host.cpp). cuDNN stays the real library, which refuses without a GPU.
# Configure a separate tree: cmake -S . -B build-on-host -DZT_CUDA_ON_HOST=ON (scripts/cuda-on-host.sh).
find_package(CUDAToolkit REQUIRED)
find_package(Python3 REQUIRED COMPONENTS Interpreter)
find_path(ZT_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_HOME PATH_SUFFIXES include REQUIRED)
set(ZT_CUDA_ON_HOST_TOOLS ${PROJECT_SOURCE_DIR}/tests/cuda_on_host)
# NCCL: tests/cuda_on_host/nccl_on_host.cpp, NCCL's functions over MPI (one node).
add_library(zt_nccl_on_host STATIC ${ZT_CUDA_ON_HOST_TOOLS}/nccl_on_host.cpp)
set_target_properties(zt_nccl_on_host PROPERTIES POSITION_INDEPENDENT_CODE ON)
target_include_directories(zt_nccl_on_host PUBLIC ${ZT_NCCL_INCLUDE_DIR} PRIVATE ${PROJECT_SOURCE_DIR}/include)
target_include_directories(zt_nccl_on_host SYSTEM PUBLIC ${CUDAToolkit_INCLUDE_DIRS})
# Its operations are device work on the runtime's streams (cuda_fibers_streams.hpp).
target_link_libraries(zt_nccl_on_host PUBLIC MPI::MPI_C zt_cudart)
target_compile_definitions(zt_nccl_on_host PRIVATE OMPI_SKIP_MPICXX MPICH_SKIP_MPICXX)
add_library(zt_nccl INTERFACE)
target_link_libraries(zt_nccl INTERFACE zt_nccl_on_host)

add_library(zt_cudart STATIC ${ZT_CUDA_ON_HOST_TOOLS}/cuda_fibers.cpp)
set_target_properties(zt_cudart PROPERTIES POSITION_INDEPENDENT_CODE ON)
target_include_directories(zt_cudart PUBLIC ${ZT_CUDA_ON_HOST_TOOLS} SYSTEM PUBLIC ${CUDAToolkit_INCLUDE_DIRS})
target_compile_definitions(zt_cudart PUBLIC CUDA_FIBERS_KEEP_NAMES)
target_compile_options(zt_cudart PRIVATE -ffp-contract=off)
# scripts/cuda-on-host.sh builds this tree at -O1, for build time (the engine's code is not where its
# tests spend theirs); the stand-ins the kernels run on, called for every thread and every element,
# keep -O2 (the last -O given wins).
set(ZT_CUDA_ON_HOST_HOT_OPTIONS -O2)
target_compile_options(zt_cudart PRIVATE ${ZT_CUDA_ON_HOST_HOT_OPTIONS})
target_compile_options(zt_nccl_on_host PRIVATE ${ZT_CUDA_ON_HOST_HOT_OPTIONS})

# zt_cuda_on_host_translate(TARGET FILE...): each kernels/cuda FILE translated under the build tree
# (kernels/cuda/<file>, a .cu as <file>.cpp), the .cu ones compiled into TARGET with the device
# built-ins (cuda_fibers.hpp) force-included, and the translated headers found before the sources'.
function(zt_cuda_on_host_translate target)
  set(root ${CMAKE_BINARY_DIR}/cuda_on_host_sources)
  foreach(file IN LISTS ARGN)
    get_filename_component(name ${file} NAME)
    if(name MATCHES "\\.cu$")
      set(output ${root}/kernels/cuda/${name}.cpp)
      target_sources(${target} PRIVATE ${output})
      set_source_files_properties(${output} PROPERTIES COMPILE_OPTIONS
                                  "-include;${ZT_CUDA_ON_HOST_TOOLS}/cuda_fibers.hpp;-ffp-contract=off")
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

set(ZT_HAVE_CUDA ON)
message(STATUS "zerotrain: CUDA on the host (ZT_CUDA_ON_HOST): kernels translated for the CPU, CUDA ${CUDAToolkit_VERSION} headers")
