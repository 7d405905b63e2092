// Temporary device memory for one kernel call, ordered on its stream: cudaMallocAsync when made,
// cudaFreeAsync when destroyed (after the kernels queued on the stream in between, without a host
// sync). The stream-ordered pool keeps freed blocks, so repeated calls do not reach cudaMalloc.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/cuda/cuda_common.hpp"

namespace zt::kernels::cuda {

class StreamScratch {
 public:
  StreamScratch(std::size_t bytes, cudaStream_t stream, const char* purpose) : stream_(stream) {
    if (bytes == 0) return;
    const cudaError_t status = cudaMallocAsync(&data_, bytes, stream);
    if (status != cudaSuccess) {
      ZT_THROW_AS(CudaError, "cudaMallocAsync of ", bytes, " bytes for ", purpose,
                  " failed: ", cudaGetErrorName(status), ": ", cudaGetErrorString(status));
    }
  }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  ~StreamScratch() {
    if (data_ != nullptr) cudaFreeAsync(data_, stream_);
  }

  template <typename T>
  T* as(std::size_t byte_offset = 0) const {
    return reinterpret_cast<T*>(static_cast<char*>(data_) + byte_offset);
  }

 private:
  void* data_ = nullptr;
  cudaStream_t stream_;
};

}  // namespace zt::kernels::cuda
