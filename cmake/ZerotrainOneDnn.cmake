# oneDNN (optional): the host bf16 GEMMs run as oneDNN matmul primitives (bf16 inputs, fp32
# accumulation) on CPUs with native bf16 dot products (kernels/host/gemm.cpp, docs/architecture.md,
# "Host bf16 GEMMs"). CBLAS has no such call: Debian 12's OpenBLAS 0.3.21 is built without
# cblas_sbgemm, and where OpenBLAS has it, it ran slower than its sgemm on an avx512_bf16 CPU without AMX.
# ZT_WITH_ONEDNN=AUTO uses oneDNN when found (Debian: libdnnl-dev; Spack: +onednn), ON requires it,
# OFF keeps the fp32-widening GEMM only. oneDNN must thread with OpenMP, as the host kernels do: a
# TBB- or threadpool-runtime oneDNN would run a second pool of threads on the same cores. Sets
# ZT_HAVE_ONEDNN and the target zt_onednn.
set(ZT_HAVE_ONEDNN OFF)
if(NOT ZT_WITH_ONEDNN STREQUAL "OFF")
  set(zt_onednn_missing "")
  # A oneDNN built with the OpenCL GPU runtime (Debian 12's) calls find_package(OpenCL REQUIRED) in its
  # config file, which stops the configure when the OpenCL headers are missing (ocl-icd-opencl-dev is
  # only Recommended by libdnnl-dev): look first, so a machine without them builds without oneDNN.
  find_file(ZT_DNNL_CONFIG_FILE NAMES dnnl-config.cmake
            PATH_SUFFIXES lib/${CMAKE_LIBRARY_ARCHITECTURE}/cmake/dnnl lib/cmake/dnnl lib64/cmake/dnnl)
  if(ZT_DNNL_CONFIG_FILE)
    file(STRINGS "${ZT_DNNL_CONFIG_FILE}" zt_dnnl_gpu_runtime REGEX "set\\(DNNL_GPU_RUNTIME \"OCL\"\\)")
    if(zt_dnnl_gpu_runtime)
      find_package(OpenCL QUIET)
      if(NOT OpenCL_FOUND)
        set(zt_onednn_missing
            "oneDNN at ${ZT_DNNL_CONFIG_FILE} needs OpenCL, not found (Debian: ocl-icd-opencl-dev)")
      endif()
    endif()
  endif()
  if(zt_onednn_missing STREQUAL "")
    find_package(dnnl CONFIG QUIET)
  endif()
  if(NOT zt_onednn_missing STREQUAL "")
    # the OpenCL the oneDNN config needs is missing: reported below
  elseif(NOT dnnl_FOUND)
    set(zt_onednn_missing "oneDNN (dnnl) not found")
  elseif(NOT DNNL_CPU_RUNTIME STREQUAL "OMP")
    set(zt_onednn_missing "oneDNN at ${dnnl_DIR} threads with ${DNNL_CPU_RUNTIME}, not OpenMP")
  else()
    # Link it, do not assume: a program that builds a bf16 memory descriptor must compile and link.
    include(CheckCXXSourceCompiles)
    set(CMAKE_REQUIRED_LIBRARIES DNNL::dnnl)
    check_cxx_source_compiles([=[
#include <oneapi/dnnl/dnnl.hpp>
int main() {
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  const dnnl::memory::desc a({2, 3}, dnnl::memory::data_type::bf16, dnnl::memory::dims{3, 1});
  return engine.get_kind() == dnnl::engine::kind::cpu && a.get_size() != 0 ? 0 : 1;
}
]=] ZT_ONEDNN_LINKS)
    unset(CMAKE_REQUIRED_LIBRARIES)
    if(NOT ZT_ONEDNN_LINKS)
      set(zt_onednn_missing "oneDNN at ${dnnl_DIR} does not link a bf16 matmul program (CMakeError.log)")
    endif()
  endif()
  if(zt_onednn_missing STREQUAL "")
    set(ZT_HAVE_ONEDNN ON)
    add_library(zt_onednn INTERFACE)
    target_link_libraries(zt_onednn INTERFACE DNNL::dnnl)
    message(STATUS "zerotrain: oneDNN ${dnnl_VERSION} (${dnnl_DIR}): bf16 host GEMMs (ZT_BF16_GEMM)")
  elseif(ZT_WITH_ONEDNN STREQUAL "ON")
    message(FATAL_ERROR "ZT_WITH_ONEDNN=ON but ${zt_onednn_missing} (Debian: libdnnl-dev; or -Ddnnl_DIR=...)")
  else()
    message(STATUS "zerotrain: bf16 host GEMMs widen to fp32: ${zt_onednn_missing}")
  endif()
endif()
