# Decide whether CUDA is built. AUTO turns it on when the toolkit (nvcc, cudart) and NCCL are found.
# We link cudart and NCCL, never libcuda (the driver): binaries must load on machines without a GPU.
if(NOT DEFINED CUDAToolkit_ROOT AND NOT DEFINED ENV{CUDAToolkit_ROOT} AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CUDAToolkit_ROOT /usr/local/cuda)
endif()
if(NOT CMAKE_CUDA_COMPILER AND CUDAToolkit_ROOT AND EXISTS ${CUDAToolkit_ROOT}/bin/nvcc)
  set(CMAKE_CUDA_COMPILER ${CUDAToolkit_ROOT}/bin/nvcc)
endif()
# The layers compile against CUDA's and NCCL's headers (zt_cuda_headers) and libzerotrain links the
# runtime (zt_cudart) and NCCL (zt_nccl), so that the CUDA-on-host check library can link the same
# layers' objects with its own runtime and NCCL (cmake/ZerotrainCudaOnHost.cmake).
if(ZT_CUDA_ON_HOST)
  include(ZerotrainCudaOnHost)
  add_library(zt_cuda_headers INTERFACE)
  target_include_directories(zt_cuda_headers SYSTEM INTERFACE ${ZT_NCCL_INCLUDE_DIR} ${CUDAToolkit_INCLUDE_DIRS})
  add_library(zt_cudart INTERFACE)
  target_link_libraries(zt_cudart INTERFACE zt_cuda_fibers)
  add_library(zt_nccl INTERFACE)
  target_link_libraries(zt_nccl INTERFACE zt_nccl_on_host)
  set(ZT_HAVE_CUDA ON)
  message(STATUS "zerotrain: CUDA on the host (ZT_CUDA_ON_HOST): kernels translated for the CPU, CUDA ${CUDAToolkit_VERSION} headers")
  return()
endif()
include(CheckLanguage)
check_language(CUDA)
find_package(CUDAToolkit QUIET)
find_library(ZT_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_ROOT}/lib64 ENV NCCL_HOME
             PATH_SUFFIXES lib lib64)
find_path(ZT_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_HOME PATH_SUFFIXES include)

if(CMAKE_CUDA_COMPILER AND CUDAToolkit_FOUND AND ZT_NCCL_LIBRARY AND ZT_NCCL_INCLUDE_DIR)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    # Ampere and Hopper; override with -DCMAKE_CUDA_ARCHITECTURES=... (e.g. 90 for H100/H200 only).
    set(CMAKE_CUDA_ARCHITECTURES 80 90)
  endif()
  enable_language(CUDA)
  # CMake before 3.26 does not know nvcc's C++20 flag (nvcc 12 and later accept -std=c++20).
  if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  add_library(zt_cuda_headers INTERFACE)
  target_include_directories(zt_cuda_headers SYSTEM INTERFACE ${ZT_NCCL_INCLUDE_DIR} ${CUDAToolkit_INCLUDE_DIRS})
  add_library(zt_nccl INTERFACE)
  target_link_libraries(zt_nccl INTERFACE ${ZT_NCCL_LIBRARY})
  add_library(zt_cudart INTERFACE)
  target_link_libraries(zt_cudart INTERFACE CUDA::cudart)
  set(ZT_HAVE_CUDA ON)
  message(STATUS "zerotrain: CUDA ${CUDAToolkit_VERSION} (${CMAKE_CUDA_COMPILER}), NCCL ${ZT_NCCL_LIBRARY}, "
                 "architectures ${CMAKE_CUDA_ARCHITECTURES}")
elseif(ZT_WITH_CUDA STREQUAL "ON")
  message(FATAL_ERROR "ZT_WITH_CUDA=ON but the CUDA toolkit or NCCL was not found "
                      "(nvcc: '${CMAKE_CUDA_COMPILER}', NCCL: '${ZT_NCCL_LIBRARY}'). Set CUDAToolkit_ROOT or NCCL_HOME.")
else()
  message(STATUS "zerotrain: CUDA toolkit or NCCL not found, building host-only")
endif()
