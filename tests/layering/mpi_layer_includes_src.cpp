// Wrong way: mpi_layer must not know the engine.
#include "src/engine/string_broadcast.hpp"
