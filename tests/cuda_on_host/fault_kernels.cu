// Faulty kernels for the CudaFibers tests (fault_kernels.hpp). CUDA source, translated by
// translate.py like kernels/cuda/*.cu; never built by nvcc.
#include "fault_kernels.hpp"

#include <cuda_runtime.h>

namespace fault_kernels {
namespace {

// Dynamic shared memory, which the runtime fills with NaN bytes per block (static shared arrays keep
// what the previous launch left, which could hide the missing barrier).
__global__ void block_sum_kernel(const float* values, float* sum, bool with_barrier) {
  extern __shared__ float slots[];
  slots[threadIdx.x] = values[threadIdx.x];
  if (with_barrier) __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0;
    for (int i = 0; i < 256; ++i) total += slots[i];
    *sum = total;
  }
}

__global__ void divergent_barrier_kernel() {
  if (threadIdx.x < 32) return;
  __syncthreads();
}

__global__ void shuffle_after_exit_kernel(float* out) {
  if (threadIdx.x >= 16) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

__global__ void __launch_bounds__(256) bounded_kernel() {}

__global__ void empty_kernel() {}

__global__ void dynamic_shared_kernel() {
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  shared_bytes[threadIdx.x] = 1;
}

}  // namespace

std::string take_launch_error() {
  const cudaError_t status = cudaGetLastError();
  return status == cudaSuccess ? std::string() : std::string(cudaGetErrorString(status));
}

void block_sum(const float* values, float* sum, bool with_barrier) {
  block_sum_kernel<<<1, 256, 256 * sizeof(float)>>>(values, sum, with_barrier);
}

void divergent_barrier() {
  divergent_barrier_kernel<<<1, 64>>>();
}

void shuffle_after_exit() {
  float out[32] = {};
  shuffle_after_exit_kernel<<<1, 32>>>(out);
}

void launch_over_bounds() {
  bounded_kernel<<<2, 512>>>();
}

void launch_block_of(unsigned int threads) {
  empty_kernel<<<1, threads>>>();
}

void launch_with_dynamic_shared(std::size_t bytes, bool raise_limit) {
  if (raise_limit)
    cudaFuncSetAttribute(dynamic_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(bytes));
  dynamic_shared_kernel<<<1, 64, bytes>>>();
}

}  // namespace fault_kernels
