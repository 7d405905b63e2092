// Wrong way: io must not know the engine's config code.
#include "src/config/json_reader.hpp"
