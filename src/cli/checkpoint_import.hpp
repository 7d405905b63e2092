// `zerotrain checkpoint import` (src/cli/checkpoint_import.cpp).
#pragma once

namespace zt {
class Runtime;
}

namespace zt::cli {

/// argv: zerotrain checkpoint import WEIGHTS --config C --out DIR [--tag T]. Collective over the
/// runtime's world; every rank returns the exit code: 0 imported, 1 failed (a file that does not fit
/// the model, unreadable, not writable), 2 bad arguments or config.
int checkpoint_import_command(Runtime& runtime, int argc, char** argv);

}  // namespace zt::cli
