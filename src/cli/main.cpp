// The `zerotrain` command. Every command is one entry of kCommands (below): its name ("train",
// "checkpoint inspect"), a one-line summary for `zerotrain help`, its usage text for `zerotrain
// COMMAND --help`, and a prepare function. main() finds the command and checks the whole command
// line (and the config file) before MPI starts, on every rank alike:
//   - --help and --version print (rank 0 of the launch only) and exit 0 without MPI;
//   - a usage error (unknown option, missing or bad value, unreadable config) is one line
//     "zerotrain COMMAND: what (see 'zerotrain COMMAND --help')" on stderr and exit 2: at once when
//     the launch has one process; in a job of several, after MPI starts so that the lowest failing
//     rank prints it and every rank ends cleanly (no MPI_Abort) with 2;
//   - otherwise prepare's job runs under the runtime (or without MPI: plot).
// Adding a command: a prepare function that takes its options from Arguments and returns the Job,
// and an entry in kCommands; the global page and the group pages ("zerotrain checkpoint") follow.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "base/text.hpp"
#include "src/cli/checkpoint_import.hpp"
#include "src/cli/openmp_wait_default.hpp"
#include "src/cli/plain_message.hpp"
#include "src/cli/plan_command.hpp"
#include "zerotrain/build_info.hpp"
#include "zerotrain/checkpoint.hpp"
#include "zerotrain/config.hpp"
#include "zerotrain/data.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/estimate.hpp"
#include "zerotrain/report.hpp"
#include "zerotrain/runtime.hpp"
#include "zerotrain/swap.hpp"
#include "zerotrain/trainer.hpp"

namespace {

namespace fs = std::filesystem;

/// The exit code of a usage error: bad arguments, or a config file that does not parse.
constexpr int kUsageExitCode = 2;

/// A usage error found before MPI starts. main() prints `notes` (a config file's warnings, which
/// often explain its error), then "zerotrain COMMAND: message", with " (see 'zerotrain COMMAND
/// --help')" when `hint`, and exits kUsageExitCode.
class UsageError : public std::runtime_error {
 public:
  explicit UsageError(const std::string& message, bool hint = true, std::vector<std::string> notes = {})
      : std::runtime_error(message), hint_(hint), notes_(std::move(notes)) {}
  bool hint() const { return hint_; }
  const std::vector<std::string>& notes() const { return notes_; }

 private:
  bool hint_;
  std::vector<std::string> notes_;
};

using zt::cli::plain_message;

/// This process's place in the launch, from the launcher's environment (MPI has not started):
/// Open MPI's mpirun, MPICH's hydra (PMI_*), PMIx launchers and srun. Rank 0 of 1 when started
/// alone; a size of 0 where the launcher gives a rank but no size.
struct Launch {
  int rank = 0;
  int size = 1;
  bool rank0() const { return rank == 0; }
};

std::optional<int> environment_integer(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr) return std::nullopt;
  int value = 0;
  const char* end = text + std::strlen(text);
  const auto [stop, error] = std::from_chars(text, end, value);
  if (error != std::errc() || stop != end) return std::nullopt;
  return value;
}

Launch launch_from_environment() {
  std::optional<int> rank;
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"})
    if (!rank) rank = environment_integer(name);
  // SLURM_STEP_NUM_TASKS exists only inside an srun step.
  std::optional<int> size;
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"})
    if (!size) size = environment_integer(name);
  if (!rank) return {};
  if (size) return {*rank, *size};
  // A PMIx launcher that does not say the size; or SLURM_PROCID=0 of a batch script: one process.
  return {*rank, std::getenv("PMIX_RANK") != nullptr ? 0 : 1};
}

/// The arguments of one command after its name: options "--name VALUE" or "--name=VALUE" (each at
/// most once) and positional arguments, in any order. prepare takes what it knows; finish() then
/// refuses the rest. Every error is a UsageError.
class Arguments {
 public:
  /// `program`: argv[0], for a command that records its command line (plan).
  Arguments(std::string program, std::span<char* const> words)
      : program_(std::move(program)), words_(words.begin(), words.end()) {
    for (std::size_t i = 0; i < words.size(); ++i) {
      const std::string_view word = words[i];
      if (!word.starts_with("-") || word == "-") {
        positionals_.emplace_back(word);
        continue;
      }
      const std::size_t equals = word.find('=');
      std::string name(word.substr(0, equals));
      if (equals != std::string_view::npos) {
        options_.push_back({std::move(name), std::string(word.substr(equals + 1))});
      } else if (i + 1 < words.size() && !std::string_view(words[i + 1]).starts_with("--")) {
        options_.push_back({std::move(name), words[++i]});
      } else {
        options_.push_back({std::move(name), std::nullopt});
      }
    }
  }

  /// --name's value, if given.
  std::optional<std::string> take(std::string_view name) {
    const std::string flag = "--" + std::string(name);
    std::optional<std::string> value;
    bool found = false;
    for (auto it = options_.begin(); it != options_.end();) {
      if (it->name != flag) {
        ++it;
        continue;
      }
      if (found) throw UsageError("option '" + flag + "' given twice");
      if (!it->value) throw UsageError("option '" + flag + "' needs a value");
      found = true;
      value = std::move(it->value);
      it = options_.erase(it);
    }
    return value;
  }
  /// --name's value; a UsageError "needs --name WHAT" when it is not given.
  std::string require(std::string_view name, std::string_view what) {
    std::optional<std::string> value = take(name);
    if (!value) throw UsageError("needs --" + std::string(name) + " " + std::string(what));
    return *value;
  }
  /// --name N: the one parser of every integer option, so that each is checked alike: a whole
  /// number (no trailing text, no overflow) in [min, max].
  std::optional<std::int64_t> take_integer(std::string_view name, std::int64_t min,
                                           std::int64_t max = std::numeric_limits<std::int64_t>::max()) {
    const std::optional<std::string> text = take(name);
    if (!text) return std::nullopt;
    const std::string expected = max == std::numeric_limits<std::int64_t>::max()
                                     ? "an integer >= " + std::to_string(min)
                                     : "an integer in " + std::to_string(min) + ".." + std::to_string(max);
    std::int64_t value = 0;
    const char* end = text->data() + text->size();
    const auto [stop, error] = std::from_chars(text->data(), end, value);
    if (error == std::errc::result_out_of_range ||
        (error == std::errc() && stop == end && (value < min || value > max)))
      throw UsageError("--" + std::string(name) + " " + *text + " is out of range: expected " + expected);
    if (error != std::errc() || stop != end || text->empty())
      throw UsageError("--" + std::string(name) + " expects " + expected + ", got '" + *text + "'");
    return value;
  }
  /// --name X: a finite number > 0 ("989e12").
  std::optional<double> take_positive_number(std::string_view name) {
    const std::optional<std::string> text = take(name);
    if (!text) return std::nullopt;
    double value = 0;
    const char* end = text->data() + text->size();
    const auto [stop, error] = std::from_chars(text->data(), end, value);
    if (error != std::errc() || stop != end || text->empty() || !std::isfinite(value) || value <= 0)
      throw UsageError("--" + std::string(name) + " expects a number > 0 (such as 989e12), got '" + *text +
                       "'");
    return value;
  }
  /// Exactly the positional arguments `names` lists ("IN OUT"), in order.
  std::vector<std::string> positionals(std::initializer_list<std::string_view> names) {
    if (positionals_.size() < names.size()) {
      throw UsageError("missing " + std::string(names.begin()[positionals_.size()]) +
                       (names.size() > 1 ? " (expected " + join(names) + ")" : std::string()));
    }
    if (positionals_.size() > names.size())
      throw UsageError("unexpected argument '" + positionals_[names.size()] + "'");
    return std::move(positionals_);
  }
  const std::string& program() const { return program_; }
  /// Every argument as given, for a command that hands them on (plot); nothing is left to refuse.
  std::vector<std::string> take_all() {
    options_.clear();
    positionals_.clear();
    return words_;
  }
  /// The options and positional arguments nobody took are errors.
  void finish() const {
    if (!options_.empty()) throw UsageError("unknown option '" + options_.front().name + "'");
    if (!positionals_.empty()) throw UsageError("unexpected argument '" + positionals_.front() + "'");
  }

 private:
  static std::string join(std::initializer_list<std::string_view> names) {
    std::string text;
    for (std::string_view name : names) text += (text.empty() ? "" : " ") + std::string(name);
    return text;
  }
  struct Option {
    std::string name;  // with the dashes
    std::optional<std::string> value;
  };
  std::string program_;
  std::vector<std::string> words_;
  std::vector<Option> options_;
  std::vector<std::string> positionals_;
};

/// What main() runs once the command line is checked: under MPI (zt::Runtime up), or without.
struct Job {
  std::function<int(zt::Runtime&)> with_mpi;
  std::function<int()> without_mpi;  // set: no MPI at all
  zt::RuntimeOptions runtime_options;
};

struct Command {
  std::string_view name;      // "train", "checkpoint inspect"
  std::string_view synopsis;  // what follows "zerotrain NAME" in the usage line
  std::string_view summary;   // one line for `zerotrain help`
  std::string_view details;   // the rest of `zerotrain NAME --help`
  Job (*prepare)(Arguments& arguments);
};

/// A config file parsed before MPI starts (every rank reads it), with its warnings kept for rank 0
/// to print once the runtime is up. Its errors are usage errors (exit 2).
struct ParsedConfig {
  zt::Config config;
  std::vector<std::string> warnings;  // formatted lines

  static ParsedConfig from_file(const std::string& path) {
    std::vector<std::string> warnings;
    const zt::ConfigParseOptions options{
        .warning_sink = [&warnings](std::string_view line) { warnings.emplace_back(line); }};
    try {
      zt::Config config = zt::Config::from_file(path, options);
      return {std::move(config), std::move(warnings)};
    } catch (const zt::Error& error) {
      throw UsageError(plain_message(error), false, std::move(warnings));
    }
  }
  /// The warnings, on rank 0 alone.
  void print_warnings(const zt::Runtime& runtime) const {
    if (runtime.world_rank() != 0) return;
    for (const std::string& line : warnings) zt::print_config_warning_to_stderr(line);
  }
};

// ---- report ------------------------------------------------------------------------------------

Job prepare_report(Arguments& arguments) {
  const std::optional<std::string> config_path = arguments.take("config");
  arguments.finish();
  Job job;
  std::optional<ParsedConfig> parsed;
  if (config_path) {
    parsed = ParsedConfig::from_file(*config_path);
    job.runtime_options = zt::runtime_options_for(parsed->config);
  }
  job.with_mpi = [parsed](zt::Runtime& runtime) {
    if (parsed) parsed->print_warnings(runtime);
    zt::Report report;
    for (const zt::Report& part :
         {zt::build_report(), zt::mpi_report(runtime), zt::device_report(), zt::io_report()}) {
      report.insert(report.end(), part.begin(), part.end());
    }
    // After the last "host" line, so that the section stays together.
    const auto last_host = std::find_if(report.rbegin(), report.rend(),
                                        [](const zt::ReportLine& line) { return line.section == "host"; });
    report.insert(last_host.base(), {"host", "OpenMP waiting", zt::cli::openmp_wait_description()});
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
  };
  return job;
}

// ---- train -------------------------------------------------------------------------------------

/// The warning for a job that asked Slurm for N tasks but runs as one process: `zerotrain train`
/// in a batch script without srun (SLURM_NTASKS, or the older SLURM_NPROCS, says N and no srun
/// step is running), or srun starting N tasks whose MPI does not see each other (each a singleton:
/// SLURM_STEP_NUM_TASKS says N). None when the step has one task or the launch is mpirun's.
std::optional<std::string> forgotten_launcher_warning(int world_size) {
  if (world_size != 1 || std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr)
    return std::nullopt;
  if (const std::optional<int> step_tasks = environment_integer("SLURM_STEP_NUM_TASKS")) {
    if (*step_tasks <= 1) return std::nullopt;
    return "srun started " + std::to_string(*step_tasks) +
           " tasks (SLURM_STEP_NUM_TASKS=" + std::to_string(*step_tasks) +
           ") but MPI sees one process in each: they train alone, side by side. MPI is not wired to "
           "srun's PMI: try srun --mpi=pmix (srun --mpi=list shows the choices; docs/slurm.md)";
  }
  for (const char* name : {"SLURM_NTASKS", "SLURM_NPROCS"}) {
    const std::optional<int> tasks = environment_integer(name);
    if (!tasks) continue;
    if (*tasks <= 1) return std::nullopt;
    return "the Slurm allocation has " + std::to_string(*tasks) + " tasks (" + name + "=" +
           std::to_string(*tasks) +
           ") but zerotrain runs as one process: start it with `srun zerotrain train ...` (or mpirun) "
           "to train on all of them";
  }
  return std::nullopt;
}

Job prepare_train(Arguments& arguments) {
  const std::string config_path = arguments.require("config", "FILE");
  zt::TrainOptions options;
  options.steps = arguments.take_integer("steps", 0).value_or(options.steps);
  options.data_path = arguments.take("data");
  options.eval_data_path = arguments.take("eval-data");
  options.metrics_path = arguments.take("metrics");
  options.print_every = arguments.take_integer("print-every", 0);
  options.peak_flops = arguments.take_positive_number("peak-flops");
  options.save_dir = arguments.take("save-dir");
  options.save_interval = arguments.take_integer("save-interval", 0);
  options.keep_last = arguments.take_integer("keep-last", 0);
  options.resume = arguments.take("resume");
  options.resume_job_id = arguments.take("resume-job");
  if (options.resume_job_id && options.resume != "auto")
    throw UsageError("--resume-job applies to --resume auto only");
  // --device host|cuda|auto wins over the config's "device"; emulated is the test device, no config value.
  std::optional<zt::DeviceChoice> device_choice;
  if (const std::optional<std::string> device = arguments.take("device")) {
    if (*device == "emulated") {
      options.device = zt::Device::emulated();
    } else if (*device == "host" || *device == "cuda" || *device == "auto") {
      device_choice = *device == "host"   ? zt::DeviceChoice::host
                      : *device == "cuda" ? zt::DeviceChoice::cuda
                                          : zt::DeviceChoice::automatic;
    } else {
      throw UsageError("--device " + *device +
                       ": expected host, cuda, auto (this rank's GPU when one is usable, else the host) "
                       "or emulated (a stand-in device whose memory only the device API may touch, for "
                       "testing)");
    }
  }
  arguments.finish();
  auto parsed = std::make_shared<ParsedConfig>(ParsedConfig::from_file(config_path));
  if (device_choice) parsed->config.device = *device_choice;
  Job job;
  job.runtime_options = zt::runtime_options_for(parsed->config);
  // A run that will not compute on a GPU binds none: on a GPU node, binding one would make a CUDA
  // context on it in every rank for nothing.
  job.runtime_options.bind_device = !options.device && zt::device_choice_may_use_gpu(parsed->config.device);
  job.with_mpi = [parsed, options](zt::Runtime& runtime) {
    parsed->print_warnings(runtime);
    if (const std::optional<std::string> warning = forgotten_launcher_warning(runtime.world_size());
        warning && runtime.world_rank() == 0) {
      std::fprintf(stderr, "zerotrain train: warning: %s\n", warning->c_str());
    }
    try {
      const zt::TrainSummary summary = zt::train(runtime, std::move(parsed->config), options);
      return summary.preempted ? zt::kPreemptedExitCode : 0;
    } catch (const zt::NoValidCheckpointError& error) {  // thrown on every rank alike: no abort needed
      if (runtime.world_rank() == 0) std::fprintf(stderr, "zerotrain train: %s\n", error.what());
      return zt::kNoValidCheckpointExitCode;
    } catch (const zt::DeviceChoiceError& error) {  // thrown on every rank alike: no abort needed
      if (runtime.world_rank() == 0)
        std::fprintf(stderr, "zerotrain train: %s\n", plain_message(error).c_str());
      return kUsageExitCode;
    }
  };
  return job;
}

// ---- estimate ----------------------------------------------------------------------------------

Job prepare_estimate(Arguments& arguments) {
  const std::string config_path = arguments.require("config", "FILE");
  const std::optional<std::int64_t> world_size =
      arguments.take_integer("world-size", 1, std::numeric_limits<int>::max());
  if (!world_size) throw UsageError("needs --world-size N (the number of ranks to plan for)");
  const std::int64_t parameters = arguments.take_integer("params", 0).value_or(0);
  const std::optional<std::string> device = arguments.take("device");
  if (device && *device != "host" && *device != "cuda")
    throw UsageError("--device " + *device + ": expected host or cuda (where the engine trains)");
  arguments.finish();
  auto parsed = std::make_shared<ParsedConfig>(ParsedConfig::from_file(config_path));
  Job job;
  job.with_mpi = [parsed, world_size = static_cast<int>(*world_size), parameters,
                  device](zt::Runtime& runtime) {
    parsed->print_warnings(runtime);
    const zt::Config& config = parsed->config;
    // The activations are those of the engine's device: --device, else the config's "device"
    // ("auto" counts as the host, which it takes until the engine has trained on a GPU).
    const bool on_cuda = device ? *device == "cuda" : config.device == zt::DeviceChoice::cuda;
    const zt::DeviceType activations_device = on_cuda ? zt::DeviceType::cuda : zt::DeviceType::host;
    // With pipeline stages, one table per stage: each stage's ranks hold different layers.
    const int stages = static_cast<int>(config.pipeline.stage_count());
    std::vector<zt::MemoryEstimate> estimates;
    for (int stage = 0; stage < stages; ++stage)
      estimates.push_back(
          zt::estimate_model_state_memory(config, world_size, parameters, stage, activations_device));
    if (runtime.world_rank() != 0) return 0;
    if (stages > 1) {
      std::printf(
          "pipeline: %d stages x %d data-parallel rank(s) = %d ranks, partition \"%s\", schedule %s\n",
          stages, estimates.front().world_size, world_size, config.pipeline.partition.c_str(),
          config.pipeline.schedule == zt::PipelineSchedule::gpipe ? "gpipe" : "1f1b");
    }
    for (const zt::MemoryEstimate& estimate : estimates) std::fputs(estimate.table().c_str(), stdout);
    if (stages > 1) {
      const auto largest = std::max_element(estimates.begin(), estimates.end(),
                                            [](const zt::MemoryEstimate& a, const zt::MemoryEstimate& b) {
                                              return a.resident() < b.resident();
                                            });
      std::printf("largest per rank: stage %d, %llu B resident model states (%.3f GiB)\n",
                  largest->pipeline_stage, static_cast<unsigned long long>(largest->resident()),
                  static_cast<double>(largest->resident()) / (1024.0 * 1024.0 * 1024.0));
    }
    return 0;
  };
  return job;
}

// ---- plan --------------------------------------------------------------------------------------

/// `zerotrain plan` (docs/plan.md): src/cli/plan_command.cpp checks its options itself, once MPI
/// runs (a bad one: the message from rank 0, exit 2 on every rank); the config's comm.timeout_s
/// reaches the runtime as for train.
Job prepare_plan(Arguments& arguments) {
  std::vector<std::string> words = {arguments.program(), "plan"};
  for (std::string& word : arguments.take_all()) words.push_back(std::move(word));
  Job job;
  for (std::size_t i = 2; i + 1 < words.size(); ++i) {
    if (words[i] != "--config") continue;
    try {
      job.runtime_options = zt::runtime_options_for(ParsedConfig::from_file(words[i + 1]).config);
    } catch (const UsageError&) {  // plan reports the config's error itself, on every rank alike
    }
  }
  job.with_mpi = [words](zt::Runtime& runtime) mutable {
    std::vector<char*> argv;
    for (std::string& word : words) argv.push_back(word.data());
    argv.push_back(nullptr);
    return zt::cli::plan_command(runtime, static_cast<int>(words.size()), argv.data());
  };
  return job;
}

// ---- data --------------------------------------------------------------------------------------

Job prepare_data_convert(Arguments& arguments) {
  const std::vector<std::string> files = arguments.positionals({"INPUT", "OUTPUT.bin"});
  const std::optional<std::int64_t> vocab_size =
      arguments.take_integer("vocab-size", 1, std::numeric_limits<std::uint32_t>::max());
  arguments.finish();
  Job job;
  job.with_mpi = [files, vocab_size](zt::Runtime& runtime) {
    if (runtime.world_rank() == 0) {
      if (zt::is_token_data_path(files[0])) {  // any token format, one file or shards
        const zt::TokenConvertStats stats =
            zt::convert_token_files(files[0], files[1], static_cast<std::uint32_t>(vocab_size.value_or(0)));
        std::printf("converted %s: %llu file(s), %llu tokens, vocab %u -> %s\n", stats.description.c_str(),
                    static_cast<unsigned long long>(stats.files),
                    static_cast<unsigned long long>(stats.tokens), stats.vocab_size, files[1].c_str());
      } else {
        ZT_CHECK_AS(zt::ConfigError, !vocab_size, "--vocab-size is for token inputs; '", files[0],
                    "' is a text file, converted to byte tokens (vocab 256)");
        const zt::ConvertStats stats = zt::convert_text_file(files[0], files[1]);
        std::printf("converted %s: %llu bytes -> %llu tokens in %s\n", files[0].c_str(),
                    static_cast<unsigned long long>(stats.input_bytes),
                    static_cast<unsigned long long>(stats.tokens), files[1].c_str());
      }
    }
    runtime.world().barrier();
    return 0;
  };
  return job;
}

// ---- swap --------------------------------------------------------------------------------------

/// `zerotrain swap list|clean DIR`: the swap files a killed job left in DIR (rank 0).
Job swap_job(Arguments& arguments, bool clean) {
  const std::string directory = arguments.positionals({"NVME_PATH"}).front();
  arguments.finish();
  Job job;
  job.with_mpi = [directory, clean](zt::Runtime& runtime) {
    if (runtime.world_rank() == 0) {
      const std::vector<zt::SwapFileEntry> files = zt::list_swap_files(directory);
      std::size_t removed = 0;
      for (const zt::SwapFileEntry& file : files) {
        const std::string owner =
            file.host.empty() ? std::string("custom job id") : file.host + " pid " + std::to_string(file.pid);
        const char* state = file.stale ? "stale (its process is gone)" : "in use or not known to be stale";
        if (clean && file.stale) {
          fs::remove(file.path);
          ++removed;
          state = "removed (its process was gone)";
        }
        std::printf("%s  %llu bytes  rank %d  %s  %s\n", file.path.string().c_str(),
                    static_cast<unsigned long long>(file.bytes), file.rank, owner.c_str(), state);
      }
      if (clean) {
        std::printf(
            "zerotrain swap clean: removed %zu of %zu swap file(s) in %s; files of other hosts or of "
            "running processes are kept\n",
            removed, files.size(), directory.c_str());
      } else if (files.empty()) {
        std::printf("no zerotrain swap files in %s\n", directory.c_str());
      }
      std::fflush(stdout);
    }
    runtime.world().barrier();
    return 0;
  };
  return job;
}
Job prepare_swap_list(Arguments& arguments) {
  return swap_job(arguments, false);
}
Job prepare_swap_clean(Arguments& arguments) {
  return swap_job(arguments, true);
}

// ---- checkpoint --------------------------------------------------------------------------------

/// A checkpoint directory, tag or file that is not there (`zerotrain checkpoint` exits 3).
class CheckpointNotFound : public zt::IoError {
 public:
  using IoError::IoError;
};

std::string tag_listing(const std::string& dir, const std::vector<std::string>& tags) {
  if (tags.empty()) return "'" + dir + "' holds no checkpoint";
  std::string text = "checkpoints in '" + dir + "': ";
  for (std::size_t i = 0; i < tags.size(); ++i) text += (i ? ", " : "") + tags[i];
  return text;
}

/// The file `zerotrain checkpoint` reads: DIR/TAG.h5, TAG from DIR/latest unless --tag; DIR may
/// also name a checkpoint file.
std::string resolve_checkpoint(const std::string& dir, const std::optional<std::string>& tag) {
  if (fs::is_regular_file(dir)) {
    ZT_CHECK_AS(zt::ConfigError, !tag, "--tag ", *tag, " needs a checkpoint directory; '", dir,
                "' is a file");
    return dir;
  }
  ZT_CHECK_AS(CheckpointNotFound, fs::exists(dir), "checkpoint directory '", dir, "' does not exist");
  ZT_CHECK_AS(CheckpointNotFound, fs::is_directory(dir), "'", dir,
              "' is neither a checkpoint directory nor a checkpoint file");
  const std::vector<std::string> tags = zt::checkpoint_tags_newest_first(dir);
  std::string chosen;
  if (tag) {
    ZT_CHECK_AS(zt::ConfigError, zt::is_checkpoint_tag(*tag), "--tag '", *tag,
                "': expected a tag name (the file name without .h5), not a path");
    chosen = *tag;
  } else {
    const std::optional<std::string> latest = zt::latest_checkpoint_tag(dir);
    ZT_CHECK_AS(CheckpointNotFound, latest.has_value(), "no file '", (fs::path(dir) / "latest").string(),
                "' names the newest checkpoint; pass --tag TAG (", tag_listing(dir, tags), ")");
    chosen = *latest;
  }
  const std::string path = zt::checkpoint_file(dir, chosen);
  ZT_CHECK_AS(CheckpointNotFound, fs::is_regular_file(path), "checkpoint '", chosen, "' not found: no file '",
              path, "' (", tag_listing(dir, tags), ")");
  return path;
}

using zt::base::byte_size_text;
using zt::base::shape_text;

void print_summary(const zt::CheckpointSummary& summary, const std::string& dir) {
  const auto row = [](const char* key, const std::string& value) {
    std::printf("%-16s%s\n", key, value.c_str());
  };
  row("file", summary.path + " (" + byte_size_text(summary.file_bytes) + ", " +
                  std::to_string(summary.file_bytes) + " B)");
  std::string tag = summary.tag;
  try {
    if (fs::is_directory(dir) && zt::latest_checkpoint_tag(dir) == summary.tag) tag += " (latest)";
  } catch (const zt::IoError&) {  // a `latest` that names no tag names not this one
  }
  row("tag", tag);
  row("format", std::string(zt::kCheckpointFormat) + " version " + std::to_string(summary.format_version));
  row("global steps", std::to_string(summary.global_steps));
  row("global samples", std::to_string(summary.global_samples));
  row("saved at", "world size " + std::to_string(summary.world_size) + ", ZeRO stage " +
                      std::to_string(summary.zero_stage) + " (loads at any world size and stage)" +
                      (summary.slurm_job_id.empty() ? "" : ", by Slurm job " + summary.slurm_job_id));
  row("compute dtype", summary.compute_dtype + " (parameters and optimizer states stored in fp32)");
  row("optimizer", summary.optimizer.empty()
                       ? std::string("none")
                       : summary.optimizer + ", step " + std::to_string(summary.optimizer_step));
  std::size_t tensors = 0;
  for (const zt::CheckpointDataset& dataset : summary.datasets)
    tensors += dataset.name.rfind("model/", 0) == 0;
  row("parameters",
      std::to_string(summary.parameters) + " elements in " + std::to_string(tensors) + " tensors");
  row("client state", summary.client_state);
  if (fs::is_directory(dir)) row("in directory", tag_listing(dir, zt::checkpoint_tags_newest_first(dir)));

  std::size_t name_width = 7;
  std::size_t shape_width = 5;
  for (const zt::CheckpointDataset& dataset : summary.datasets) {
    name_width = std::max(name_width, dataset.name.size());
    shape_width = std::max(shape_width, shape_text(dataset.shape).size());
  }
  const int name_w = static_cast<int>(name_width);
  const int shape_w = static_cast<int>(shape_width);
  std::printf("\n%-*s  %-*s  %-5s  %20s\n", name_w, "dataset", shape_w, "shape", "dtype", "checksum");
  std::uint64_t stored = 0;
  for (const zt::CheckpointDataset& dataset : summary.datasets) {
    std::int64_t count = 1;
    for (std::int64_t d : dataset.shape) count *= d;
    stored += static_cast<std::uint64_t>(count) * (dataset.dtype == "int64" ? 8u : 4u);
    std::printf("%-*s  %-*s  %-5s  %20llu\n", name_w, dataset.name.c_str(), shape_w,
                shape_text(dataset.shape).c_str(), dataset.dtype.c_str(),
                static_cast<unsigned long long>(dataset.checksum));
  }
  std::printf("%zu datasets, %s of data\n", summary.datasets.size(), byte_size_text(stored).c_str());
}

enum class CheckpointAction { inspect, verify, export_weights };

/// zerotrain checkpoint inspect|verify|export DIR [--tag T] [--out FILE.h5] [--dtype fp32|bf16]:
/// rank 0 alone reads the file (no collective), every rank exits with its code.
Job checkpoint_job(Arguments& arguments, CheckpointAction action) {
  const std::string dir = arguments.positionals({"DIR"}).front();
  const std::optional<std::string> tag = arguments.take("tag");
  std::optional<std::string> out;
  zt::DType dtype = zt::DType::fp32;
  if (action == CheckpointAction::export_weights) {
    out = arguments.take("out");
    if (!out) throw UsageError("export needs --out FILE.h5");
    const std::string dtype_name = arguments.take("dtype").value_or("fp32");
    if (dtype_name != "fp32" && dtype_name != "bf16")
      throw UsageError("--dtype must be fp32 or bf16, got '" + dtype_name + "'");
    dtype = dtype_name == "bf16" ? zt::DType::bf16 : zt::DType::fp32;
  }
  arguments.finish();
  Job job;
  job.with_mpi = [=](zt::Runtime& runtime) {
    int code = 0;
    if (runtime.world_rank() == 0) {
      const char* who = action == CheckpointAction::inspect  ? "zerotrain checkpoint inspect"
                        : action == CheckpointAction::verify ? "zerotrain checkpoint verify"
                                                             : "zerotrain checkpoint export";
      try {
        if (out) {
          const fs::path parent = fs::absolute(*out).parent_path();
          ZT_CHECK_AS(CheckpointNotFound, fs::is_directory(parent), "cannot write '", *out, "': directory '",
                      parent.string(), "' does not exist");
        }
        const std::string path = resolve_checkpoint(dir, tag);
        if (action == CheckpointAction::inspect) {
          print_summary(zt::inspect_checkpoint(path), dir);
        } else if (action == CheckpointAction::verify) {
          zt::verify_checkpoint(path);
          const zt::CheckpointSummary summary = zt::inspect_checkpoint(path);
          std::printf("OK %s: tag %s, global step %lld, %zu datasets, every checksum matches\n", path.c_str(),
                      summary.tag.c_str(), static_cast<long long>(summary.global_steps),
                      summary.datasets.size());
        } else {
          zt::verify_checkpoint(path);
          zt::export_checkpoint(path, *out, dtype);
          const zt::CheckpointSummary summary = zt::inspect_checkpoint(path);
          std::printf("exported %lld parameter elements (%s) of %s (tag %s, global step %lld) to %s\n",
                      static_cast<long long>(summary.parameters), std::string(zt::dtype_name(dtype)).c_str(),
                      path.c_str(), summary.tag.c_str(), static_cast<long long>(summary.global_steps),
                      out->c_str());
        }
      } catch (const zt::ConfigError& error) {
        std::fprintf(stderr, "%s: %s\n", who, plain_message(error).c_str());
        code = kUsageExitCode;
      } catch (const CheckpointNotFound& error) {
        std::fprintf(stderr, "%s: %s\n", who, plain_message(error).c_str());
        code = 3;
      } catch (const std::exception& error) {  // zt::IoError, std::filesystem_error, ...
        std::fprintf(stderr, "%s: FAILED: %s\n", who, plain_message(error).c_str());
        code = 1;
      }
      std::fflush(stdout);
    }
    runtime.world().broadcast(&code, 1, zt::DType::int32, 0);
    return code;
  };
  return job;
}
Job prepare_checkpoint_inspect(Arguments& arguments) {
  return checkpoint_job(arguments, CheckpointAction::inspect);
}
Job prepare_checkpoint_verify(Arguments& arguments) {
  return checkpoint_job(arguments, CheckpointAction::verify);
}
Job prepare_checkpoint_export(Arguments& arguments) {
  return checkpoint_job(arguments, CheckpointAction::export_weights);
}

/// zerotrain checkpoint import WEIGHTS.h5 --config C --out DIR [--tag T]: collective, every rank
/// builds C's model and writes its part of the step-0 checkpoint (src/cli/checkpoint_import.cpp).
Job prepare_checkpoint_import(Arguments& arguments) {
  const std::string weights = arguments.positionals({"WEIGHTS.h5"}).front();
  const std::string config_path = arguments.require("config", "FILE");
  const std::string out = arguments.require("out", "DIR");
  const std::optional<std::string> tag = arguments.take("tag");
  arguments.finish();
  auto parsed = std::make_shared<ParsedConfig>(ParsedConfig::from_file(config_path));
  Job job;
  job.runtime_options = zt::runtime_options_for(parsed->config);
  job.with_mpi = [parsed, weights, out, tag](zt::Runtime& runtime) {
    parsed->print_warnings(runtime);
    return zt::cli::checkpoint_import(runtime, weights, std::move(parsed->config), out, tag);
  };
  return job;
}

// ---- plot --------------------------------------------------------------------------------------

/// `zerotrain plot ...`: the zerotrain-plot script installed next to this executable takes over
/// the process (no MPI) and checks the arguments itself (argparse: exit 2 on a bad one).
Job prepare_plot(Arguments& arguments) {
  Job job;
  job.without_mpi = [words = arguments.take_all()]() mutable {
    std::error_code error;
    const fs::path self = fs::read_symlink("/proc/self/exe", error);
    std::string script = (self.parent_path() / "zerotrain-plot").string();
    std::vector<char*> argv = {script.data()};
    for (std::string& word : words) argv.push_back(word.data());
    argv.push_back(nullptr);
    execv(script.c_str(), argv.data());
    std::fprintf(stderr, "zerotrain plot: cannot run '%s': %s\n", script.c_str(), std::strerror(errno));
    return 1;
  };
  return job;
}

// ---- help, version ---------------------------------------------------------------------------

Job prepare_help(Arguments& arguments);
Job prepare_version(Arguments& arguments);

constexpr std::string_view kCheckpointExitCodes =
    "DIR/TAG.h5 is read, TAG from DIR/latest unless --tag; DIR may be a .h5 file. One process (no\n"
    "mpirun needed). Exit status: 0 ok, 1 damaged or unreadable checkpoint or failed write, 2 bad\n"
    "arguments, 3 not found.\n";

// The commands, in the order `zerotrain help` lists them. A name with a space is a subcommand of
// the group its first word names ("zerotrain checkpoint --help" lists the group).
const Command kCommands[] = {
    {"report", "[--config FILE]", "MPI, CUDA/NCCL, HDF5 and I/O capabilities of this build and machine",
     "Prints the build (version, type, compiler), the MPI library, thread level, ranks and nodes, UCX\n"
     "and the pml in use, CUDA/NCCL, HDF5 (parallel or not), io_uring and libaio, the host kernels'\n"
     "ISA path and OpenMP waiting (OMP_WAIT_POLICY/GOMP_SPINCOUNT, or zerotrain's default), and the\n"
     "watchdog's collective timeout with its source (ZT_COLLECTIVE_TIMEOUT, or FILE's comm.timeout_s).\n"
     "Run it under mpirun/srun to see what a job gets.\n"
     "\n"
     "options:\n"
     "  --config FILE            a ds_config JSON file: checked, and its comm.timeout_s used\n",
     prepare_report},
    {"train", "--config FILE [options]",
     "train the model a config describes (under mpirun/srun: data parallel)",
     "Trains the model of the config's \"model\" section on its data until global step N. Run it under\n"
     "mpirun/srun for data parallelism (the batch rule resolves against the ranks; docs/engine.md).\n"
     "\n"
     "options:\n"
     "  --config FILE            the ds_config JSON file (examples/configs/); required\n"
     "  --steps N                train until the global optimizer step reaches N (default 100)\n"
     "  --data PATH              the training data: token data (ZTTOKENS, .npy, llm.c, Megatron, shards)\n"
     "                           or a text file (default: the config's \"data\", else the built-in\n"
     "                           corpus; docs/data.md)\n"
     "  --eval-data PATH         validation loss on PATH's first eval.batches global batches, every\n"
     "                           eval.interval steps and at the end (docs/config.md, \"eval\")\n"
     "  --print-every N          a progress line every N steps (default: steps_per_print, else 10;\n"
     "                           0: none): step i/N, loss, lr, tok/s, MFU, memory, elapsed and ETA\n"
     "  --metrics PATH           JSON-lines metrics, written by rank 0 (docs/metrics.md)\n"
     "  --peak-flops F           one rank's peak FLOP/s for the MFU (e.g. 989e12 for an H100's bf16);\n"
     "                           default: a tabled GPU's data-sheet figure, else measured by a\n"
     "                           matmul probe at start-up (docs/metrics.md)\n"
     "  --device host|cuda|auto|emulated\n"
     "                           where the model's state lives and the kernels run (default: the\n"
     "                           config's \"device\", else auto: this rank's GPU when one is usable\n"
     "                           and the CUDA engine has been verified on a GPU (zerotrain report,\n"
     "                           \"gpu path\"), else the host; cuda: one GPU per node-local rank;\n"
     "                           emulated: the test device that only the device API may touch;\n"
     "                           docs/gpu.md)\n"
     "checkpoints (docs/checkpoint-format.md):\n"
     "  --save-dir DIR           save every K steps, at the end, and on SIGTERM/SIGUSR1 (then exit 75)\n"
     "  --save-interval K        steps between saves (default: checkpoint.save_interval; 0: none)\n"
     "  --keep-last K            keep the newest K checkpoints (default: checkpoint.keep_last; 0: all)\n"
     "  --resume auto|DIR|DIR/TAG.h5\n"
     "                           auto: the newest valid checkpoint in --save-dir (none there: start\n"
     "                           afresh); DIR: its latest; DIR/TAG.h5: that one\n"
     "  --resume-job ID          with --resume auto: load only a checkpoint saved by Slurm job ID\n"
     "                           (each save records SLURM_JOB_ID; jobscripts/slurm.sbatch passes it)\n"
     "\n"
     "Exit status: 0 done; 2 bad arguments or config (every rank, no abort); 74 --resume auto found\n"
     "checkpoints but none valid; 75 stopped by SIGTERM/SIGUSR1 (requeue and --resume auto); 86/87\n"
     "the watchdog: a hung collective or a lost rank (docs/fault-detection.md); 1 any other error\n"
     "(the job is aborted).\n",
     prepare_train},
    {"estimate", "--config FILE --world-size N [--params P] [--device host|cuda]",
     "model-state memory per rank at a world size, by the ZeRO formulas",
     "Prints the engine's partition plan for N ranks: parameters, gradients and optimizer states per\n"
     "rank at the config's ZeRO stage and dtypes, and what offload moves off the device (with\n"
     "pipeline.stages: one table per stage, over N / stages data-parallel ranks). No MPI job needed.\n"
     "\n"
     "options:\n"
     "  --config FILE            the ds_config JSON file; required\n"
     "  --world-size N           the number of ranks to plan for; required\n"
     "  --params P               the parameter count (default: the config's model's)\n"
     "  --device host|cuda       whose memory the activations are in (default: the config's \"device\";\n"
     "                           auto counts as the host): on a GPU the micro-batches stay on the host,\n"
     "                           and cpu_checkpointing keeps the checkpoints' inputs there\n",
     prepare_estimate},
    {"plan", "--config FILE [options]",
     "measure the configurations that fit and write the fastest as a config (under mpirun)",
     "Run under mpirun at the world size to plan for (docs/plan.md): predicts each candidate's memory,\n"
     "prunes what exceeds --memory-limit, times the rest, ranks them by tokens/s, checks the chosen one\n"
     "against 1 rank, a save, resumes and an export, and writes DIR/plan.json (for train --config) and\n"
     "DIR/plan-report.md|json.\n"
     "\n"
     "options:\n"
     "  --config FILE            the ds_config JSON file to start from; required\n"
     "  --global-batch B         the global batch to keep (default: the config's train_batch_size)\n"
     "  --memory-limit SIZE      bytes per rank, such as 2GiB (default: what the host has per rank)\n"
     "  --candidates SPEC        \"stage=0,1,2,3;offload=none,cpu,cpu+params;micro=4,8\"\n"
     "  --data PATH              overrides the config's data.path\n"
     "  --out DIR                where plan.json and the reports go (default plan)\n"
     "  --warmup-steps N         per candidate, not timed (default 1)\n"
     "  --measure-steps N        per candidate, timed; the median is ranked (default 3)\n"
     "  --check-steps N          of the baseline and resume checks (default 8)\n"
     "  --resume-world-size N    the second resume's world size (default: half; 0: none)\n"
     "\n"
     "Exit status: 0 planned; 2 bad options or config (every rank, no abort); 1 nothing fits, or an\n"
     "error.\n",
     prepare_plan},
    {"data convert", "INPUT OUTPUT.bin [--vocab-size N]", "a text file or token shards to one ZTTOKENS file",
     "Writes OUTPUT.bin, a ZTTOKENS file for `zerotrain train --data` (docs/data.md). INPUT: a text\n"
     "file, whose bytes become the tokens (vocab 256); or token data (.npy, llm.c .bin, Megatron .bin +\n"
     ".idx, ZTTOKENS; a directory or glob of shards).\n"
     "\n"
     "options:\n"
     "  --vocab-size N           token inputs: the vocabulary (default: the largest token + 1)\n",
     prepare_data_convert},
    {"checkpoint inspect", "DIR [--tag T]",
     "what a checkpoint holds: counters, layout, optimizer, every dataset",
     "Prints the counters, the world size and ZeRO stage it was saved at, the optimizer, and every\n"
     "dataset with its shape and checksum.\n"
     "\n"
     "options:\n"
     "  --tag T                  the checkpoint DIR/T.h5 (default: the one DIR/latest names)\n",
     prepare_checkpoint_inspect},
    {"checkpoint verify", "DIR [--tag T]", "check every dataset's checksum: OK, or the damaged dataset",
     "options:\n"
     "  --tag T                  the checkpoint DIR/T.h5 (default: the one DIR/latest names)\n",
     prepare_checkpoint_verify},
    {"checkpoint export", "DIR [--tag T] --out FILE.h5 [--dtype fp32|bf16]",
     "the parameters alone, by name and shape, in a plain HDF5 file",
     "The checksums are verified first (docs/checkpoint-format.md, \"Export\").\n"
     "\n"
     "options:\n"
     "  --tag T                  the checkpoint DIR/T.h5 (default: the one DIR/latest names)\n"
     "  --out FILE.h5            the file to write; required\n"
     "  --dtype fp32|bf16        the dtype of the exported parameters (default fp32)\n",
     prepare_checkpoint_export},
    {"checkpoint import", "WEIGHTS.h5 --config FILE --out DIR [--tag T]",
     "named tensors (the export's layout) as a step-0 checkpoint of a config's model",
     "Builds the config's model on every rank, loads WEIGHTS.h5 (a plain HDF5 of named tensors, the\n"
     "layout of `checkpoint export`; scripts/zerotrain_torch.py convert writes one from PyTorch or a\n"
     "Hugging Face GPT-2) and saves it as DIR/TAG.h5 at global step 0, which resumes at any world size\n"
     "and ZeRO stage (docs/checkpoint-format.md, \"Import\"). Collective: run it under mpirun or alone.\n"
     "\n"
     "options:\n"
     "  --config FILE            the ds_config JSON file whose model the weights are for; required\n"
     "  --out DIR                the checkpoint directory to write; required\n"
     "  --tag T                  the checkpoint's tag (default global_step0)\n"
     "\n"
     "Exit status: 0 imported; 1 a file that does not fit the model, unreadable or not writable; 2 bad\n"
     "options or config.\n",
     prepare_checkpoint_import},
    {"swap list", "NVME_PATH", "the swap files in NVME_PATH, with their host and process",
     "Lists zerotrain's swap files (NVMe offload) in NVME_PATH: size, rank, host and pid, and whether\n"
     "the process that made them is gone. One process.\n",
     prepare_swap_list},
    {"swap clean", "NVME_PATH", "remove the swap files killed jobs left in NVME_PATH on this host",
     "Removes the swap files of NVME_PATH whose process is gone on this host; files of other hosts\n"
     "and of running processes are kept. One process.\n",
     prepare_swap_clean},
    {"plot", "RUN.jsonl [MORE.jsonl ...] --out DIR [--label NAME ...]",
     "PNGs of metrics files, runs compared",
     "Writes DIR/loss.png, lr.png, tokens_per_s.png, memory.png and comm_wait.png, every run a line\n"
     "(named by its file or --label, one per run). Runs the zerotrain-plot script next to this\n"
     "executable (needs Python and matplotlib), without MPI (docs/metrics.md).\n",
     prepare_plot},
    {"help", "[COMMAND]", "this page, or a command's usage (the same as 'zerotrain COMMAND --help')", "",
     prepare_help},
    {"version", "", "the version of zerotrain (also --version)", "", prepare_version},
};

std::string_view group_of(const Command& command) {
  return command.name.substr(0, command.name.find(' '));
}

/// The command `words` name (one word, or a group and its subcommand), or none.
const Command* find_command(std::span<char* const> words, std::size_t& used) {
  for (const Command& command : kCommands) {
    const std::size_t space = command.name.find(' ');
    if (space == std::string_view::npos) {
      if (!words.empty() && words[0] == command.name) {
        used = 1;
        return &command;
      }
    } else if (words.size() > 1 && words[0] == command.name.substr(0, space) &&
               words[1] == command.name.substr(space + 1)) {
      used = 2;
      return &command;
    }
  }
  return nullptr;
}

bool is_group(std::string_view word) {
  return std::any_of(std::begin(kCommands), std::end(kCommands), [&](const Command& command) {
    return command.name.find(' ') != std::string_view::npos && group_of(command) == word;
  });
}

std::string command_usage(const Command& command) {
  std::string text = "usage: zerotrain " + std::string(command.name);
  if (!command.synopsis.empty()) text += " " + std::string(command.synopsis);
  text += "\n" + std::string(1, static_cast<char>(std::toupper(command.summary[0]))) +
          std::string(command.summary.substr(1)) + ".\n";
  if (!command.details.empty()) text += "\n" + std::string(command.details);
  if (group_of(command) == "checkpoint") text += "\n" + std::string(kCheckpointExitCodes);
  return text;
}

std::string group_usage(std::string_view group) {
  std::string names;
  std::string lines;
  for (const Command& command : kCommands) {
    if (command.name.find(' ') == std::string_view::npos || group_of(command) != group) continue;
    names += (names.empty() ? "" : "|") + std::string(command.name.substr(group.size() + 1));
    lines += "  zerotrain " + std::string(command.name) + " " + std::string(command.synopsis) + "\n      " +
             std::string(command.summary) + "\n";
  }
  return "usage: zerotrain " + std::string(group) + " <" + names + "> ...\n\n" + lines + "\n'zerotrain " +
         std::string(group) + " SUBCOMMAND --help' shows a subcommand's options.\n";
}

std::string global_usage() {
  std::string text = "usage: zerotrain <command> [options]\n\ncommands:\n";
  for (const Command& command : kCommands) {
    const std::string name = std::string(command.name) + (command.name == "help" ? " [COMMAND]" : "");
    char line[256];
    std::snprintf(line, sizeof line, "  %-20s %s\n", name.c_str(), std::string(command.summary).c_str());
    text += line;
  }
  return text +
         "\n'zerotrain COMMAND --help' (or 'zerotrain help COMMAND') shows a command's options and exit\n"
         "codes; 'zerotrain --version' the version. Exit status 2: bad arguments or config file.\n";
}

std::string subcommand_list(std::string_view group) {
  std::string names;
  for (const Command& command : kCommands) {
    if (command.name.find(' ') != std::string_view::npos && group_of(command) == group)
      names += (names.empty() ? "" : ", ") + std::string(command.name.substr(group.size() + 1));
  }
  return names;
}

/// Text for stdout on rank 0 of the launch (the other ranks of `mpirun zerotrain --help` are quiet).
int print_on_rank0(const std::string& text) {
  if (launch_from_environment().rank0()) std::fputs(text.c_str(), stdout);
  return 0;
}

Job prepare_help(Arguments& arguments) {
  const std::vector<std::string> words = arguments.take_all();
  std::string text;
  if (words.empty()) {
    text = global_usage();
  } else {
    std::vector<char*> pointers;
    for (const std::string& word : words) pointers.push_back(const_cast<char*>(word.c_str()));
    std::size_t used = 0;
    if (const Command* command = find_command(pointers, used); command && used == words.size()) {
      text = command_usage(*command);
    } else if (words.size() == 1 && is_group(words[0])) {
      text = group_usage(words[0]);
    } else {
      std::string name;
      for (const std::string& word : words) name += (name.empty() ? "" : " ") + word;
      throw UsageError("no command '" + name + "'");
    }
  }
  Job job;
  job.without_mpi = [text] { return print_on_rank0(text); };
  return job;
}

/// "zerotrain 0.1.0": the project version of the CMake build.
std::string version_text() {
  return std::string("zerotrain ") + zt::build_info::version + "\n";
}

Job prepare_version(Arguments& arguments) {
  arguments.finish();
  Job job;
  job.without_mpi = [] { return print_on_rank0(version_text()); };
  return job;
}

// ---- main --------------------------------------------------------------------------------------

bool is_help_flag(std::string_view word) {
  return word == "--help" || word == "-h";
}

/// The command line, checked before MPI starts: the job, or the text of an error and its exit code
/// (a usage error's; 1 for anything else a prepare function threw).
struct Prepared {
  std::string who = "zerotrain";  // what error lines start with
  Job job;
  std::optional<std::string> error;  // printed on stderr, then exit error_code
  int error_code = kUsageExitCode;
};

Job print_job(std::string text) {
  Job job;
  job.without_mpi = [text = std::move(text)] { return print_on_rank0(text); };
  return job;
}

Prepared prepare(std::string_view program, std::span<char* const> words) {
  Prepared prepared;
  std::string hint = "zerotrain help";
  try {
    if (words.empty()) {
      prepared.error = global_usage();
      return prepared;
    }
    const std::string_view first = words[0];
    if (is_help_flag(first)) {
      prepared.job = print_job(global_usage());
      return prepared;
    }
    if (first == "--version") {
      prepared.job = print_job(version_text());
      return prepared;
    }
    std::size_t used = 0;
    const Command* command = find_command(words, used);
    if (command == nullptr) {
      if (!is_group(first)) throw UsageError("unknown command '" + std::string(first) + "'");
      prepared.who = "zerotrain " + std::string(first);
      hint = prepared.who + " --help";
      if (words.size() > 1 && is_help_flag(words[1])) {
        prepared.job = print_job(group_usage(first));
        return prepared;
      }
      if (words.size() == 1) throw UsageError("missing subcommand: one of " + subcommand_list(first));
      throw UsageError("unknown subcommand '" + std::string(words[1]) + "': expected one of " +
                       subcommand_list(first));
    }
    prepared.who = "zerotrain " + std::string(command->name);
    hint = command->name == "help" ? std::string("zerotrain help") : prepared.who + " --help";
    const std::span<char* const> rest = words.subspan(used);
    if (std::any_of(rest.begin(), rest.end(), is_help_flag)) {
      prepared.job = print_job(command_usage(*command));
      return prepared;
    }
    Arguments arguments(std::string(program), rest);
    prepared.job = command->prepare(arguments);
  } catch (const UsageError& error) {
    std::string text;
    for (const std::string& note : error.notes()) text += note + "\n";
    text += prepared.who + ": " + error.what() + (error.hint() ? " (see '" + hint + "')" : "") + "\n";
    prepared.error = std::move(text);
  } catch (const std::exception& error) {  // not a usage error: an I/O error reading the config, say
    prepared.error = prepared.who + ": " + plain_message(error) + "\n";
    prepared.error_code = 1;
  }
  return prepared;
}

/// The exit code every rank ends with when a rank found an error before MPI started (all of them
/// did, when the command line was wrong; some, when the config file reads differently on some
/// nodes): the lowest such rank prints its error, and its code goes to all, without MPI_Abort. One
/// all-reduce on every run.
std::optional<int> early_exit_of_some_rank(zt::Runtime& runtime, const Prepared& prepared) {
  const int size = runtime.world_size();
  std::int32_t lowest = prepared.error ? size - runtime.world_rank() : 0;  // max: the lowest rank
  runtime.world().all_reduce(&lowest, &lowest, 1, zt::DType::int32, zt::ReduceOp::max);
  if (lowest == 0) return std::nullopt;
  const int printing = size - lowest;
  std::int32_t code = prepared.error_code;
  if (runtime.world_rank() == printing) {
    std::fputs(prepared.error->c_str(), stderr);
    std::fflush(stderr);
  }
  // After the line is out: no rank exits (and mpirun ends the job) before it.
  runtime.world().broadcast(&code, 1, zt::DType::int32, printing);
  return code;
}

/// Test hook (docs/testing.md, tests/slurm): with ZT_FAULT_INJECTION=hold_before_mpi_init:FILE, rank
/// 0 of a job waits before MPI starts while FILE exists, until a stop signal comes (60 s at most),
/// so that a test can signal one rank during start-up.
void hold_before_mpi_init() {
  const char* fault = std::getenv("ZT_FAULT_INJECTION");
  constexpr std::string_view kHook = "hold_before_mpi_init:";
  if (fault == nullptr || !std::string_view(fault).starts_with(kHook)) return;
  const fs::path file(std::string_view(fault).substr(kHook.size()));
  if (!launch_from_environment().rank0() || !fs::exists(file)) return;
  std::printf(
      "zerotrain: test hook: pid %d holds before MPI starts while %s exists (until SIGTERM/SIGUSR1)\n",
      static_cast<int>(getpid()), file.c_str());
  std::fflush(stdout);
  for (int waited = 0; waited < 600 && zt::StopSignalScope::received() == 0 && fs::exists(file); ++waited)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
}

}  // namespace

int main(int argc, char** argv) {
  // First, before OpenMP is used and before the signal scope below: may execute this program again
  // (with the default OMP_WAIT_POLICY), and the scope then starts in the new program.
  zt::cli::apply_openmp_wait_default(argv);
  const bool train = argc > 1 && std::string_view(argv[1]) == "train";
  // `zerotrain train` records SIGTERM/SIGUSR1 from its first instruction: a preemption while MPI
  // starts or a checkpoint loads then ends in exit 75 (requeue), not in a killed job.
  std::optional<zt::StopSignalScope> stop_signals;
  if (train) stop_signals.emplace();
  const Prepared prepared = prepare(argc > 0 ? argv[0] : "zerotrain",
                                    std::span<char* const>(argv + 1, static_cast<std::size_t>(argc - 1)));
  if (!prepared.error && prepared.job.without_mpi) return prepared.job.without_mpi();
  // A usage error of a process started alone: no MPI at all. In a job of several processes MPI
  // starts, so that one rank prints it and all end with exit 2 together (exiting before MPI_Init,
  // the ranks would race mpirun's kill of the job: the printing rank may be the one killed).
  if (prepared.error && launch_from_environment().size == 1) {
    std::fputs(prepared.error->c_str(), stderr);
    return prepared.error_code;
  }
  if (train) hold_before_mpi_init();
  zt::Runtime runtime(&argc, &argv, prepared.job.runtime_options);
  return zt::run_and_report([&]() -> int {
    if (const std::optional<int> code = early_exit_of_some_rank(runtime, prepared)) return *code;
    try {
      return prepared.job.with_mpi(runtime);
    } catch (const zt::ConfigError& error) {
      // Found after MPI started, where other ranks may be elsewhere: the job is aborted
      // (run_and_report). A process alone has nobody waiting for it: the usage error's exit.
      if (runtime.world_size() != 1) throw;
      std::fprintf(stderr, "%s: %s\n", prepared.who.c_str(), plain_message(error).c_str());
      return kUsageExitCode;
    }
  });
}
