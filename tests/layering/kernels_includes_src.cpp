// Wrong way: kernels must not know the engine.
#include "src/engine/partition_plan.hpp"
