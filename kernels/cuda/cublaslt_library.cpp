// The lazily loaded cuBLASLt (kernels/cuda/cublaslt_library.hpp says why).
#include "kernels/cuda/cublaslt_library.hpp"

#include <string>

#include "base/never_destroyed.hpp"
#include "kernels/cuda/shared_library.hpp"

namespace zt::kernels::cuda::lt {
namespace {

/// libcublasLt.so.<CUBLAS_VER_MAJOR> (the cuBLAS major version we compiled against), opened on first use.
const SharedLibrary& library() {
  // Never closed: the cuBLASLt handles, never destroyed either, may call into it at exit.
  static base::NeverDestroyed<const SharedLibrary> cublaslt(
      "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR),
      "the CUDA GEMMs (cuBLASLt is loaded when the first GEMM runs on a GPU)");
  return *cublaslt;
}

}  // namespace

// Each forwarder resolves its function once, then calls it (kernels/cuda/shared_library.hpp); a missing
// library or symbol throws zt::CudaError naming it.
#define ZT_CUBLASLT_FUNCTION(name) ZT_SHARED_LIBRARY_FUNCTION(library(), name)

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  ZT_CUBLASLT_FUNCTION(cublasLtCreate);
  return function(handle);
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  ZT_CUBLASLT_FUNCTION(cublasLtDestroy);
  return function(handle);
}
const char* cublasLtGetStatusString(cublasStatus_t status) {
  ZT_CUBLASLT_FUNCTION(cublasLtGetStatusString);
  return function(status);
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* descriptor, cublasComputeType_t compute_type,
                                        cudaDataType_t scale_type) {
  ZT_CUBLASLT_FUNCTION(cublasLtMatmulDescCreate);
  return function(descriptor, compute_type, scale_type);
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t descriptor) {
  ZT_CUBLASLT_FUNCTION(cublasLtMatmulDescDestroy);
  return function(descriptor);
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t descriptor,
                                              cublasLtMatmulDescAttributes_t attribute, const void* buffer,
                                              std::size_t size) {
  ZT_CUBLASLT_FUNCTION(cublasLtMatmulDescSetAttribute);
  return function(descriptor, attribute, buffer, size);
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          std::uint64_t rows, std::uint64_t cols, std::int64_t ld) {
  ZT_CUBLASLT_FUNCTION(cublasLtMatrixLayoutCreate);
  return function(layout, type, rows, cols, ld);
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  ZT_CUBLASLT_FUNCTION(cublasLtMatrixLayoutDestroy);
  return function(layout);
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* preference) {
  ZT_CUBLASLT_FUNCTION(cublasLtMatmulPreferenceCreate);
  return function(preference);
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t preference) {
  ZT_CUBLASLT_FUNCTION(cublasLtMatmulPreferenceDestroy);
  return function(preference);
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t preference,
                                                    cublasLtMatmulPreferenceAttributes_t attribute,
                                                    const void* buffer, std::size_t size) {
  ZT_CUBLASLT_FUNCTION(cublasLtMatmulPreferenceSetAttribute);
  return function(preference, attribute, buffer, size);
}
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t operation,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t preference, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int* returned) {
  ZT_CUBLASLT_FUNCTION(cublasLtMatmulAlgoGetHeuristic);
  return function(handle, operation, a, b, c, d, preference, requested, results, returned);
}
cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t operation, const void* alpha,
                              const void* a, cublasLtMatrixLayout_t a_layout, const void* b,
                              cublasLtMatrixLayout_t b_layout, const void* beta, const void* c,
                              cublasLtMatrixLayout_t c_layout, void* d, cublasLtMatrixLayout_t d_layout,
                              const cublasLtMatmulAlgo_t* algo, void* workspace, std::size_t workspace_bytes,
                              cudaStream_t stream) {
  ZT_CUBLASLT_FUNCTION(cublasLtMatmul);
  return function(handle, operation, alpha, a, a_layout, b, b_layout, beta, c, c_layout, d, d_layout, algo,
                  workspace, workspace_bytes, stream);
}

#undef ZT_CUBLASLT_FUNCTION

}  // namespace zt::kernels::cuda::lt
