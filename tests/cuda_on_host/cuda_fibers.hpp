// CUDA kernel sources run on the CPU, for tests/cuda_on_host: every CUDA thread of a block is a fiber
// (a pooled stack) on one OS thread, switched only where CUDA threads meet (__syncthreads, warp shuffles),
// blocks one after another. What it checks: indexing, tiling, reductions, shuffles and barriers of
// kernels/cuda/*.cu against the host kernels, launch configurations a GPU refuses (block size, grid
// limits, launch bounds, dynamic shared memory without its attribute), and, with the streams run late
// (cuda_fibers_streams.hpp), the order of work between streams and with the host. What it cannot:
// timing, the memory model between blocks, every interleaving of streams (one order per run), the
// GPU's math library, cuBLASLt, cuDNN, NCCL. It is a check before the GPU run, never instead of it
// (docs/gpu.md).
//
// This header is force-included (-include) first in every translated source (translate.py): it
// renames the CUDA runtime functions the kernel files call to host versions (cuda_fibers.cpp), so
// nothing here reaches libcudart, then supplies the device built-ins g++ lacks. In the CUDA-on-host
// build (ZT_CUDA_ON_HOST, CUDA_FIBERS_KEEP_NAMES) the names stay: cuda_fibers.cpp is the only CUDA
// runtime that library links.
#pragma once

#ifndef CUDA_FIBERS_KEEP_NAMES
#define cudaMalloc cuda_fibers_cudaMalloc
#define cudaFree cuda_fibers_cudaFree
#define cudaMallocAsync cuda_fibers_cudaMallocAsync
#define cudaFreeAsync cuda_fibers_cudaFreeAsync
#define cudaMemset cuda_fibers_cudaMemset
#define cudaMemsetAsync cuda_fibers_cudaMemsetAsync
#define cudaMemcpy cuda_fibers_cudaMemcpy
#define cudaMemcpyAsync cuda_fibers_cudaMemcpyAsync
#define cudaMemcpyToSymbolAsync cuda_fibers_cudaMemcpyToSymbolAsync
#define cudaMemcpyFromSymbolAsync cuda_fibers_cudaMemcpyFromSymbolAsync
#define cudaFuncSetAttribute cuda_fibers_cudaFuncSetAttribute
#define cudaDeviceGetAttribute cuda_fibers_cudaDeviceGetAttribute
#define cudaGetDevice cuda_fibers_cudaGetDevice
#define cudaSetDevice cuda_fibers_cudaSetDevice
#define cudaGetLastError cuda_fibers_cudaGetLastError
#define cudaGetErrorString cuda_fibers_cudaGetErrorString
#define cudaGetErrorName cuda_fibers_cudaGetErrorName
#define cudaStreamSynchronize cuda_fibers_cudaStreamSynchronize
#define cudaDeviceSynchronize cuda_fibers_cudaDeviceSynchronize
#define cudaEventQuery cuda_fibers_cudaEventQuery
#define cudaStreamGetDevice cuda_fibers_cudaStreamGetDevice
#endif

// Static shared memory: one array per kernel instantiation, which the threads of the running block
// share (blocks run one at a time).
#define __shared__ static

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

#include "cuda_fibers_streams.hpp"

namespace cuda_fibers {

/// The coordinates of the CUDA thread that runs now.
struct CudaThread {
  uint3 thread_index;
  uint3 block_index;
  dim3 block_dim;
  dim3 grid_dim;
};

namespace detail {
// The coordinates of the CUDA thread that runs now on this OS thread, nullptr outside a kernel. Read
// at every threadIdx: __thread (no C++ TLS wrapper) with the initial-exec model (an offset from the
// thread pointer, not a __tls_get_addr call per read, which took 12 % of the on-host tests' time).
// The library that holds it is linked at start-up, never dlopen'ed, which initial-exec needs.
extern __thread const CudaThread* running_thread __attribute__((tls_model("initial-exec")));
[[noreturn]] void read_outside_a_kernel();
}  // namespace detail

inline const CudaThread& current_thread() {
  const CudaThread* coordinates = detail::running_thread;
  if (coordinates == nullptr) [[unlikely]]
    detail::read_outside_a_kernel();
  return *coordinates;
}

/// A launch's <<<grid, block, shared bytes, stream>>>.
struct LaunchConfig {
  LaunchConfig(dim3 grid_, dim3 block_, std::size_t shared_bytes_ = 0, cudaStream_t stream_ = nullptr)
      : grid(grid_), block(block_), shared_bytes(shared_bytes_), stream(stream_) {}
  dim3 grid;
  dim3 block;
  std::size_t shared_bytes;
  cudaStream_t stream;
};

/// Runs `thread_body` as every thread of the grid, in the stream's order (cuda_fibers_streams.hpp). A
/// configuration a GPU refuses runs nothing and is the error cudaGetLastError() returns at once; a
/// fault while the kernel runs (a deadlock, a shuffle of a lane that left) is too in the at_issue
/// order, and the device's sticky error (every later synchronization returns it) when streams run
/// late. The error's string says what happened. `kernel` is the kernel's address (for its
/// cudaFuncSetAttribute) or nullptr; `name` is the kernel as the launch names it.
void launch(const void* kernel, const char* name, const LaunchConfig& config,
            std::function<void()> thread_body);

/// A launch's arguments, evaluated and copied at the launch as CUDA does, then handed to `kernel`
/// (a generic lambda calling the kernel) by every thread: a launch that runs late reads them as
/// they were (translate.py writes the call).
template <typename Kernel, typename... Arguments>
std::function<void()> with_arguments(Kernel kernel, Arguments&&... arguments) {
  return [kernel, values = std::make_tuple(std::forward<Arguments>(arguments)...)] {
    std::apply(kernel, values);
  };
}

/// __launch_bounds__(max_threads): the block must not be larger.
void check_launch_bounds(unsigned int max_threads);
/// The launch's dynamic shared memory (filled with 0xff bytes, NaN as floats, at the start of each block).
unsigned char* dynamic_shared_memory();

void sync_block();
void sync_warp(unsigned int mask);

enum class ShuffleKind { index, xor_lane, down, up };
/// The `bits` posted by the source lane that `kind` and `operand` name, once every lane of `mask`
/// has arrived.
std::uint64_t shuffle(unsigned int mask, std::uint64_t bits, ShuffleKind kind, int operand, int width);

template <typename T>
T shuffle_value(unsigned int mask, T value, ShuffleKind kind, int operand, int width) {
  static_assert(sizeof(T) <= sizeof(std::uint64_t) && std::is_trivially_copyable_v<T>);
  std::uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  bits = shuffle(mask, bits, kind, operand, width);
  T result;
  std::memcpy(&result, &bits, sizeof(T));
  return result;
}

}  // namespace cuda_fibers

// The C++ overloads nvcc's runtime header declares for device code only.
template <typename T>
cudaError_t cudaMemcpyToSymbolAsync(const T& symbol, const void* source, std::size_t bytes,
                                    std::size_t offset = 0, cudaMemcpyKind kind = cudaMemcpyHostToDevice,
                                    cudaStream_t stream = nullptr) {
  return cudaMemcpyToSymbolAsync(static_cast<const void*>(&symbol), source, bytes, offset, kind, stream);
}
template <typename T>
cudaError_t cudaMemcpyFromSymbolAsync(void* destination, const T& symbol, std::size_t bytes,
                                      std::size_t offset = 0, cudaMemcpyKind kind = cudaMemcpyDeviceToHost,
                                      cudaStream_t stream = nullptr) {
  return cudaMemcpyFromSymbolAsync(destination, static_cast<const void*>(&symbol), bytes, offset, kind,
                                   stream);
}
template <typename T>
cudaError_t cudaFuncSetAttribute(T* kernel, cudaFuncAttribute attribute, int value) {
  return cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attribute, value);
}

// Device math that CUDA declares in the global namespace.
using std::isfinite;
using std::isinf;
using std::isnan;
inline float max(float a, float b) {
  return std::fmax(a, b);
}
inline double max(double a, double b) {
  return std::fmax(a, b);
}
inline float min(float a, float b) {
  return std::fmin(a, b);
}
inline double min(double a, double b) {
  return std::fmin(a, b);
}
inline int max(int a, int b) {
  return a < b ? b : a;
}
inline int min(int a, int b) {
  return a < b ? a : b;
}
inline unsigned int max(unsigned int a, unsigned int b) {
  return a < b ? b : a;
}
inline unsigned int min(unsigned int a, unsigned int b) {
  return a < b ? a : b;
}
inline long long max(long long a, long long b) {
  return a < b ? b : a;
}
inline long long min(long long a, long long b) {
  return a < b ? a : b;
}
inline long max(long a, long b) {
  return a < b ? b : a;
}
inline long min(long a, long b) {
  return a < b ? a : b;
}

#define threadIdx (::cuda_fibers::current_thread().thread_index)
#define blockIdx (::cuda_fibers::current_thread().block_index)
#define blockDim (::cuda_fibers::current_thread().block_dim)
#define gridDim (::cuda_fibers::current_thread().grid_dim)

inline void __syncthreads() {
  ::cuda_fibers::sync_block();
}
inline void __syncwarp(unsigned int mask = 0xffffffffu) {
  ::cuda_fibers::sync_warp(mask);
}

template <typename T>
T __shfl_sync(unsigned int mask, T value, int source_lane, int width = 32) {
  return ::cuda_fibers::shuffle_value(mask, value, ::cuda_fibers::ShuffleKind::index, source_lane, width);
}
template <typename T>
T __shfl_xor_sync(unsigned int mask, T value, int lane_mask, int width = 32) {
  return ::cuda_fibers::shuffle_value(mask, value, ::cuda_fibers::ShuffleKind::xor_lane, lane_mask, width);
}
template <typename T>
T __shfl_down_sync(unsigned int mask, T value, unsigned int delta, int width = 32) {
  return ::cuda_fibers::shuffle_value(mask, value, ::cuda_fibers::ShuffleKind::down, static_cast<int>(delta),
                                      width);
}
template <typename T>
T __shfl_up_sync(unsigned int mask, T value, unsigned int delta, int width = 32) {
  return ::cuda_fibers::shuffle_value(mask, value, ::cuda_fibers::ShuffleKind::up, static_cast<int>(delta),
                                      width);
}

// Round-to-nearest arithmetic that the device never contracts: the translated sources are compiled
// with -ffp-contract=off, so plain operators give the same roundings.
inline float __fadd_rn(float a, float b) {
  return a + b;
}
inline float __fsub_rn(float a, float b) {
  return a - b;
}
inline float __fmul_rn(float a, float b) {
  return a * b;
}
inline float __fdiv_rn(float a, float b) {
  return a / b;
}
inline float __fsqrt_rn(float a) {
  return std::sqrt(a);
}
inline double __dadd_rn(double a, double b) {
  return a + b;
}
inline double __dsub_rn(double a, double b) {
  return a - b;
}
inline double __dmul_rn(double a, double b) {
  return a * b;
}
inline double __longlong_as_double(long long bits) {
  return std::bit_cast<double>(bits);
}
inline long long __double_as_longlong(double value) {
  return std::bit_cast<long long>(value);
}

// Atomics: fibers switch only at barriers and shuffles, so a read-modify-write is never interleaved.
inline unsigned long long atomicMin(unsigned long long* address, unsigned long long value) {
  const unsigned long long old = *address;
  if (value < old) *address = value;
  return old;
}
inline int atomicAdd(int* address, int value) {
  const int old = *address;
  *address = old + value;
  return old;
}
