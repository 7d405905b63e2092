// The lazily loaded cuDNN (kernels/cuda/cudnn_library.hpp says why).
// Compiled only with cuDNN's headers (kernels/cuda/cudnn_attention.cpp has stubs without them).
#if __has_include(<cudnn_graph.h>)
#include "kernels/cuda/cudnn_library.hpp"

#include <string>

#include "base/never_destroyed.hpp"
#include "kernels/cuda/shared_library.hpp"

namespace zt::kernels::cuda::dnn {
namespace {

/// libcudnn.so.<CUDNN_MAJOR>: the cuDNN major version we compiled against (cuDNN keeps its API and ABI
/// within a major version). It loads its sub-libraries (libcudnn_graph, libcudnn_engines_*, ...) from
/// its own directory.
const SharedLibrary& library() {
  // Never closed: the cuDNN handles and plans, never destroyed either, live in it.
  static base::NeverDestroyed<const SharedLibrary> cudnn(
      "libcudnn.so." + std::to_string(CUDNN_MAJOR),
      "the cuDNN fused attention (our own attention kernel runs without it)");
  return *cudnn;
}

}  // namespace

bool loaded() {
  return library().loaded();
}
const std::string& load_error() {
  return library().error();
}
const std::string& soname() {
  return library().soname();
}

#define ZT_CUDNN_FUNCTION(name) ZT_SHARED_LIBRARY_FUNCTION(library(), name)

std::size_t cudnnGetVersion() {
  ZT_CUDNN_FUNCTION(cudnnGetVersion);
  return function();
}
const char* cudnnGetErrorString(cudnnStatus_t status) {
  ZT_CUDNN_FUNCTION(cudnnGetErrorString);
  return function(status);
}
void cudnnGetLastErrorString(char* message, std::size_t max_size) {
  // Optional (cuDNN 9.0 and later): resolved without throwing when absent.
  using Function = decltype(&::cudnnGetLastErrorString);
  static const auto function =
      reinterpret_cast<Function>(library().symbol_or_null("cudnnGetLastErrorString"));
  if (max_size > 0) message[0] = '\0';
  if (function != nullptr) function(message, max_size);
}
cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  ZT_CUDNN_FUNCTION(cudnnCreate);
  return function(handle);
}
cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
  ZT_CUDNN_FUNCTION(cudnnDestroy);
  return function(handle);
}
cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
  ZT_CUDNN_FUNCTION(cudnnSetStream);
  return function(handle, stream);
}
cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t type,
                                           cudnnBackendDescriptor_t* descriptor) {
  ZT_CUDNN_FUNCTION(cudnnBackendCreateDescriptor);
  return function(type, descriptor);
}
cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t descriptor) {
  ZT_CUDNN_FUNCTION(cudnnBackendDestroyDescriptor);
  return function(descriptor);
}
cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t descriptor, cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, std::int64_t count,
                                       const void* elements) {
  ZT_CUDNN_FUNCTION(cudnnBackendSetAttribute);
  return function(descriptor, name, type, count, elements);
}
cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t descriptor, cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, std::int64_t requested_count,
                                       std::int64_t* element_count, void* elements) {
  ZT_CUDNN_FUNCTION(cudnnBackendGetAttribute);
  return function(descriptor, name, type, requested_count, element_count, elements);
}
cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t descriptor) {
  ZT_CUDNN_FUNCTION(cudnnBackendFinalize);
  return function(descriptor);
}
cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t plan,
                                  cudnnBackendDescriptor_t variant_pack) {
  ZT_CUDNN_FUNCTION(cudnnBackendExecute);
  return function(handle, plan, variant_pack);
}

#undef ZT_CUDNN_FUNCTION

}  // namespace zt::kernels::cuda::dnn

#endif
