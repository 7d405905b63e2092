// Small helpers the C++ benchmarks share.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace zt::bench {

/// The median of `values` (the mean of the middle two for an even count); 0 for none.
inline double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

/// Print `message` (when not empty) and `usage`, and exit 2.
[[noreturn]] inline void exit_with_usage(const std::string& message, const char* usage) {
  if (!message.empty()) std::fprintf(stderr, "%s\n", message.c_str());
  std::fprintf(stderr, "%s\n", usage);
  std::exit(2);
}

/// Command-line flags of the form --name VALUE: handle(flag, value) for each, returning false for a
/// flag it does not know. --help, a flag without a value and an unknown flag exit with the usage.
/// Call it before MPI starts, so that exiting is clean.
template <typename Handle>
void parse_flags(int argc, char** argv, const char* usage, Handle&& handle) {
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") exit_with_usage("", usage);
    if (i + 1 >= argc) exit_with_usage("missing value after " + flag, usage);
    const std::string value = argv[++i];
    if (!handle(flag, value)) exit_with_usage("unknown flag " + flag, usage);
  }
}

}  // namespace zt::bench
