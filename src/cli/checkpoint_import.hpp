// `zerotrain checkpoint import` (src/cli/checkpoint_import.cpp).
#pragma once

#include <optional>
#include <string>

#include "zerotrain/config.hpp"

namespace zt {
class Runtime;
}

namespace zt::cli {

/// Imports WEIGHTS (a plain HDF5 of named tensors) as a step-0 checkpoint of `config`'s model in
/// `out` (src/cli/main.cpp has checked the command line and parsed the config). Collective over the
/// runtime's world; every rank returns the exit code: 0 imported, 1 failed (a file that does not fit
/// the model, unreadable, not writable), 2 a config the model cannot be built from.
int checkpoint_import(Runtime& runtime, const std::string& weights, Config config, const std::string& out,
                      const std::optional<std::string>& tag);

}  // namespace zt::cli
