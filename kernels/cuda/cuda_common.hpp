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

/// The device `stream` belongs to (before CUDA 12.8, which cannot ask: the current device).
inline int stream_device(cudaStream_t stream) {
  int device = 0;
#if CUDART_VERSION >= 12080
  ZT_CHECK_CUDA(cudaStreamGetDevice(stream, &device));
#else
  (void)stream;
  ZT_CHECK_CUDA(cudaGetDevice(&device));
#endif
  return device;
}

/// cudaEventQuery, with a "not ready" answer kept out of the thread's last error, which the next
/// ZT_CHECK_LAUNCH reads (HIP records it there, as PyTorch notes; clearing costs nothing where CUDA
/// does not, and every launch is checked at once, so no other error is lost).
inline cudaError_t query_event(cudaEvent_t event) {
  const cudaError_t status = cudaEventQuery(event);
  if (status == cudaErrorNotReady) (void)cudaGetLastError();
  return status;
}

/// Makes `device` current for the scope, restoring the caller's on exit: kernel launches, library
/// handles (cuBLASLt, cuDNN), their heuristics and plans follow the current device.
class CurrentDeviceScope {
 public:
  explicit CurrentDeviceScope(int device) : device_(device) {
    ZT_CHECK_CUDA(cudaGetDevice(&previous_));
    if (previous_ != device_) ZT_CHECK_CUDA(cudaSetDevice(device_));
  }
  ~CurrentDeviceScope() {
    if (previous_ != device_) cudaSetDevice(previous_);
  }
  CurrentDeviceScope(const CurrentDeviceScope&) = delete;
  CurrentDeviceScope& operator=(const CurrentDeviceScope&) = delete;
  int device() const { return device_; }

 private:
  int device_ = 0;
  int previous_ = 0;
};

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

#include <cstddef>
#include <string>

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

/// A value of the type a kernel stores `dtype`'s elements as (storage_t names the type).
template <DType dtype>
auto storage_tag() {  // only its type is used (storage_t)
  if constexpr (dtype == DType::fp32)
    return float{};
  else if constexpr (dtype == DType::fp64)
    return double{};
  else if constexpr (dtype == DType::bf16)
    return bf16_storage{};
  else if constexpr (dtype == DType::fp16)
    return fp16_storage{};
  else if constexpr (dtype == DType::int32)
    return std::int32_t{};
  else
    return std::int64_t{};
}
template <DType dtype>
using storage_t = decltype(storage_tag<dtype>());

/// The dtypes a kernel argument accepts; `role` names the argument in errors ("gradient", ...).
template <DType... Accepted>
struct DTypeSet {
  const char* role;
};

inline constexpr DTypeSet<DType::fp32, DType::fp64, DType::bf16, DType::fp16> kFloatingDTypes{"tensor"};
inline constexpr DTypeSet<DType::fp32, DType::fp64, DType::bf16, DType::fp16, DType::int32, DType::int64>
    kAnyDTypes{"tensor"};

/// "fp32, bf16 or fp16": the accepted dtypes as an error message lists them.
template <DType... Accepted>
std::string dtype_list(DTypeSet<Accepted...>) {
  constexpr DType accepted[] = {Accepted...};
  std::string list;
  for (std::size_t i = 0; i < sizeof...(Accepted); ++i) {
    if (i > 0) list += i + 1 == sizeof...(Accepted) ? " or " : ", ";
    list += dtype_name(accepted[i]);
  }
  return list;
}

/// Calls body(T{}) with T = storage_t<dtype> (float, double, __nv_bfloat16, __half, int32_t, int64_t)
/// when `dtype` is one of `accepted`; otherwise throws naming the kernel, the argument's role, the dtype
/// and the accepted ones.
template <DType... Accepted, typename Body>
void with_dtype(DTypeSet<Accepted...> accepted, DType dtype, const char* kernel_name, Body&& body) {
  const bool dispatched = ((dtype == Accepted && (body(storage_t<Accepted>{}), true)) || ...);
  if (!dispatched)
    ZT_THROW("CUDA kernel ", kernel_name, ": ", accepted.role, " dtype ", dtype_name(dtype),
             " is not supported; expected ", dtype_list(accepted));
}

}  // namespace zt::kernels::cuda
#endif
