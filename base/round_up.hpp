// Rounding sizes and offsets up to a granularity (alignment, block, bucket).
#pragma once

#include <concepts>

namespace zt::base {

/// The smallest multiple of `multiple` (> 0) that is at least `value` (>= 0).
template <std::integral T>
constexpr T round_up(T value, T multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

}  // namespace zt::base
