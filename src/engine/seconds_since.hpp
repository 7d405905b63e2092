// The engine's name for base/seconds_since.hpp, kept only for gradient_reducer.cpp and
// parameter_gatherer.cpp until their rewrite includes base/seconds_since.hpp itself; then delete
// this file.
#pragma once

#include "base/seconds_since.hpp"

namespace zt::engine_detail {

using base::Clock;
using base::seconds_since;

}  // namespace zt::engine_detail
