// One row of `zerotrain estimate`'s tables (model states and activations): name, bytes, GiB and
// the formula or note. Internal to the engine.
#pragma once

#include <cstdint>
#include <cstdio>
#include <sstream>
#include <string>

namespace zt::engine_detail {

inline void write_estimate_row(std::ostringstream& out, const char* name, std::uint64_t bytes,
                               const std::string& formula) {
  char text[200];
  std::snprintf(text, sizeof text, "  %-18s %16llu B  %10.3f GiB   %s\n", name,
                static_cast<unsigned long long>(bytes),
                static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0), formula.c_str());
  out << text;
}

}  // namespace zt::engine_detail
