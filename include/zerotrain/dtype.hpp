// Element types and the 16-bit float formats that C++20 lacks.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "zerotrain/error.hpp"

namespace zt {

enum class DType : std::uint8_t { fp32, fp64, bf16, fp16, int32, int64 };

inline constexpr DType kAllDTypes[] = {DType::fp32, DType::fp64,  DType::bf16,
                                       DType::fp16, DType::int32, DType::int64};

constexpr std::size_t dtype_size(DType type) {
  switch (type) {
    case DType::fp32:
    case DType::int32:
      return 4;
    case DType::fp64:
    case DType::int64:
      return 8;
    case DType::bf16:
    case DType::fp16:
      return 2;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType type) {
  switch (type) {
    case DType::fp32:
      return "fp32";
    case DType::fp64:
      return "fp64";
    case DType::bf16:
      return "bf16";
    case DType::fp16:
      return "fp16";
    case DType::int32:
      return "int32";
    case DType::int64:
      return "int64";
  }
  return "?";
}

constexpr bool dtype_is_floating(DType type) {
  return type == DType::fp32 || type == DType::fp64 || type == DType::bf16 || type == DType::fp16;
}

/// Parse the names users write in configs: fp32/float32/float, fp16/float16/half, bf16/bfloat16, ...
inline DType parse_dtype(std::string_view name) {
  if (name == "fp32" || name == "float32" || name == "float") return DType::fp32;
  if (name == "fp64" || name == "float64" || name == "double") return DType::fp64;
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  if (name == "fp16" || name == "float16" || name == "half") return DType::fp16;
  if (name == "int32") return DType::int32;
  if (name == "int64") return DType::int64;
  ZT_THROW("unknown dtype '", name, "': expected one of fp32, fp64, bf16, fp16, int32, int64");
}

/// bfloat16: the top 16 bits of an IEEE fp32. Conversion rounds to nearest even; NaN stays NaN.
struct bf16 {
  std::uint16_t bits = 0;

  bf16() = default;
  explicit bf16(float value) : bits(from_float(value)) {}
  explicit operator float() const { return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16); }

  static constexpr std::uint16_t from_float(float value) {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(value);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
      return static_cast<std::uint16_t>((u >> 16) | 0x0040u);  // quiet NaN, sign kept
    }
    const std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return static_cast<std::uint16_t>((u + rounding) >> 16);
  }
};

/// IEEE binary16. Conversion rounds to nearest even, handles subnormals, overflows to inf.
struct fp16 {
  std::uint16_t bits = 0;

  fp16() = default;
  explicit fp16(float value) : bits(from_float(value)) {}
  explicit operator float() const { return to_float(bits); }

  static constexpr float to_float(std::uint16_t h) {
    const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    const std::uint32_t exponent = (h >> 10) & 0x1fu;
    std::uint32_t mantissa = h & 0x3ffu;
    if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
    if (exponent != 0) return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
    if (mantissa == 0) return std::bit_cast<float>(sign);
    // Subnormal: value = mantissa * 2^-24, exact in fp32.
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign ? -magnitude : magnitude;
  }

  static constexpr std::uint16_t from_float(float value) {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(value);
    const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
    const std::uint32_t abs = u & 0x7fffffffu;
    if (abs >= 0x7f800000u) {  // inf or NaN
      return static_cast<std::uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
    }
    if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds past 65504
    if (abs < 0x38800000u) {               // below the smallest normal 2^-14: subnormal or zero
      if (abs < 0x33000000u) return sign;  // below half the smallest subnormal 2^-25
      // Subnormal result in units of 2^-24: the 24-bit significand shifted right by 126 - exponent.
      const std::uint32_t shift = 126u - (abs >> 23);  // 14..24
      const std::uint32_t significand = (abs & 0x7fffffu) | 0x800000u;
      std::uint32_t result = significand >> shift;
      const std::uint32_t remainder = significand & ((1u << shift) - 1u);
      const std::uint32_t halfway = 1u << (shift - 1);
      if (remainder > halfway || (remainder == halfway && (result & 1u))) ++result;
      return static_cast<std::uint16_t>(sign | result);
    }
    const std::uint32_t rebased = abs - 0x38000000u;  // exponent bias 127 -> 15
    const std::uint32_t rounding = 0xfffu + ((rebased >> 13) & 1u);
    return static_cast<std::uint16_t>(sign | ((rebased + rounding) >> 13));
  }
};

template <typename T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::fp32;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::fp64;
};
template <>
struct dtype_of<bf16> {
  static constexpr DType value = DType::bf16;
};
template <>
struct dtype_of<fp16> {
  static constexpr DType value = DType::fp16;
};
template <>
struct dtype_of<std::int32_t> {
  static constexpr DType value = DType::int32;
};
template <>
struct dtype_of<std::int64_t> {
  static constexpr DType value = DType::int64;
};
template <typename T>
inline constexpr DType dtype_of_v = dtype_of<T>::value;

}  // namespace zt
