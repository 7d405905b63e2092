// `zerotrain plan` (docs/plan.md): the command's options; the work is src/engine/plan.hpp's.
#pragma once

#include "zerotrain/runtime.hpp"

namespace zt::cli {

/// argv[1] is "plan". Collective; returns the exit code (2: bad options or config).
int plan_command(Runtime& runtime, int argc, char** argv);

}  // namespace zt::cli
