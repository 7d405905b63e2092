// CUDA half of the device layer: device and pinned allocators, streams, copies, status.
#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "kernels/cuda/cuda_common.hpp"
#include "kernels/device_backend.hpp"
#include "zerotrain/error.hpp"

namespace zt::detail {
namespace {

void require_usable(const char* what) {
  const CudaStatus& status = cuda_status();
  if (!status.usable()) ZT_THROW_AS(CudaError, what, ": no usable CUDA device (", status.reason, ")");
}

class CudaDeviceAllocator final : public Allocator {
 public:
  explicit CudaDeviceAllocator(int index) : index_(index) {}
  void* allocate(std::size_t bytes, std::size_t) override {
    require_usable("allocating device memory");
    // cudaMalloc returns 256-byte aligned memory, more than any alignment we ask for.
    int previous = 0;
    ZT_CHECK_CUDA(cudaGetDevice(&previous));
    ZT_CHECK_CUDA(cudaSetDevice(index_));
    void* pointer = nullptr;
    const cudaError_t status = cudaMalloc(&pointer, bytes == 0 ? 1 : bytes);
    cudaSetDevice(previous);
    if (status != cudaSuccess) {
      ZT_THROW_AS(CudaError, "out of device memory on cuda:", index_, ": cudaMalloc(", bytes,
                  " bytes) failed: ", cudaGetErrorString(status));
    }
    return pointer;
  }
  void deallocate(void* pointer, std::size_t) noexcept override { cudaFree(pointer); }
  Device device() const override { return Device::cuda(index_); }

 private:
  int index_;
};

class CudaPinnedAllocator final : public Allocator {
 public:
  void* allocate(std::size_t bytes, std::size_t) override {
    require_usable("allocating pinned host memory");
    void* pointer = nullptr;
    const cudaError_t status = cudaHostAlloc(&pointer, bytes == 0 ? 1 : bytes, cudaHostAllocDefault);
    if (status != cudaSuccess) {
      ZT_THROW_AS(CudaError, "cudaHostAlloc(", bytes, " bytes) failed: ", cudaGetErrorString(status));
    }
    return pointer;  // page aligned
  }
  void deallocate(void* pointer, std::size_t) noexcept override { cudaFreeHost(pointer); }
  Device device() const override { return Device::host(); }
};

}  // namespace

Allocator& cuda_device_allocator(int device_index) {
  require_usable("allocating device memory");
  ZT_CHECK(device_index >= 0 && device_index < cuda_status().device_count, "cuda:", device_index,
           " does not exist: this process sees ", cuda_status().device_count, " device(s)");
  static std::mutex mutex;
  static std::map<int, std::unique_ptr<CudaDeviceAllocator>> allocators;
  std::lock_guard lock(mutex);
  auto& slot = allocators[device_index];
  if (!slot) slot = std::make_unique<CudaDeviceAllocator>(device_index);
  return *slot;
}

Allocator& cuda_pinned_host_allocator() {
  static CudaPinnedAllocator allocator;
  return allocator;
}

void* cuda_stream_create(int device_index) {
  require_usable("creating a CUDA stream");
  ZT_CHECK_CUDA(cudaSetDevice(device_index));
  cudaStream_t stream = nullptr;
  ZT_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return stream;
}

void cuda_stream_destroy(void* stream) noexcept {
  cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}

void cuda_stream_synchronize(void* stream) {
  ZT_CHECK_CUDA(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
}

void cuda_stream_wait_event(void* stream, void* event) {
  ZT_CHECK_CUDA(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0));
}

void cuda_zero(void* destination, std::size_t bytes, void* stream) {
  require_usable("zeroing CUDA device memory");
  ZT_CHECK_CUDA(cudaMemsetAsync(destination, 0, bytes, static_cast<cudaStream_t>(stream)));
  if (stream == nullptr) ZT_CHECK_CUDA(cudaStreamSynchronize(nullptr));
}

void cuda_copy(void* destination, const void* source, std::size_t bytes, void* stream) {
  require_usable("copying to or from a CUDA device");
  ZT_CHECK_CUDA(
      cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)));
  if (stream == nullptr) ZT_CHECK_CUDA(cudaStreamSynchronize(nullptr));
}

void* cuda_event_create(int device_index) {
  require_usable("creating a CUDA event");
  ZT_CHECK_CUDA(cudaSetDevice(device_index));
  cudaEvent_t event = nullptr;
  ZT_CHECK_CUDA(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  return event;
}

void cuda_event_destroy(void* event) noexcept {
  cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

void cuda_event_record(void* event, void* stream) {
  ZT_CHECK_CUDA(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)));
}

void cuda_event_synchronize(void* event) {
  ZT_CHECK_CUDA(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
}

bool cuda_event_query(void* event) {
  const cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (status == cudaErrorNotReady) return false;
  ZT_CHECK_CUDA(status);
  return true;
}

void cuda_set_device(int device_index) {
  require_usable("selecting a CUDA device");
  ZT_CHECK_CUDA(cudaSetDevice(device_index));
}

CudaStatus query_cuda_status() {
  CudaStatus status;
  status.compiled = true;
  cudaRuntimeGetVersion(&status.runtime_version);
  cudaDriverGetVersion(&status.driver_version);  // 0 when no driver is installed
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error == cudaSuccess && count > 0) {
    status.device_count = count;
  } else if (error == cudaSuccess) {
    status.reason = "the CUDA runtime sees no device (check CUDA_VISIBLE_DEVICES)";
  } else {
    // cudaErrorInsufficientDriver (35) on machines without a GPU driver, cudaErrorNoDevice (100) without a
    // GPU.
    status.reason = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(error) + " (" +
                    std::to_string(static_cast<int>(error)) + "): " + cudaGetErrorString(error);
    cudaGetLastError();  // clear the sticky-free error so later calls are not confused by it
  }
  return status;
}

}  // namespace zt::detail
