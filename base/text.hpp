// Text for messages and reports, written one way everywhere: byte sizes, errno values, shapes.
#pragma once

#include <string.h>

#include <cstdint>
#include <cstdio>
#include <iterator>
#include <span>
#include <string>

namespace zt::base {

/// "12 B", "4.0 KiB", "1.5 GiB": a byte count for people (binary units, one decimal).
inline std::string byte_size_text(std::uint64_t bytes) {
  constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double value = static_cast<double>(bytes);
  std::size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < std::size(kUnits)) {
    value /= 1024.0;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.1f %s", value, kUnits[unit]);
  return text;
}

namespace detail {
// strerror_r comes in two flavours: GNU (returns the message, which may not be in the buffer) and
// XSI (returns 0 and fills the buffer). Overloads pick the right reading for whichever we got.
inline const char* strerror_r_result(const char* message, const char* /*buffer*/) {
  return message;
}
inline const char* strerror_r_result(int status, const char* buffer) {
  return status == 0 ? buffer : "unknown error";
}
}  // namespace detail

/// What errno value `error` means ("No such file or directory"). Thread-safe, unlike
/// std::strerror: the swap engine's I/O threads report errors too.
inline std::string errno_text(int error) {
  char buffer[256] = {};
  return detail::strerror_r_result(::strerror_r(error, buffer, sizeof buffer), buffer);
}

/// "[2, 3, 4]": a tensor or dataset shape; "[]" for a scalar.
inline std::string shape_text(std::span<const std::int64_t> shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

}  // namespace zt::base
