// Wrong way: io must not know the engine.
#include "src/engine/swapped_optimizer_states.hpp"
