// The `zerotrain` command.
//   zerotrain report                         what this build and machine offer
//   zerotrain train --config FILE [...]      train the model a config describes
//   zerotrain data convert IN OUT            text file -> byte-token file
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zerotrain/config.hpp"
#include "zerotrain/data.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/estimate.hpp"
#include "zerotrain/report.hpp"
#include "zerotrain/runtime.hpp"
#include "zerotrain/trainer.hpp"

namespace {

constexpr const char* kUsage =
    "usage: zerotrain <command> [options]\n"
    "commands:\n"
    "  report                     MPI, CUDA/NCCL, HDF5 and I/O capabilities of this build and machine\n"
    "  train --config FILE [--data PATH] [--steps N] [--metrics PATH] [--print-every N]\n"
    "                             train the model of the config's \"model\" section (run under mpirun/srun\n"
    "                             for data parallelism); --steps: train until global step N (default 100)\n"
    "        [--save-dir DIR] [--save-interval K] [--keep-last K] [--resume auto|DIR|DIR/TAG.h5]\n"
    "                             checkpoints every K steps, at the end, and on SIGTERM/SIGUSR1 (then\n"
    "                             exit 75); --resume auto: the newest valid checkpoint in --save-dir\n"
    "  estimate --config FILE --world-size N [--params P]\n"
    "                             model-state memory per rank predicted by the ZeRO formulas\n"
    "  data convert IN OUT        convert a text file to a byte-token file (vocab 256)\n"
    "  help                       this text\n";

/// Command-line flags of the form --name VALUE.
class Flags {
 public:
  Flags(int argc, char** argv, int first) {
    for (int i = first; i < argc; ++i) {
      const std::string_view arg = argv[i];
      ZT_CHECK_AS(zt::ConfigError, arg.starts_with("--") && i + 1 < argc, "unexpected argument '", arg,
                  "': expected --name VALUE (see `zerotrain help`)");
      values_.emplace_back(std::string(arg.substr(2)), argv[++i]);
    }
  }
  std::optional<std::string> take(std::string_view name) {
    for (auto it = values_.begin(); it != values_.end(); ++it) {
      if (it->first == name) {
        std::string value = it->second;
        values_.erase(it);
        return value;
      }
    }
    return std::nullopt;
  }
  std::optional<std::int64_t> take_integer(std::string_view name) {
    const auto text = take(name);
    if (!text) return std::nullopt;
    char* end = nullptr;
    const long long value = std::strtoll(text->c_str(), &end, 10);
    ZT_CHECK_AS(zt::ConfigError, end != text->c_str() && *end == '\0', "--", name,
                " expects an integer, got '", *text, "'");
    return value;
  }
  void require_all_used() const {
    if (!values_.empty())
      ZT_THROW_AS(zt::ConfigError, "unknown option --", values_.front().first, " (see `zerotrain help`)");
  }

 private:
  std::vector<std::pair<std::string, std::string>> values_;
};

int report_command(zt::Runtime& runtime) {
  zt::Report report;
  for (const zt::Report& part :
       {zt::build_report(), zt::mpi_report(runtime), zt::device_report(), zt::io_report()}) {
    report.insert(report.end(), part.begin(), part.end());
  }
  if (runtime.world_rank() != 0) return 0;
  std::string section;
  for (const auto& line : report) {
    if (line.section != section) {
      section = line.section;
      std::printf("[%s]\n", section.c_str());
    }
    std::printf("  %-26s %s\n", (line.key + ":").c_str(), line.value.c_str());
  }
  return 0;
}

int train_command(zt::Runtime& runtime, int argc, char** argv) {
  Flags flags(argc, argv, 2);
  const auto config_path = flags.take("config");
  ZT_CHECK_AS(zt::ConfigError, config_path.has_value(),
              "zerotrain train needs --config FILE (examples/configs/)");
  zt::TrainOptions options;
  options.steps = flags.take_integer("steps").value_or(options.steps);
  options.data_path = flags.take("data");
  options.metrics_path = flags.take("metrics");
  options.print_every = flags.take_integer("print-every");
  options.save_dir = flags.take("save-dir");
  options.save_interval = flags.take_integer("save-interval");
  options.keep_last = flags.take_integer("keep-last");
  options.resume = flags.take("resume");
  flags.require_all_used();
  // Config warnings once, from rank 0.
  zt::ConfigParseOptions parse;
  if (runtime.world_rank() != 0) parse.warning_sink = {};
  zt::Config config = zt::Config::from_file(*config_path, parse);
  const zt::TrainSummary summary = zt::train(runtime, std::move(config), options);
  return summary.preempted ? zt::kPreemptedExitCode : 0;
}

int estimate_command(zt::Runtime& runtime, int argc, char** argv) {
  Flags flags(argc, argv, 2);
  const auto config_path = flags.take("config");
  ZT_CHECK_AS(zt::ConfigError, config_path.has_value(), "zerotrain estimate needs --config FILE");
  const auto world_size = flags.take_integer("world-size");
  ZT_CHECK_AS(zt::ConfigError, world_size.has_value(), "zerotrain estimate needs --world-size N");
  const std::int64_t parameters = flags.take_integer("params").value_or(0);
  flags.require_all_used();
  zt::ConfigParseOptions parse;
  if (runtime.world_rank() != 0) parse.warning_sink = {};
  const zt::Config config = zt::Config::from_file(*config_path, parse);
  const zt::MemoryEstimate estimate =
      zt::estimate_model_state_memory(config, static_cast<int>(*world_size), parameters);
  if (runtime.world_rank() == 0) std::fputs(estimate.table().c_str(), stdout);
  return 0;
}

int data_command(zt::Runtime& runtime, int argc, char** argv) {
  ZT_CHECK_AS(zt::ConfigError, argc == 5 && std::string_view(argv[2]) == "convert",
              "usage: zerotrain data convert INPUT.txt OUTPUT.bin");
  if (runtime.world_rank() == 0) {
    const zt::ConvertStats stats = zt::convert_text_file(argv[3], argv[4]);
    std::printf("converted %s: %llu bytes -> %llu tokens in %s\n", argv[3],
                static_cast<unsigned long long>(stats.input_bytes),
                static_cast<unsigned long long>(stats.tokens), argv[4]);
  }
  runtime.world().barrier();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  zt::Runtime runtime(&argc, &argv);
  return zt::run_and_report([&]() -> int {
    const std::string_view command = argc > 1 ? argv[1] : "help";
    if (command == "report") return report_command(runtime);
    if (command == "train") return train_command(runtime, argc, argv);
    if (command == "estimate") return estimate_command(runtime, argc, argv);
    if (command == "data") return data_command(runtime, argc, argv);
    if (command == "help" || command == "--help" || command == "-h") {
      if (runtime.world_rank() == 0) std::fputs(kUsage, stdout);
      return 0;
    }
    if (runtime.world_rank() == 0) {
      std::fprintf(stderr, "zerotrain: unknown command '%s'\n%s", std::string(command).c_str(), kUsage);
    }
    return 2;
  });
}
