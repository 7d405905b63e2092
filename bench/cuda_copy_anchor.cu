// The copy anchor of zt_bench_cuda_kernels (bench/bench_cuda_kernels.cpp): the simplest kernel that
// moves bytes, one 16-byte load and one 16-byte store per element in a grid-stride loop. What it
// reaches is what a well-formed streaming kernel can reach on this GPU in this process, the yardstick
// the engine's kernels are measured against (their "ratio to copy anchor").
#include "bench/cuda_copy_anchor.hpp"

#include <cuda_runtime.h>

#include <algorithm>

#include "zerotrain/error.hpp"

namespace zt::bench {
namespace {

__global__ void copy_float4(const float4* __restrict__ source, float4* __restrict__ destination,
                            std::size_t count) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    destination[i] = source[i];
  }
}

}  // namespace

void launch_copy_anchor(const void* source, void* destination, std::size_t bytes, void* stream) {
  ZT_CHECK(bytes % sizeof(float4) == 0, "copy anchor: ", bytes, " bytes is not a multiple of 16");
  const std::size_t count = bytes / sizeof(float4);
  constexpr unsigned int kThreads = 256;
  int device = 0, multiprocessors = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device);
  // Enough resident blocks to keep every SM's loads in flight, never more than the work needs.
  const std::size_t needed = (count + kThreads - 1) / kThreads;
  const auto blocks = static_cast<unsigned int>(
      std::max<std::size_t>(1, std::min<std::size_t>(needed, 32u * multiprocessors)));
  copy_float4<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const float4*>(source), static_cast<float4*>(destination), count);
  const cudaError_t status = cudaGetLastError();
  ZT_CHECK(status == cudaSuccess, "copy anchor kernel failed to launch: ", cudaGetErrorString(status));
}

}  // namespace zt::bench
