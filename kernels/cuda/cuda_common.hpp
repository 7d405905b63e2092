// Shared by the CUDA kernels (kernels/cuda/*.cu) and the CUDA device runtime (device_cuda.cpp):
// error checks with context, the stream handle, launch sizes, and fp32 <-> storage-type conversions
// that round exactly as the host's (zt::bf16 / zt::fp16: round to nearest even), so that casts give
// the same bits on the host and the GPU.
//
// Conventions of a CUDA kernel family (kernels/cuda/<family>.cu, declared in kernels/cuda/<family>.hpp):
//   - namespace zt::kernels::cuda, one host function per entry point of kernels/<family>.hpp, taking the
//     same arguments as the host kernel plus `void* stream` (the cudaStream_t; never the legacy default
//     stream in the engine) last;
//   - it launches asynchronously on that stream: no cudaDeviceSynchronize, no host reads on the hot path
//     (results that steer the host are written to device scalars, as on the host);
//   - after each launch ZT_CHECK_LAUNCH("name") turns a launch error into a zt::CudaError naming it;
//   - 16-bit tensors load as fp32 (load_float) and store rounded (store_float); fp64 computes in fp64.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "zerotrain/error.hpp"

/// Throws zt::CudaError naming the call and CUDA's error when `call` fails.
#define ZT_CHECK_CUDA(call)                                                                       \
  do {                                                                                            \
    const cudaError_t zt_cuda_status_ = (call);                                                   \
    if (zt_cuda_status_ != cudaSuccess)                                                           \
      ZT_THROW_AS(::zt::CudaError, #call, " failed: ", cudaGetErrorName(zt_cuda_status_), " (",   \
                  static_cast<int>(zt_cuda_status_), "): ", cudaGetErrorString(zt_cuda_status_)); \
  } while (0)

/// After a kernel launch: a bad configuration (or an earlier asynchronous fault) becomes a
/// zt::CudaError naming the kernel.
#define ZT_CHECK_LAUNCH(kernel_name)                                                \
  do {                                                                              \
    const cudaError_t zt_launch_status_ = cudaGetLastError();                       \
    if (zt_launch_status_ != cudaSuccess)                                           \
      ZT_THROW_AS(::zt::CudaError, "CUDA kernel ", kernel_name,                     \
                  " failed to launch: ", cudaGetErrorName(zt_launch_status_), ": ", \
                  cudaGetErrorString(zt_launch_status_));                           \
  } while (0)

namespace zt::kernels::cuda {

inline cudaStream_t as_cuda_stream(void* native) {
  return static_cast<cudaStream_t>(native);
}

/// Blocks for a grid-stride loop over `count` elements with `threads` per block: enough to fill the
/// device several times over, never more than the work needs.
inline unsigned int grid_blocks(std::int64_t count, unsigned int threads = 256,
                                unsigned int max_blocks = 65535u * 4) {
  const std::int64_t needed = (count + threads - 1) / threads;
  return static_cast<unsigned int>(needed < 1 ? 1 : (needed > max_blocks ? max_blocks : needed));
}

}  // namespace zt::kernels::cuda

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "zerotrain/dtype.hpp"

namespace zt::kernels::cuda {

// Storage types as the kernels see them; sizes and bit layouts equal zt::bf16 / zt::fp16.
using bf16_storage = __nv_bfloat16;
using fp16_storage = __half;

__device__ __forceinline__ float load_float(const float* p) {
  return *p;
}
__device__ __forceinline__ float load_float(const bf16_storage* p) {
  return __bfloat162float(*p);
}
__device__ __forceinline__ float load_float(const fp16_storage* p) {
  return __half2float(*p);
}
__device__ __forceinline__ double load_float(const double* p) {
  return *p;
}

// __float2bfloat16_rn / __float2half_rn round to nearest even, as the host's zt::bf16 / zt::fp16.
__device__ __forceinline__ void store_float(float* p, float v) {
  *p = v;
}
__device__ __forceinline__ void store_float(bf16_storage* p, float v) {
  *p = __float2bfloat16_rn(v);
}
__device__ __forceinline__ void store_float(fp16_storage* p, float v) {
  *p = __float2half_rn(v);
}
__device__ __forceinline__ void store_float(double* p, double v) {
  *p = v;
}

/// The arithmetic type of a storage type: fp64 for double, fp32 for the rest (the host's convention).
template <typename T>
struct compute_type {
  using type = float;
};
template <>
struct compute_type<double> {
  using type = double;
};
template <typename T>
using compute_t = typename compute_type<T>::type;

/// Calls body(T{}) with T the storage type of a floating `dtype` (float, double, __nv_bfloat16, __half);
/// throws naming `kernel_name` for any other dtype.
template <typename Body>
void with_storage_type(DType dtype, const char* kernel_name, Body&& body) {
  switch (dtype) {
    case DType::fp32:
      body(float{});
      return;
    case DType::fp64:
      body(double{});
      return;
    case DType::bf16:
      body(bf16_storage{});
      return;
    case DType::fp16:
      body(fp16_storage{});
      return;
    default:
      ZT_THROW("CUDA kernel ", kernel_name, ": dtype ", dtype_name(dtype), " is not floating");
  }
}

}  // namespace zt::kernels::cuda
#endif
