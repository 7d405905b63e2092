// `zerotrain checkpoint import WEIGHTS --config C --out DIR [--tag T]`: a plain HDF5 of named tensors
// (the layout of `checkpoint export`; scripts/zerotrain_torch.py convert writes one from PyTorch)
// becomes a step-0 checkpoint of the config's model in DIR, written by the engine on every rank of
// the job (docs/checkpoint-format.md, "Import").
#include "src/cli/checkpoint_import.hpp"

#include <cstdio>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "src/cli/plain_message.hpp"
#include "zerotrain/config.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/runtime.hpp"

namespace zt::cli {

int checkpoint_import(Runtime& runtime, const std::string& weights, Config config, const std::string& out,
                      const std::optional<std::string>& tag) {
  const bool leader = runtime.world_rank() == 0;
  const char* who = "zerotrain checkpoint import";
  int code = 0;
  try {
    SaveOptions options;
    options.tag = tag;
    const std::string path = import_weights(runtime, weights, std::move(config), out, options);
    if (leader) {
      std::printf(
          "imported %s into %s (global step 0, %d rank(s); it loads at any world size and ZeRO stage)\n",
          weights.c_str(), path.c_str(), runtime.world_size());
    }
  } catch (const ConfigError& error) {
    if (leader) std::fprintf(stderr, "%s: %s\n", who, plain_message(error).c_str());
    code = 2;
  } catch (const std::exception& error) {
    if (leader) std::fprintf(stderr, "%s: FAILED: %s\n", who, plain_message(error).c_str());
    code = 1;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  return code;
}

}  // namespace zt::cli
