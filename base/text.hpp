// Text for messages and reports, written one way everywhere: byte sizes, errno values, shapes.
#pragma once

#include <string.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <string_view>

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

/// The inverse of byte_size_text for options: "1048576", "512MiB", "2 GiB", "1.5GB", "64k" (binary units
/// KiB MiB GiB TiB, or K M G T alone; decimal kB MB GB TB; B or nothing for bytes; case-insensitive).
/// nullopt for anything else: no number, an unknown unit, a negative or too large value.
inline std::optional<std::uint64_t> parse_byte_size(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size() && (text[i] == '.' || (text[i] >= '0' && text[i] <= '9'))) ++i;
  const std::string number(text.substr(0, i));
  if (number.empty() || number == "." || number.find('.') != number.rfind('.')) return std::nullopt;
  std::string unit;
  for (char c : text.substr(i)) {
    if (c == ' ' && unit.empty()) continue;
    unit += static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  }
  struct Unit {
    const char* name;
    double bytes;
  };
  constexpr Unit kUnits[] = {{"", 1.0},     {"b", 1.0},      {"k", 0x1p10}, {"kib", 0x1p10},
                             {"m", 0x1p20}, {"mib", 0x1p20}, {"g", 0x1p30}, {"gib", 0x1p30},
                             {"t", 0x1p40}, {"tib", 0x1p40}, {"kb", 1e3},   {"mb", 1e6},
                             {"gb", 1e9},   {"tb", 1e12}};
  for (const Unit& candidate : kUnits) {
    if (unit != candidate.name) continue;
    const double bytes = std::strtod(number.c_str(), nullptr) * candidate.bytes;
    if (!std::isfinite(bytes) || bytes >= 0x1p63) return std::nullopt;
    return static_cast<std::uint64_t>(std::llround(bytes));
  }
  return std::nullopt;
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

/// "2026-12-02T08:15:00Z": the current time in UTC, ISO 8601, for reports and lock files.
inline std::string utc_timestamp_text() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

}  // namespace zt::base
