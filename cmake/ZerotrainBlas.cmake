# The host GEMMs call CBLAS (cblas_sgemm, cblas_dgemm) of any BLAS. FindBLAS picks the library:
# -DBLA_VENDOR=<vendor> (CMake's FindBLAS names: OpenBLAS, FlexiBLAS, Intel10_64lp_seq, FLAME for
# BLIS, Arm, Generic for netlib, ...) asks for one; without it OpenBLAS is preferred and any other
# BLAS is taken when OpenBLAS is not found. Defines BLAS::BLAS (with libcblas where the BLAS keeps
# CBLAS apart, as netlib does) and ZT_BLAS_HAS_OPENBLAS_SET_NUM_THREADS.
if(NOT DEFINED BLA_VENDOR AND NOT DEFINED ENV{BLA_VENDOR})
  set(BLA_VENDOR OpenBLAS)
  find_package(BLAS QUIET)
  if(NOT BLAS_FOUND)
    message(STATUS "zerotrain: OpenBLAS not found, looking for any BLAS (-DBLA_VENDOR=... picks one)")
    set(BLA_VENDOR All)
  endif()
endif()
find_package(BLAS REQUIRED)

include(CheckFunctionExists)
include(CMakePushCheckState)
cmake_push_check_state(RESET)
set(CMAKE_REQUIRED_QUIET ON)
set(CMAKE_REQUIRED_LIBRARIES ${BLAS_LIBRARIES})
set(CMAKE_REQUIRED_LINK_OPTIONS ${BLAS_LINKER_FLAGS})
check_function_exists(cblas_sgemm ZT_BLAS_HAS_CBLAS)
if(NOT ZT_BLAS_HAS_CBLAS)
  find_library(ZT_CBLAS_LIBRARY cblas)
  if(ZT_CBLAS_LIBRARY)
    list(PREPEND CMAKE_REQUIRED_LIBRARIES ${ZT_CBLAS_LIBRARY})
    check_function_exists(cblas_sgemm ZT_CBLAS_LIBRARY_WORKS)
  endif()
  if(NOT ZT_CBLAS_LIBRARY_WORKS)
    message(FATAL_ERROR "zerotrain needs the CBLAS interface (cblas_sgemm): not in the BLAS found "
                        "(${BLAS_LIBRARIES}) nor in a libcblas. Install a BLAS with CBLAS (Debian: "
                        "libopenblas-dev) or pick one with -DBLA_VENDOR=...")
  endif()
  set_property(TARGET BLAS::BLAS APPEND PROPERTY INTERFACE_LINK_LIBRARIES ${ZT_CBLAS_LIBRARY})
endif()
# OpenBLAS runs its own thread pool unless told otherwise (kernels/host/gemm.cpp).
check_function_exists(openblas_set_num_threads ZT_BLAS_HAS_OPENBLAS_SET_NUM_THREADS)
cmake_pop_check_state()
if(BLAS_LIBRARIES MATCHES "openblas" AND NOT ZT_BLAS_HAS_OPENBLAS_SET_NUM_THREADS)
  message(FATAL_ERROR "the BLAS found is OpenBLAS (${BLAS_LIBRARIES}) but openblas_set_num_threads "
                      "does not link: see CMakeFiles/CMakeError.log")
endif()
if(ZT_BLAS_HAS_OPENBLAS_SET_NUM_THREADS)
  set(zt_blas_threads "OpenBLAS, run single-threaded")
else()
  set(zt_blas_threads "no openblas_set_num_threads: threads as the BLAS decides (docs/spack.md, BLAS)")
endif()
message(STATUS "zerotrain: BLAS ${BLAS_LIBRARIES} ${ZT_CBLAS_LIBRARY} (${zt_blas_threads})")
