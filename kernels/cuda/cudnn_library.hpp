// cuDNN, loaded when the fused attention first needs it (dlopen, kernels/cuda/shared_library.hpp), not
// linked: like cuBLASLt (kernels/cuda/cublaslt_library.hpp) it would cost every process that loads
// libzerotrain its start-up memory, host-only jobs included, and a machine without libcudnn must still
// run our own attention kernel. These forwarders have cudnn_graph.h's names and signatures, in
// namespace dnn; the first call loads libcudnn.so.<CUDNN_MAJOR>. Check loaded() first: a forwarder
// throws zt::CudaError when the library is missing (kernels/cuda/cudnn_attention.cpp never lets it).
#pragma once

#include <cudnn_graph.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace zt::kernels::cuda::dnn {

/// Whether libcudnn.so.<CUDNN_MAJOR> opened (tried once, on the first call; never throws).
bool loaded();
/// Why it did not open (empty when it did): the soname, dlerror() and what to put on LD_LIBRARY_PATH.
const std::string& load_error();
/// "libcudnn.so.9".
const std::string& soname();

std::size_t cudnnGetVersion();
const char* cudnnGetErrorString(cudnnStatus_t status);
/// cuDNN's last error message of this thread (empty when the library lacks the function).
void cudnnGetLastErrorString(char* message, std::size_t max_size);
cudnnStatus_t cudnnCreate(cudnnHandle_t* handle);
cudnnStatus_t cudnnDestroy(cudnnHandle_t handle);
cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream);
cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t type,
                                           cudnnBackendDescriptor_t* descriptor);
cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t descriptor);
cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t descriptor, cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, std::int64_t count,
                                       const void* elements);
cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t descriptor, cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, std::int64_t requested_count,
                                       std::int64_t* element_count, void* elements);
cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t descriptor);
cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t plan,
                                  cudnnBackendDescriptor_t variant_pack);

}  // namespace zt::kernels::cuda::dnn
