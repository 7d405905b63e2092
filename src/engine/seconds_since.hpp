// Wall-clock intervals for the engine's timing reports (waits, updates): one steady clock.
#pragma once

#include <chrono>

namespace zt::engine_detail {

using Clock = std::chrono::steady_clock;

/// Seconds from `start` to now.
inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace zt::engine_detail
