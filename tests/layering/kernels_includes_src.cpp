// Wrong way: kernels must not know the engine.
#include "src/engine/seconds_since.hpp"
