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

#include "zerotrain/config.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/runtime.hpp"

namespace zt::cli {

namespace {

/// The message without its "zerotrain error on rank R (file:line): " prefixes.
std::string plain(const std::exception& error) {
  std::string_view text = error.what();
  while (text.starts_with("zerotrain error")) {
    const std::size_t end = text.find("): ");
    if (end == std::string_view::npos) break;
    text.remove_prefix(end + 3);
  }
  return std::string(text);
}

}  // namespace

int checkpoint_import_command(Runtime& runtime, int argc, char** argv) {
  const bool leader = runtime.world_rank() == 0;
  const char* who = "zerotrain checkpoint import";
  int code = 0;
  try {
    std::optional<std::string> weights, config_path, out, tag;
    for (int i = 3; i < argc; ++i) {
      const std::string_view arg = argv[i];
      if (!arg.starts_with("--")) {
        ZT_CHECK_AS(ConfigError, !weights, "unexpected argument '", arg,
                    "': one WEIGHTS file, then --options");
        weights = std::string(arg);
        continue;
      }
      ZT_CHECK_AS(ConfigError, i + 1 < argc, arg, " needs a value");
      const std::string value = argv[++i];
      if (arg == "--config") {
        config_path = value;
      } else if (arg == "--out") {
        out = value;
      } else if (arg == "--tag") {
        tag = value;
      } else {
        ZT_THROW_AS(ConfigError, "unknown option '", arg, "'; expected --config, --out or --tag");
      }
    }
    ZT_CHECK_AS(ConfigError, weights && config_path && out,
                "usage: zerotrain checkpoint import WEIGHTS.h5 --config CONFIG.json --out DIR [--tag T]");
    Config config = Config::from_file(*config_path, ConfigParseOptions{.warning_sink = {}});
    if (leader) {
      for (const std::string& warning : config.warnings())
        std::fprintf(stderr, "%s: warning: %s\n", who, warning.c_str());
    }
    SaveOptions options;
    options.tag = tag;
    const std::string path = import_weights(runtime, *weights, std::move(config), *out, options);
    if (leader) {
      std::printf(
          "imported %s into %s (global step 0, %d rank(s); it loads at any world size and ZeRO stage)\n",
          weights->c_str(), path.c_str(), runtime.world_size());
    }
  } catch (const ConfigError& error) {
    if (leader) std::fprintf(stderr, "%s: %s\n", who, plain(error).c_str());
    code = 2;
  } catch (const std::exception& error) {
    if (leader) std::fprintf(stderr, "%s: FAILED: %s\n", who, plain(error).c_str());
    code = 1;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  return code;
}

}  // namespace zt::cli
