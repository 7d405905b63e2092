// Element-wise CUDA kernels as one grid-stride loop: `op(i)` for every i in [0, count), whatever the
// grid size, with 64-bit indices. Shared by the element-wise and optimizer families
// (kernels/cuda/elementwise.cu, kernels/cuda/optimizer.cu). Device code only (included by .cu files).
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_common.hpp"

namespace zt::kernels::cuda {

/// Threads per block of the grid-stride kernels.
inline constexpr unsigned int kElementwiseThreads = 256;

/// Op: a copyable struct with `__device__ void operator()(std::int64_t i) const`. Each element is
/// written by one thread, so the result does not depend on the grid size.
template <typename Op>
__global__ void __launch_bounds__(kElementwiseThreads) for_each_index_kernel(std::int64_t count, Op op) {
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    op(i);
  }
}

/// Launches op over [0, count) on `stream` (nothing for count <= 0); a launch error names `kernel_name`.
template <typename Op>
void for_each_index(std::int64_t count, const Op& op, cudaStream_t stream, const char* kernel_name) {
  if (count <= 0) return;
  for_each_index_kernel<<<grid_blocks(count, kElementwiseThreads), kElementwiseThreads, 0, stream>>>(count,
                                                                                                     op);
  ZT_CHECK_LAUNCH(kernel_name);
}

}  // namespace zt::kernels::cuda
