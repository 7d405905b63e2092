// The counter-based random numbers of the kernels (dropout masks, fill_normal): 64 random bits per
// (seed, stream, index), no state. The host kernels (kernels/host) and the CUDA kernels
// (kernels/cuda) both call these functions, so a dropout mask or the uniforms behind fill_normal are
// the same bits on every device and thread count.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define ZT_COUNTER_RANDOM_HOST_DEVICE __host__ __device__
#else
#define ZT_COUNTER_RANDOM_HOST_DEVICE
#endif

namespace zt::kernels {

/// splitmix64's finalizer: a bijective 64-bit mix with good avalanche.
ZT_COUNTER_RANDOM_HOST_DEVICE inline std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
/// 64 random bits for counter `index` of the stream keyed by (seed, stream).
ZT_COUNTER_RANDOM_HOST_DEVICE inline std::uint64_t counter_random(std::uint64_t seed, std::uint64_t stream,
                                                                  std::uint64_t index) {
  return mix64(mix64(seed ^ mix64(stream)) + index);
}
/// Uniform in [0, 1) with 53 random bits (the product is exact: a power-of-two scaling).
ZT_COUNTER_RANDOM_HOST_DEVICE inline double to_unit_double(std::uint64_t bits) {
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

}  // namespace zt::kernels

#undef ZT_COUNTER_RANDOM_HOST_DEVICE
