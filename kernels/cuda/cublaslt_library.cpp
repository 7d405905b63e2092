// The lazily loaded cuBLASLt (kernels/cuda/cublaslt_library.hpp says why).
#include "kernels/cuda/cublaslt_library.hpp"

#include <dlfcn.h>

#include <string>

#include "zerotrain/error.hpp"

namespace zt::kernels::cuda::lt {
namespace {

/// The library's soname for the cuBLAS major version we compiled against.
std::string library_name() {
  return "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
}

/// dlopen'ed once, on first use, and never closed (cuBLASLt keeps process-wide state until exit).
void* library() {
  static void* const handle = [] {
    void* opened = dlopen(library_name().c_str(), RTLD_NOW | RTLD_LOCAL);
    if (opened == nullptr) {
      const char* reason = dlerror();
      ZT_THROW_AS(CudaError, "loading ", library_name(),
                  " for the CUDA GEMMs failed: ", reason ? reason : "unknown reason",
                  " (cuBLASLt is loaded when the first GEMM runs on a GPU; put its directory on "
                  "LD_LIBRARY_PATH)");
    }
    return opened;
  }();
  return handle;
}

/// The address of `name` in the library, as a pointer to the type of cublasLt.h's declaration.
template <typename Function>
Function resolve(const char* name) {
  void* symbol = dlsym(library(), name);
  if (symbol == nullptr)
    ZT_THROW_AS(CudaError, library_name(), " has no symbol ", name, ": a cuBLASLt older than CUDA ",
                CUBLAS_VER_MAJOR, "'s?");
  return reinterpret_cast<Function>(symbol);
}

}  // namespace

// Each forwarder resolves its function once (a function-local static), then calls it. decltype of the
// global declaration is unevaluated: it names the type without linking the library.
#define ZT_CUBLASLT_FUNCTION(name) static const auto function = resolve<decltype(&::name)>(#name)

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
