// Deterministic warp and block reductions for the CUDA kernels (kernels/cuda/*.cu): a fixed shuffle
// tree inside each warp, then the warps' partials combined by the first warp in the same tree. The
// order depends only on blockDim, never on timing, so a kernel using them gives the same bits run to
// run. Every lane of a butterfly (xor) shuffle ends with the same value (a + b == b + a), so every
// thread gets the result.
#pragma once

#include <cuda_runtime.h>

namespace zt::kernels::cuda {

constexpr unsigned int kWarpSize = 32;
constexpr unsigned int kFullWarpMask = 0xffffffffu;

template <typename C>
__device__ __forceinline__ C warp_sum(C value) {
  for (unsigned int offset = kWarpSize / 2; offset > 0; offset /= 2)
    value += __shfl_xor_sync(kFullWarpMask, value, offset);
  return value;
}

template <typename C>
__device__ __forceinline__ C warp_max(C value) {
  for (unsigned int offset = kWarpSize / 2; offset > 0; offset /= 2)
    value = max(value, __shfl_xor_sync(kFullWarpMask, value, offset));
  return value;
}

/// Combines per-warp results held by lane 0 of each warp: `scratch` holds at least 32 values
/// (shared memory). blockDim.x must be a multiple of 32 (at most 1024). Every thread returns the
/// result; the function synchronizes the block twice, so `scratch` can be reused right after.
template <typename C, typename WarpReduce>
__device__ __forceinline__ C block_reduce(C value, C* scratch, C identity, WarpReduce warp_reduce) {
  const unsigned int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const unsigned int warps = blockDim.x / kWarpSize;
  value = warp_reduce(value);
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  C total = lane < warps ? scratch[lane] : identity;
  // Every warp combines the partials in the same tree; lane 0's value is broadcast so that a
  // reduction whose combine is not symmetric bit for bit (a contracted a*b + c*d) still gives every
  // thread the same value.
  total = __shfl_sync(kFullWarpMask, warp_reduce(total), 0);
  __syncthreads();
  return total;
}

template <typename C>
__device__ __forceinline__ C block_sum(C value, C* scratch) {
  return block_reduce(value, scratch, C(0), [](C v) { return warp_sum(v); });
}

template <typename C>
__device__ __forceinline__ C block_max(C value, C* scratch, C lowest) {
  return block_reduce(value, scratch, lowest, [](C v) { return warp_max(v); });
}

}  // namespace zt::kernels::cuda
