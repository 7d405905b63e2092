// Wall-clock intervals for timing reports (traffic counters, waits, I/O stalls): one steady clock.
#pragma once

#include <chrono>

namespace zt::base {

using Clock = std::chrono::steady_clock;

/// Seconds from `start` to now.
inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace zt::base
