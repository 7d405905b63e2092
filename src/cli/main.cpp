// The `zerotrain` command.
//   zerotrain report                         what this build and machine offer
//   zerotrain train --config FILE [...]      train the model a config describes
//   zerotrain data convert IN OUT            text file or token shards -> ZTTOKENS file
//   zerotrain checkpoint inspect|verify|export DIR [--tag T] ...   checkpoint files, one process
//   zerotrain checkpoint import WEIGHTS --config C --out DIR       weights in, collective
//   zerotrain swap list|clean NVME_PATH      swap files left by killed jobs
//   zerotrain plot RUN.jsonl... --out DIR    PNGs of metrics (runs the zerotrain-plot script)
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <unistd.h>

#include "base/text.hpp"
#include "src/cli/checkpoint_import.hpp"
#include "src/cli/plan_command.hpp"
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

constexpr const char* kUsage =
    "usage: zerotrain <command> [options]\n"
    "commands:\n"
    "  report [--config FILE]     MPI, CUDA/NCCL, HDF5 and I/O capabilities of this build and machine;\n"
    "                             the watchdog's timeout, from ZT_COLLECTIVE_TIMEOUT or FILE's "
    "comm.timeout_s\n"
    "  train --config FILE [--data PATH] [--steps N] [--metrics PATH] [--print-every N]\n"
    "                             train the model of the config's \"model\" section (run under mpirun/srun\n"
    "                             for data parallelism); --steps: train until global step N (default 100)\n"
    "        [--save-dir DIR] [--save-interval K] [--keep-last K] [--resume auto|DIR|DIR/TAG.h5]\n"
    "                             checkpoints every K steps, at the end, and on SIGTERM/SIGUSR1 (then\n"
    "                                                          exit 75); --resume auto: the newest valid "
    "checkpoint in --save-dir\n"
    "        [--eval-data PATH]   validation loss on PATH's first eval.batches global batches, every\n"
    "                             eval.interval steps and at the end (docs/config.md, \"eval\")\n"
    "        [--resume-job ID]    with --resume auto: load only a checkpoint saved by Slurm job ID\n"
    "                             (each save records SLURM_JOB_ID; jobscripts/slurm.sbatch passes it)\n"
    "        [--device host|emulated]\n"
    "                             where the model's state lives (emulated: the test device, see\n"
    "                             docs/architecture.md)\n"
    "  estimate --config FILE --world-size N [--params P]\n"
    "                             model-state memory per rank: the engine's partition plan, by the ZeRO "
    "formulas\n"
    "                             (with pipeline.stages: per stage, over N / stages data-parallel ranks)\n"
    "  plan --config FILE [--global-batch B] [--memory-limit SIZE] [--candidates SPEC]\n"
    "       [--data PATH] [--out DIR] [--warmup-steps N] [--measure-steps N] [--check-steps N]\n"
    "       [--resume-world-size N]\n"
    "                             under mpirun at the world size to plan for: predict each candidate's\n"
    "                             memory (SPEC \"stage=0,1,2,3;offload=none,cpu,cpu+params;micro=4,8\",\n"
    "                             SIZE 2GiB), prune what exceeds SIZE, time the rest, rank by tokens/s;\n"
    "                             check the chosen one against 1 rank, a save, resumes and an export;\n"
    "                             write DIR/plan.json (train --config) and DIR/plan-report.md|json\n"
    "  data convert IN OUT [--vocab-size N]\n"
    "                             IN: a text file -> byte tokens (vocab 256); or token data (.npy, llm.c\n"
    "                             .bin, Megatron .bin + .idx, ZTTOKENS; a directory or glob of shards)\n"
    "                             -> one ZTTOKENS file (vocab N, default the largest token + 1)\n"
    "  checkpoint inspect DIR [--tag T]\n"
    "                             what a checkpoint holds: counters, world size and ZeRO stage it was\n"
    "                             saved at, optimizer, every dataset with shape and checksum\n"
    "  checkpoint verify DIR [--tag T]\n"
    "                             check every dataset's checksum; prints OK or the damaged dataset\n"
    "  checkpoint export DIR [--tag T] --out FILE.h5 [--dtype fp32|bf16]\n"
    "                             the parameters alone, by name and shape, in a plain HDF5 file\n"
    "                             (checksums verified first)\n"
    "  checkpoint import WEIGHTS.h5 --config C --out DIR [--tag T]\n"
    "                             named tensors (the export's layout) as a step-0 checkpoint of C's\n"
    "                             model in DIR (tag global_step0); collective, runs under mpirun\n"
    "                             DIR/TAG.h5 is read, TAG from DIR/latest unless --tag; DIR may be a .h5\n"
    "                             file; one process (no mpirun needed); exit 0 ok, 1 damaged or\n"
    "                             unreadable checkpoint or failed write, 2 bad arguments, 3 not found\n"
    "  swap list|clean NVME_PATH  the swap files in NVME_PATH (with their host and process); clean\n"
    "                             removes those a killed job left on this host (process gone)\n"
    "  plot RUN.jsonl [MORE.jsonl ...] --out DIR [--label NAME ...]\n"
    "                             PNGs of loss, lr, tokens/s, memory by category and communication wait,\n"
    "                             the runs compared in each (the zerotrain-plot script next to this\n"
    "                             executable; needs Python and matplotlib)\n"
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
  /// --name N: the one parser of every numeric option, so that each is checked alike: a whole
  /// number (no trailing text, no overflow) in [min, max], else a ConfigError naming the option.
  std::optional<std::int64_t> take_integer(std::string_view name, std::int64_t min,
                                           std::int64_t max = std::numeric_limits<std::int64_t>::max()) {
    const auto text = take(name);
    if (!text) return std::nullopt;
    const std::string expected = max == std::numeric_limits<std::int64_t>::max()
                                     ? "an integer >= " + std::to_string(min)
                                     : "an integer in " + std::to_string(min) + ".." + std::to_string(max);
    std::int64_t value = 0;
    const char* end = text->data() + text->size();
    const auto [stop, error] = std::from_chars(text->data(), end, value);
    ZT_CHECK_AS(zt::ConfigError, error != std::errc::result_out_of_range, "--", name, " ", *text,
                " is out of range: expected ", expected);
    ZT_CHECK_AS(zt::ConfigError, error == std::errc() && stop == end && !text->empty(), "--", name,
                " expects ", expected, ", got '", *text, "'");
    ZT_CHECK_AS(zt::ConfigError, value >= min && value <= max, "--", name, " ", value,
                " is out of range: expected ", expected);
    return value;
  }
  void require_all_used() const {
    if (!values_.empty())
      ZT_THROW_AS(zt::ConfigError, "unknown option --", values_.front().first, " (see `zerotrain help`)");
  }

 private:
  std::vector<std::pair<std::string, std::string>> values_;
};

int report_command(zt::Runtime& runtime, int argc, char** argv) {
  Flags flags(argc, argv, 2);
  if (const auto config_path = flags.take("config")) {
    // Parsed again for its errors: the parse before the runtime (runtime_options) keeps quiet.
    zt::ConfigParseOptions parse;
    if (runtime.world_rank() != 0) parse.warning_sink = {};
    (void)zt::Config::from_file(*config_path, parse);
  }
  flags.require_all_used();
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
  options.steps = flags.take_integer("steps", 0).value_or(options.steps);
  options.data_path = flags.take("data");
  options.eval_data_path = flags.take("eval-data");
  options.metrics_path = flags.take("metrics");
  options.print_every = flags.take_integer("print-every", 0);
  options.save_dir = flags.take("save-dir");
  options.save_interval = flags.take_integer("save-interval", 0);
  options.keep_last = flags.take_integer("keep-last", 0);
  options.resume = flags.take("resume");
  options.resume_job_id = flags.take("resume-job");
  ZT_CHECK_AS(zt::ConfigError, !options.resume_job_id || options.resume == "auto",
              "--resume-job applies to --resume auto only");
  if (const auto device = flags.take("device")) {
    ZT_CHECK_AS(zt::ConfigError, *device == "host" || *device == "emulated", "--device ", *device,
                ": expected host or emulated (a stand-in device whose memory only the device API may touch, "
                "for testing; the CUDA training path is not built yet)");
    options.device = *device == "host" ? zt::Device::host() : zt::Device::emulated();
  }
  flags.require_all_used();
  // Config warnings once, from rank 0.
  zt::ConfigParseOptions parse;
  if (runtime.world_rank() != 0) parse.warning_sink = {};
  zt::Config config = zt::Config::from_file(*config_path, parse);
  try {
    const zt::TrainSummary summary = zt::train(runtime, std::move(config), options);
    return summary.preempted ? zt::kPreemptedExitCode : 0;
  } catch (const zt::NoValidCheckpointError& error) {  // thrown on every rank alike: no abort needed
    if (runtime.world_rank() == 0) std::fprintf(stderr, "zerotrain train: %s\n", error.what());
    return zt::kNoValidCheckpointExitCode;
  }
}

int estimate_command(zt::Runtime& runtime, int argc, char** argv) {
  Flags flags(argc, argv, 2);
  const auto config_path = flags.take("config");
  ZT_CHECK_AS(zt::ConfigError, config_path.has_value(), "zerotrain estimate needs --config FILE");
  const auto world_size = flags.take_integer("world-size", 1, std::numeric_limits<int>::max());
  ZT_CHECK_AS(zt::ConfigError, world_size.has_value(), "zerotrain estimate needs --world-size N");
  const std::int64_t parameters = flags.take_integer("params", 0).value_or(0);
  flags.require_all_used();
  zt::ConfigParseOptions parse;
  if (runtime.world_rank() != 0) parse.warning_sink = {};
  const zt::Config config = zt::Config::from_file(*config_path, parse);
  // With pipeline stages, one table per stage: each stage's ranks hold different layers.
  const int stages = static_cast<int>(config.pipeline.stage_count());
  std::vector<zt::MemoryEstimate> estimates;
  for (int stage = 0; stage < stages; ++stage) {
    estimates.push_back(
        zt::estimate_model_state_memory(config, static_cast<int>(*world_size), parameters, stage));
  }
  if (runtime.world_rank() != 0) return 0;
  if (stages > 1) {
    std::printf(
        "pipeline: %d stages x %d data-parallel rank(s) = %lld ranks, partition \"%s\", schedule %s\n",
        stages, estimates.front().world_size, static_cast<long long>(*world_size),
        config.pipeline.partition.c_str(),
        config.pipeline.schedule == zt::PipelineSchedule::gpipe ? "gpipe" : "1f1b");
  }
  for (const zt::MemoryEstimate& estimate : estimates) std::fputs(estimate.table().c_str(), stdout);
  if (stages > 1) {
    const auto largest = std::max_element(
        estimates.begin(), estimates.end(),
        [](const zt::MemoryEstimate& a, const zt::MemoryEstimate& b) { return a.resident() < b.resident(); });
    std::printf("largest per rank: stage %d, %llu B resident model states (%.3f GiB)\n",
                largest->pipeline_stage, static_cast<unsigned long long>(largest->resident()),
                static_cast<double>(largest->resident()) / (1024.0 * 1024.0 * 1024.0));
  }
  return 0;
}

int data_command(zt::Runtime& runtime, int argc, char** argv) {
  ZT_CHECK_AS(zt::ConfigError, argc >= 5 && std::string_view(argv[2]) == "convert",
              "usage: zerotrain data convert INPUT OUTPUT.bin [--vocab-size N]");
  Flags flags(argc, argv, 5);
  const auto vocab_size = flags.take_integer("vocab-size", 1, std::numeric_limits<std::uint32_t>::max());
  flags.require_all_used();
  if (runtime.world_rank() == 0) {
    const std::string input = argv[3];
    if (zt::is_token_data_path(input)) {  // any token format, one file or shards
      const zt::TokenConvertStats stats =
          zt::convert_token_files(input, argv[4], static_cast<std::uint32_t>(vocab_size.value_or(0)));
      std::printf("converted %s: %llu file(s), %llu tokens, vocab %u -> %s\n", stats.description.c_str(),
                  static_cast<unsigned long long>(stats.files), static_cast<unsigned long long>(stats.tokens),
                  stats.vocab_size, argv[4]);
    } else {
      ZT_CHECK_AS(zt::ConfigError, !vocab_size, "--vocab-size is for token inputs; '", input,
                  "' is a text file, converted to byte tokens (vocab 256)");
      const zt::ConvertStats stats = zt::convert_text_file(argv[3], argv[4]);
      std::printf("converted %s: %llu bytes -> %llu tokens in %s\n", argv[3],
                  static_cast<unsigned long long>(stats.input_bytes),
                  static_cast<unsigned long long>(stats.tokens), argv[4]);
    }
  }
  runtime.world().barrier();
  return 0;
}

/// `zerotrain swap list|clean DIR`: the swap files a killed job left in DIR (one process).
int swap_command(zt::Runtime& runtime, int argc, char** argv) {
  const std::string_view action = argc > 2 ? argv[2] : "";
  ZT_CHECK_AS(zt::ConfigError, argc == 4 && (action == "list" || action == "clean"),
              "usage: zerotrain swap list|clean NVME_PATH");
  if (runtime.world_rank() == 0) {
    const std::vector<zt::SwapFileEntry> files = zt::list_swap_files(argv[3]);
    std::size_t removed = 0;
    for (const zt::SwapFileEntry& file : files) {
      const std::string owner =
          file.host.empty() ? std::string("custom job id") : file.host + " pid " + std::to_string(file.pid);
      const char* state = file.stale ? "stale (its process is gone)" : "in use or not known to be stale";
      if (action == "clean" && file.stale) {
        std::filesystem::remove(file.path);
        ++removed;
        state = "removed (its process was gone)";
      }
      std::printf("%s  %llu bytes  rank %d  %s  %s\n", file.path.string().c_str(),
                  static_cast<unsigned long long>(file.bytes), file.rank, owner.c_str(), state);
    }
    if (action == "clean") {
      std::printf(
          "zerotrain swap clean: removed %zu of %zu swap file(s) in %s; files of other hosts or of "
          "running processes are kept\n",
          removed, files.size(), argv[3]);
    } else if (files.empty()) {
      std::printf("no zerotrain swap files in %s\n", argv[3]);
    }
    std::fflush(stdout);
  }
  runtime.world().barrier();
  return 0;
}

/// A checkpoint directory, tag or file that is not there (`zerotrain checkpoint` exits 3).
class CheckpointNotFound : public zt::IoError {
 public:
  using IoError::IoError;
};

namespace fs = std::filesystem;

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

/// An error's message without the "zerotrain error on rank R (file:line): " prefix: the command's
/// users want the what, not the where.
std::string plain_message(const std::exception& error) {
  const std::string_view text = error.what();
  const std::size_t end = text.find("): ");
  if (!text.starts_with("zerotrain error") || end == std::string_view::npos) return std::string(text);
  return std::string(text.substr(end + 3));
}

/// zerotrain checkpoint inspect|verify|export DIR [--tag T] [--out FILE.h5] [--dtype fp32|bf16]:
/// rank 0 alone reads the file (no collective), every rank exits with its code.
int checkpoint_command(zt::Runtime& runtime, int argc, char** argv) {
  // import builds the model on every rank of the job (src/cli/checkpoint_import.cpp).
  if (argc > 2 && std::string_view(argv[2]) == "import")
    return zt::cli::checkpoint_import_command(runtime, argc, argv);
  int code = 0;
  if (runtime.world_rank() == 0) {
    const std::string action = argc > 2 ? argv[2] : "";
    const std::string who = "zerotrain checkpoint" + (action.empty() ? "" : " " + action);
    try {
      ZT_CHECK_AS(zt::ConfigError,
                  (action == "inspect" || action == "verify" || action == "export") && argc > 3,
                  "usage: zerotrain checkpoint inspect|verify|export DIR [--tag T] [--out FILE.h5] "
                  "[--dtype fp32|bf16], or import WEIGHTS.h5 --config C --out DIR (see `zerotrain help`)");
      const std::string dir = argv[3];
      Flags flags(argc, argv, 4);
      const std::optional<std::string> tag = flags.take("tag");
      std::optional<std::string> out;
      zt::DType dtype = zt::DType::fp32;
      if (action == "export") {
        out = flags.take("out");
        ZT_CHECK_AS(zt::ConfigError, out.has_value(), "export needs --out FILE.h5");
        const std::string dtype_name = flags.take("dtype").value_or("fp32");
        ZT_CHECK_AS(zt::ConfigError, dtype_name == "fp32" || dtype_name == "bf16",
                    "--dtype must be fp32 or bf16, got '", dtype_name, "'");
        dtype = dtype_name == "bf16" ? zt::DType::bf16 : zt::DType::fp32;
        const fs::path parent = fs::absolute(*out).parent_path();
        ZT_CHECK_AS(CheckpointNotFound, fs::is_directory(parent), "cannot write '", *out, "': directory '",
                    parent.string(), "' does not exist");
      }
      flags.require_all_used();
      const std::string path = resolve_checkpoint(dir, tag);
      if (action == "inspect") {
        print_summary(zt::inspect_checkpoint(path), dir);
      } else if (action == "verify") {
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
      std::fprintf(stderr, "%s: %s\n", who.c_str(), plain_message(error).c_str());
      code = 2;
    } catch (const CheckpointNotFound& error) {
      std::fprintf(stderr, "%s: %s\n", who.c_str(), plain_message(error).c_str());
      code = 3;
    } catch (const std::exception& error) {  // zt::IoError, std::filesystem_error, ...
      std::fprintf(stderr, "%s: FAILED: %s\n", who.c_str(), plain_message(error).c_str());
      code = 1;
    }
    std::fflush(stdout);
  }
  runtime.world().broadcast(&code, 1, zt::DType::int32, 0);
  return code;
}

/// Test hook (docs/testing.md, tests/slurm): with ZT_FAULT_INJECTION=hold_before_mpi_init:FILE, rank
/// 0 of a job waits before MPI starts while FILE exists, until a stop signal comes (60 s at most),
/// so that a test can signal one rank during start-up.
void hold_before_mpi_init() {
  const char* fault = std::getenv("ZT_FAULT_INJECTION");
  constexpr std::string_view kHook = "hold_before_mpi_init:";
  if (fault == nullptr || !std::string_view(fault).starts_with(kHook)) return;
  const char* rank = std::getenv("SLURM_PROCID");
  if (rank == nullptr) rank = std::getenv("OMPI_COMM_WORLD_RANK");
  const fs::path file(std::string_view(fault).substr(kHook.size()));
  if ((rank != nullptr && std::string_view(rank) != "0") || !fs::exists(file)) return;
  std::printf(
      "zerotrain: test hook: pid %d holds before MPI starts while %s exists (until SIGTERM/SIGUSR1)\n",
      static_cast<int>(getpid()), file.c_str());
  std::fflush(stdout);
  for (int waited = 0; waited < 600 && zt::StopSignalScope::received() == 0 && fs::exists(file); ++waited)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
}

/// The runtime's options: for `train` and `report`, the watchdog's timeout from the comm.timeout_s
/// of --config FILE (the runtime starts the watchdog, so the config is read before it). A config
/// that does not parse gives the defaults here; the command parses it again once the runtime is
/// up and reports the error there, on rank 0 and with the job's exit code.
zt::RuntimeOptions runtime_options(int argc, char** argv) {
  const std::string_view command = argc > 1 ? argv[1] : "";
  if (command != "train" && command != "report" && command != "plan") return {};
  for (int i = 2; i + 1 < argc; ++i) {
    if (std::string_view(argv[i]) != "--config") continue;
    try {
      return zt::runtime_options_for(
          zt::Config::from_file(argv[i + 1], zt::ConfigParseOptions{.warning_sink = {}}));
    } catch (const std::exception&) {
      return {};
    }
  }
  return {};
}

}  // namespace

/// `zerotrain plot ...`: the zerotrain-plot script installed next to this executable takes over
/// the process (no MPI). Returns only when it cannot be started.
int exec_plot_script(char** argv) {
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  const std::string script = (self.parent_path() / "zerotrain-plot").string();
  std::vector<char*> arguments = {const_cast<char*>(script.c_str())};
  for (char** arg = argv + 2; *arg != nullptr; ++arg) arguments.push_back(*arg);
  arguments.push_back(nullptr);
  execv(script.c_str(), arguments.data());
  std::fprintf(stderr, "zerotrain plot: cannot run '%s': %s\n", script.c_str(), std::strerror(errno));
  return 1;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::string_view(argv[1]) == "plot") return exec_plot_script(argv);
  // `zerotrain train` records SIGTERM/SIGUSR1 from its first instruction: a preemption while MPI
  // starts or a checkpoint loads then ends in exit 75 (requeue), not in a killed job.
  std::optional<zt::StopSignalScope> stop_signals;
  if (argc > 1 && std::string_view(argv[1]) == "train") {
    stop_signals.emplace();
    hold_before_mpi_init();
  }
  zt::Runtime runtime(&argc, &argv, runtime_options(argc, argv));
  return zt::run_and_report([&]() -> int {
    const std::string_view command = argc > 1 ? argv[1] : "help";
    // `zerotrain train --help` and friends: the usage, not an "unexpected argument" abort.
    for (int i = 2; i < argc; ++i) {
      const std::string_view arg = argv[i];
      if (arg == "--help" || arg == "-h") {
        if (runtime.world_rank() == 0) std::fputs(kUsage, stdout);
        return 0;
      }
    }
    if (command == "report") return report_command(runtime, argc, argv);
    if (command == "train") return train_command(runtime, argc, argv);
    if (command == "estimate") return estimate_command(runtime, argc, argv);
    if (command == "plan") return zt::cli::plan_command(runtime, argc, argv);
    if (command == "data") return data_command(runtime, argc, argv);
    if (command == "checkpoint") return checkpoint_command(runtime, argc, argv);
    if (command == "swap") return swap_command(runtime, argc, argv);
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
