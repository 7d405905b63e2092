// splitmix64 (Steele, Lea, Flood 2014), private to the io layer: the sampler's epoch permutation
// and the built-in corpus generator are both defined in terms of it (docs/data.md).
#pragma once

#include <cstdint>

namespace zt::detail {

inline constexpr std::uint64_t kSplitMixGolden = 0x9E3779B97F4A7C15ULL;

/// The splitmix64 output finalizer: a bijection of 64-bit values with good avalanche.
constexpr std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

/// The generator: state += golden; return mix64(state).
class SplitMix64 {
 public:
  explicit constexpr SplitMix64(std::uint64_t state) : state_(state) {}
  constexpr std::uint64_t next() { return mix64(state_ += kSplitMixGolden); }
  /// Uniform in [0, bound), unbiased: rejects the (2^64 mod bound) lowest outputs. bound >= 1.
  constexpr std::uint64_t below(std::uint64_t bound) {
    const std::uint64_t threshold = (0 - bound) % bound;
    for (;;) {
      const std::uint64_t x = next();
      if (x >= threshold) return x % bound;
    }
  }

 private:
  std::uint64_t state_;
};

}  // namespace zt::detail
