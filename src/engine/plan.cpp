// `zerotrain plan`: predict, prune, measure, rank, check the chosen candidate against the baseline
// and through a save and two resumes, export, and record everything (docs/plan.md).
#include "src/engine/plan.hpp"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>
#include <variant>

#include "base/text.hpp"
#include "src/engine/metrics.hpp"
#include "src/engine/string_broadcast.hpp"
#include "zerotrain/build_info.hpp"
#include "zerotrain/checkpoint.hpp"
#include "zerotrain/device.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/estimate.hpp"
#include "zerotrain/report.hpp"
#include "zerotrain/trainer.hpp"

namespace zt::engine_detail {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using base::byte_size_text;

// ---- memory: the limit, the process's peak RSS, the accounted total ------------------------------

struct Limit {
  std::uint64_t bytes = 0;
  std::string source;
};

/// MemAvailable of /proc/meminfo (0 where unknown).
std::uint64_t available_host_memory() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kib = 0.0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return static_cast<std::uint64_t>(kib * 1024.0);
  }
  return 0;
}

/// The default limit per rank: the smaller of the host's available memory and its limit for the
/// job (physical memory, cgroup, RLIMIT_AS: zt::host_memory), over the ranks of this node. Rank
/// 0's, so that every rank prunes alike.
Limit default_memory_limit(Runtime& runtime) {
  const HostMemory host = host_memory(runtime.local_size());
  const std::uint64_t available = available_host_memory();
  const auto ranks = static_cast<std::uint64_t>(std::max(runtime.local_size(), 1));
  Limit limit;
  if (available > 0 && (host.node_bytes == 0 || available < host.node_bytes)) {
    limit = {available / ranks, byte_size_text(available) + " available (MemAvailable in /proc/meminfo) / " +
                                    std::to_string(ranks) + " rank(s) on the node"};
  } else {
    limit = {host.node_bytes / ranks, host.what + " / " + std::to_string(ranks) + " rank(s) on the node"};
  }
  std::int64_t bytes = static_cast<std::int64_t>(limit.bytes);
  runtime.world().broadcast(&bytes, 1, DType::int64, 0);
  limit.bytes = static_cast<std::uint64_t>(bytes);
  limit.source = broadcast_string(runtime.world(), limit.source);
  return limit;
}

/// Restart the kernel's peak-RSS count of this process (VmHWM; writing 5 to clear_refs, Linux 4.0+).
bool reset_peak_rss() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return clear.good();
}

/// VmHWM of /proc/self/status in bytes, 0 where unknown.
std::uint64_t peak_rss() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.starts_with("VmHWM:")) return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
  }
  return 0;
}

/// The accounted bytes of every kind of memory the engine may use: current and peak of the total.
std::pair<std::uint64_t, std::uint64_t> accounted_total() {
  std::uint64_t current = 0;
  std::uint64_t peak = 0;
  for (DeviceType type : {DeviceType::host, DeviceType::cuda, DeviceType::emulated}) {
    const MemorySnapshot snapshot = memory_snapshot(type);
    current += snapshot.total.current;
    peak += snapshot.total.peak;
  }
  return {current, peak};
}

std::uint64_t model_state_bytes() {
  std::uint64_t bytes = 0;
  for (DeviceType type : {DeviceType::host, DeviceType::cuda, DeviceType::emulated}) {
    const MemorySnapshot snapshot = memory_snapshot(type);
    for (MemoryCategory category :
         {MemoryCategory::parameters, MemoryCategory::gradients, MemoryCategory::optimizer_states})
      bytes += snapshot[category].current;
  }
  return bytes;
}

std::uint64_t max_over_ranks(Communicator& world, std::uint64_t value) {
  auto v = static_cast<std::int64_t>(value);
  world.all_reduce(&v, &v, 1, DType::int64, ReduceOp::max);
  return static_cast<std::uint64_t>(v);
}

// ---- runs -------------------------------------------------------------------------------------------

struct RunSpec {
  std::int64_t steps = 0;       // train until this global step
  std::int64_t timed_from = 0;  // global steps before this one are warm-up, not timed
  std::optional<std::string> data_path;
  std::optional<std::string> checkpoint_dir;
  std::int64_t save_at = 0;  // save a checkpoint after this global step (0: none)
  bool save_at_end = false;
  std::optional<std::string> resume_tag;  // load checkpoint_dir/TAG.h5 first
  bool record_samples = false;
};

struct RunRecord {
  std::int64_t first_step = 0;  // the global step the run started from (resumed: the checkpoint's)
  std::vector<double> losses;   // of each step it trained
  /// Per step, every rank's sample ids (all micro-batches), sorted; on every rank.
  std::vector<std::vector<std::int64_t>> samples;
  std::vector<double> step_seconds;  // timed steps, each the slowest rank's
  std::uint64_t resident = 0;        // model states the engine allocated (max over ranks)
  std::uint64_t peak_accounted = 0;  // the steps' peak of accounted memory above the start (max over ranks)
  std::uint64_t peak_rss = 0;        // the process's peak RSS over the run (max over ranks)
  bool rss_reset = false;            // the peak RSS is the run's (else since the process started)
  std::uint64_t num_samples = 0;
  std::uint64_t tokens_per_sample = 0;
  std::int64_t parameters = 0;
  std::string data_description;
  std::string saved_tag;  // the checkpoint of save_at_end
};

SaveOptions save_options(const TrainingData& data) {
  SaveOptions options;
  options.data_position = data.position();
  return options;
}

RunRecord train_run(Runtime& runtime, const Config& config, const RunSpec& spec) {
  Communicator& world = runtime.world();
  RunRecord record;
  record.rss_reset = reset_peak_rss();
  const std::uint64_t before = accounted_total().first;
  const std::uint64_t states_before = model_state_bytes();
  auto model = build_model(config);
  Engine engine(runtime, *model, config);
  record.resident = max_over_ranks(world, model_state_bytes() - states_before);
  record.parameters = engine.parameter_count();
  std::unique_ptr<TrainingData> data = make_training_data(engine.config(), engine, spec.data_path);
  record.tokens_per_sample = data->tokens_per_sample();
  record.data_description = data->description();
  record.num_samples = data->position().num_samples;
  if (spec.resume_tag) {
    LoadOptions load;
    load.tag = spec.resume_tag;
    const LoadResult loaded = engine.load_checkpoint(*spec.checkpoint_dir, load);
    ZT_CHECK_AS(IoError, loaded.data_position.has_value(), "checkpoint '", loaded.path,
                "' holds no data position");
    data->restore(*loaded.data_position);
  }
  record.first_step = engine.global_steps();
  const std::int64_t micro_batches = engine.batch().gradient_accumulation_steps;
  std::uint64_t peak = 0;
  while (engine.global_steps() < spec.steps) {
    if (spec.record_samples) {
      std::vector<std::int64_t> mine;
      for (std::int64_t micro = 0; micro < micro_batches; ++micro) {
        for (std::uint64_t id : data->sample_ids(static_cast<std::uint64_t>(micro)))
          mine.push_back(static_cast<std::int64_t>(id));
      }
      std::vector<std::int64_t> all(mine.size() * static_cast<std::size_t>(world.size()));
      world.all_gather(mine.data(), all.data(), mine.size(), DType::int64);
      std::sort(all.begin(), all.end());
      record.samples.push_back(std::move(all));
    }
    reset_memory_peaks();
    const auto began = Clock::now();
    engine.train_batch([&](std::int64_t micro) { return data->load(static_cast<std::uint64_t>(micro)); });
    data->advance();
    double seconds = std::chrono::duration<double>(Clock::now() - began).count();
    peak = std::max(peak, accounted_total().second - std::min(before, accounted_total().second));
    record.losses.push_back(engine.last_step().loss);
    world.all_reduce(&seconds, &seconds, 1, DType::fp64, ReduceOp::max);
    if (engine.global_steps() > spec.timed_from) record.step_seconds.push_back(seconds);
    if (spec.save_at > 0 && engine.global_steps() == spec.save_at)
      (void)engine.save_checkpoint(*spec.checkpoint_dir, save_options(*data));
  }
  if (spec.save_at_end) record.saved_tag = engine.save_checkpoint(*spec.checkpoint_dir, save_options(*data));
  record.peak_accounted = max_over_ranks(world, peak);
  record.peak_rss = max_over_ranks(world, peak_rss());
  return record;
}

/// A runtime over world ranks [0, count) of `runtime` (nullptr on the others). Collective.
std::unique_ptr<Runtime> runtime_of_first_ranks(Runtime& runtime, int count) {
  MPI_Comm split = MPI_COMM_NULL;
  ZT_CHECK(MPI_Comm_split(runtime.world_comm(), runtime.world_rank() < count ? 0 : MPI_UNDEFINED,
                          runtime.world_rank(), &split) == MPI_SUCCESS,
           "MPI_Comm_split of the first ", count, " rank(s) failed");
  if (split == MPI_COMM_NULL) return nullptr;
  RuntimeOptions options;
  options.abort_on_uncaught_exception = false;       // the job's runtime reports and aborts
  options.bind_device = runtime.device().is_cuda();  // no GPU where the job's runtime bound none
  auto sub = std::make_unique<Runtime>(split, options);
  MPI_Comm_free(&split);
  return sub;
}

/// A barrier over the world that sleeps while it waits: the ranks outside a sub-communicator's
/// run leave the cores to it (a blocking MPI barrier polls, which on an oversubscribed node takes
/// the cores the run needs).
void wait_sleeping(Runtime& runtime) {
  MPI_Request request = MPI_REQUEST_NULL;
  ZT_CHECK(MPI_Ibarrier(runtime.world_comm(), &request) == MPI_SUCCESS, "MPI_Ibarrier failed");
  int done = 0;
  while (true) {
    ZT_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS, "MPI_Test of a barrier failed");
    if (done != 0) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

/// max |a - b| / |b| over the common steps (0 when equal).
double max_relative_difference(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0.0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const double scale = std::max(std::fabs(b[i]), 1e-30);
    worst = std::max(worst, std::fabs(a[i] - b[i]) / scale);
  }
  return worst;
}

// ---- text -------------------------------------------------------------------------------------------

std::string format(const char* pattern, double value) {
  char text[64];
  std::snprintf(text, sizeof text, pattern, value);
  return text;
}

/// Columns padded to their widest cell; the first row is the header.
std::string text_table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> widths;
  for (const auto& row : rows) {
    widths.resize(std::max(widths.size(), row.size()), 0);
    for (std::size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  std::string text;
  for (const auto& row : rows) {
    std::string line = " ";
    for (std::size_t c = 0; c < row.size(); ++c) {
      line.append(1 + widths[c] - row[c].size(), ' ');
      line.append(row[c]);
    }
    text += line + "\n";
  }
  return text;
}

std::string markdown_table(const std::vector<std::vector<std::string>>& rows) {
  std::string text;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    text += "|";
    for (const std::string& cell : rows[r]) text += " " + cell + " |";
    text += "\n";
    if (r == 0) {
      text += "|";
      for (std::size_t c = 0; c < rows[r].size(); ++c) text += "---|";
      text += "\n";
    }
  }
  return text;
}

/// How two loss sequences agree, for the report: "bitwise" or "max relative difference 3.1e-07".
std::string agreement_text(double difference) {
  return difference == 0.0 ? std::string("bitwise equal")
                           : format("max relative difference %.2e", difference);
}

nlohmann::json candidate_json(const PlanCandidate& candidate) {
  return {{"stage", candidate.stage},
          {"offload", plan_offload_name(candidate.offload)},
          {"micro_batch", candidate.micro_batch},
          {"gradient_accumulation_steps", candidate.accumulation}};
}

nlohmann::json predicted_json(const PredictedMemory& predicted) {
  return {{"model_states", predicted.model_states},
          {"buckets", predicted.buckets},
          {"activations", predicted.activations},
          {"transient", predicted.transient},
          {"peak", predicted.peak()}};
}

struct Entry {
  PlanCandidate candidate;
  std::string config_text;  // the candidate's config JSON
  PredictedMemory predicted;
  std::string pruned;  // why it was not measured ("" when it was)
  std::optional<RunRecord> measured;
  double tokens_per_second = 0.0;
  double step_seconds = 0.0;
};

/// Lines of the plan on rank 0 (stdout, flushed at once, so that they interleave with the engine's).
class Output {
 public:
  explicit Output(bool leader) : leader_(leader) {}
  void line(const std::string& text) {
    if (!leader_) return;
    std::fputs((text + "\n").c_str(), stdout);
    std::fflush(stdout);
  }

 private:
  bool leader_;
};

Config parse_quietly(const std::string& json_text) {
  return Config::from_string(json_text, ConfigParseOptions{.warning_sink = {}});
}

}  // namespace

int run_plan(Runtime& runtime, const PlanOptions& options) {
  Communicator& world = runtime.world();
  const bool leader = runtime.world_rank() == 0;
  const int ranks = runtime.world_size();
  Output out(leader);
  ZT_CHECK_AS(ConfigError,
              options.warmup_steps >= 0 && options.measure_steps >= 1 && options.check_steps >= 2,
              "zerotrain plan: --warmup-steps >= 0, --measure-steps >= 1 and --check-steps >= 2 expected");

  // ---- the base config, the batch, the candidates (deterministic: every rank throws alike) ----------
  ConfigParseOptions parse;
  if (!leader) parse.warning_sink = {};
  const Config base = Config::from_file(options.config_path, parse);
  ZT_CHECK_AS(ConfigError, base.model.has_value(), "zerotrain plan: config '", options.config_path,
              "' has no \"model\" section: the plan trains the built-in model it describes");
  ZT_CHECK_AS(ConfigError, base.pipeline.stage_count() == 1, "zerotrain plan: config '", options.config_path,
              "' has pipeline.stages = ", base.pipeline.stage_count(),
              "; the plan chooses ZeRO settings over data-parallel ranks only: remove pipeline.stages");
  ZT_CHECK_AS(ConfigError, options.global_batch || base.train_batch_size,
              "zerotrain plan: give --global-batch B", " (config '", options.config_path,
              "' has no train_batch_size)");
  const std::int64_t global_batch = options.global_batch.value_or(base.train_batch_size.value_or(0));
  const nlohmann::json base_json = nlohmann::json::parse(base.raw_json());
  const CandidateSpace space =
      options.candidates ? parse_candidate_space(*options.candidates) : CandidateSpace{};
  const std::vector<PlanCandidate> candidates = expand_candidates(space, global_batch, ranks);
  const int resume_ranks = options.resume_world_size.value_or(ranks >= 2 ? ranks / 2 : 0);
  ZT_CHECK_AS(ConfigError, resume_ranks >= 0 && resume_ranks <= ranks, "--resume-world-size ", resume_ranks,
              ": expected 0 (none) to ", ranks, " (the ranks of this job)");
  const std::int64_t save_step = options.check_steps / 2;

  // The output directory, on rank 0, before anything costly.
  const fs::path out_dir(options.out_dir);
  const fs::path checkpoint_dir = out_dir / "checkpoints";
  std::string problem;
  if (leader) {
    std::error_code error;
    fs::create_directories(out_dir, error);
    if (error || !fs::is_directory(out_dir)) {
      problem = "cannot create the output directory '" + out_dir.string() +
                "': " + (error ? error.message() : std::string("not a directory"));
    } else {
      fs::remove_all(checkpoint_dir, error);  // the plan's own scratch of the last run
    }
    if (problem.empty() && options.data_path && !fs::is_regular_file(*options.data_path)) {
      problem = "--data '" + *options.data_path +
                "' is not a file: expected a token file (zerotrain data convert) or a text file";
    }
  }
  problem = broadcast_string(world, problem);
  ZT_CHECK_AS(ConfigError, problem.empty(), problem);

  // The limit the candidates must fit; the checks below run where they fit this host.
  const Limit host_limit = default_memory_limit(runtime);
  const Limit limit = options.memory_limit ? Limit{*options.memory_limit, "--memory-limit"} : host_limit;

  // ---- (a) predict and prune ----------------------------------------------------------------------
  std::vector<Entry> entries;
  for (const PlanCandidate& candidate : candidates) {
    Entry entry{candidate, candidate_config_json(base_json, candidate, global_batch).dump(), {}, {}, {}, 0,
                0};
    try {
      Config config = parse_quietly(entry.config_text);
      check_engine_supports(config);
      entry.predicted = predict_step_memory(config, ranks);
      if (entry.predicted.peak() > limit.bytes) {
        entry.pruned = "predicted peak " + byte_size_text(entry.predicted.peak()) + " > limit " +
                       byte_size_text(limit.bytes);
      }
    } catch (const ConfigError& error) {
      // Without the "zerotrain error on rank R (file:line): " prefix: the same on every rank.
      const std::string_view text = error.what();
      const std::size_t where = text.find("): ");
      entry.pruned = "the engine refuses it: " +
                     std::string(where == std::string_view::npos ? text : text.substr(where + 3));
    }
    entries.push_back(std::move(entry));
  }
  const std::int64_t parameters = model_parameter_count(base);
  out.line(
      "zerotrain plan: " + std::string(std::holds_alternative<GptModelConfig>(*base.model) ? "GPT" : "MLP") +
      " model, " + std::to_string(parameters) + " parameters, " +
      std::string(dtype_name(compute_dtype_of(base))) + ", global batch " + std::to_string(global_batch) +
      " on " + std::to_string(ranks) + " rank(s), " + std::to_string(runtime.node_count()) + " node(s)");
  out.line("  memory limit " + byte_size_text(limit.bytes) + " per rank (" + limit.source + ")");
  std::size_t pruned_count = 0;
  for (const Entry& entry : entries) pruned_count += !entry.pruned.empty();
  out.line("  " + std::to_string(entries.size()) + " candidate(s), " + std::to_string(pruned_count) +
           " pruned by their predicted peak" + (pruned_count > 0 ? ":" : ""));
  for (const Entry& entry : entries) {
    if (!entry.pruned.empty()) out.line("    pruned: " + entry.candidate.name() + ": " + entry.pruned);
  }
  if (pruned_count == entries.size()) {
    std::uint64_t smallest = 0;
    for (const Entry& entry : entries) {
      if (entry.predicted.peak() > 0 && (smallest == 0 || entry.predicted.peak() < smallest))
        smallest = entry.predicted.peak();
    }
    out.line("zerotrain plan: nothing fits: every candidate is pruned" +
             (smallest > 0 ? "; the smallest predicted peak is " + byte_size_text(smallest) + " per rank"
                           : std::string()) +
             " against a limit of " + byte_size_text(limit.bytes) +
             ". Raise --memory-limit, run on more ranks, or reduce the model or the micro-batch");
    return 1;
  }

  // ---- (b) measure the survivors --------------------------------------------------------------------
  const std::int64_t profile_steps = options.warmup_steps + options.measure_steps;
  out.line("measuring each: " + std::to_string(options.warmup_steps) + " warm-up + " +
           std::to_string(options.measure_steps) + " timed step(s)");
  for (Entry& entry : entries) {
    if (!entry.pruned.empty()) continue;
    const Config config = parse_quietly(entry.config_text);
    RunSpec spec;
    spec.steps = profile_steps;
    spec.timed_from = options.warmup_steps;
    spec.data_path = options.data_path;
    entry.measured = train_run(runtime, config, spec);
    entry.step_seconds = median(entry.measured->step_seconds);
    entry.tokens_per_second = static_cast<double>(global_batch) *
                              static_cast<double>(entry.measured->tokens_per_sample) / entry.step_seconds;
    out.line("  " + entry.candidate.name() + ": " + format("%.1f ms/step", entry.step_seconds * 1e3) + ", " +
             format("%.0f tokens/s", entry.tokens_per_second) + ", peak " +
             byte_size_text(entry.measured->peak_accounted) + " (predicted " +
             byte_size_text(entry.predicted.peak()) + ")");
  }
  std::vector<Entry*> ranked;
  for (Entry& entry : entries) {
    if (entry.measured) ranked.push_back(&entry);
  }
  std::stable_sort(ranked.begin(), ranked.end(), [](const Entry* a, const Entry* b) {
    return a->tokens_per_second > b->tokens_per_second;
  });
  std::vector<std::vector<std::string>> table = {{"rank", "stage", "offload", "micro x gas", "step ms",
                                                  "tokens/s", "predicted peak", "measured peak",
                                                  "measured/predicted", "peak RSS"}};
  for (std::size_t i = 0; i < ranked.size(); ++i) {
    const Entry& entry = *ranked[i];
    table.push_back(
        {std::to_string(i + 1), std::to_string(entry.candidate.stage),
         std::string(plan_offload_name(entry.candidate.offload)),
         std::to_string(entry.candidate.micro_batch) + " x " + std::to_string(entry.candidate.accumulation),
         format("%.1f", entry.step_seconds * 1e3), format("%.0f", entry.tokens_per_second),
         byte_size_text(entry.predicted.peak()), byte_size_text(entry.measured->peak_accounted),
         format("%.2f", static_cast<double>(entry.measured->peak_accounted) /
                            static_cast<double>(std::max<std::uint64_t>(entry.predicted.peak(), 1))),
         byte_size_text(entry.measured->peak_rss)});
  }
  out.line("ranked by tokens/s (median step of the slowest rank; peaks per rank, the largest rank's):");
  out.line(text_table(table));
  const Entry& chosen = *ranked.front();
  out.line("chosen: " + chosen.candidate.name() + format(" (%.0f tokens/s)", chosen.tokens_per_second));

  // ---- (c) against the single-rank baseline, and (d) save, resume, export --------------------------
  bool failed = false;
  const auto fail = [&](const std::string& what) {
    failed = true;
    out.line("FAILED: " + what);
  };
  const bool sixteen_bit = compute_dtype_of(base) != DType::fp32;
  const double tolerance = sixteen_bit ? 2e-2 : 1e-5;
  const std::string tolerance_text =
      sixteen_bit ? "2e-2 (16-bit compute)" : "1e-5 (fp32 roundoff: the reduction order differs)";
  const Config chosen_config = parse_quietly(chosen.config_text);
  const std::int64_t steps = options.check_steps;
  // The uninterrupted run on every rank, saving at save_step: the reference of every check.
  RunSpec check;
  check.steps = steps;
  check.data_path = options.data_path;
  check.checkpoint_dir = checkpoint_dir.string();
  check.record_samples = true;
  RunSpec first = check;
  first.save_at = save_step;
  const RunRecord reference = train_run(runtime, chosen_config, first);
  const std::string save_tag = "global_step" + std::to_string(save_step);
  out.line("check run: " + std::to_string(steps) + " steps on " + std::to_string(ranks) + " rank(s), loss " +
           format("%.4f", reference.losses.front()) + " -> " + format("%.4f", reference.losses.back()) +
           ", checkpoint " + (checkpoint_dir / (save_tag + ".h5")).string() + " at step " +
           std::to_string(save_step));

  // The config of the chosen candidate on `n` ranks: the same global batch and micro-batch, the
  // accumulation making up for the ranks.
  const auto config_on = [&](int n) {
    PlanCandidate on = chosen.candidate;
    on.accumulation = global_batch / (on.micro_batch * n);
    return parse_quietly(candidate_config_json(base_json, on, global_batch).dump());
  };
  const auto fits_on = [&](int n, std::string& why) {
    const PredictedMemory predicted = predict_step_memory(config_on(n), n);
    if (predicted.peak() <= host_limit.bytes) return true;
    why = "predicted peak on " + std::to_string(n) + " rank(s) " + byte_size_text(predicted.peak()) +
          " > this host's " + byte_size_text(host_limit.bytes) + " per rank (" + host_limit.source + ")";
    return false;
  };
  nlohmann::json baseline_json;
  {
    std::string why;
    if (ranks == 1) {
      out.line("baseline: the job has one rank: the check run is the single-rank run");
      baseline_json = {{"ran", false}, {"reason", "one rank"}};
    } else if (!fits_on(1, why)) {
      out.line("baseline: not run: " + why);
      baseline_json = {{"ran", false}, {"reason", why}};
    } else {
      std::vector<double> losses;
      if (auto single = runtime_of_first_ranks(runtime, 1)) {
        RunSpec plain;
        plain.steps = steps;
        plain.data_path = options.data_path;
        losses = train_run(*single, config_on(1), plain).losses;
      }
      wait_sleeping(runtime);
      const double difference = max_relative_difference(reference.losses, losses);
      const bool agrees = leader ? difference <= tolerance : true;
      out.line("baseline: " + std::to_string(steps) + " steps of " + std::to_string(ranks) +
               " rank(s) against 1 rank (micro " + std::to_string(chosen.candidate.micro_batch) + " x gas " +
               std::to_string(global_batch / chosen.candidate.micro_batch) + ", the same " +
               std::to_string(global_batch) + " samples per step): losses " + agreement_text(difference) +
               (difference == 0.0 ? "" : " (tolerance " + tolerance_text + ")"));
      if (!agrees) fail("the baseline's losses differ beyond " + format("%.0e", tolerance));
      baseline_json = {{"ran", true},
                       {"steps", steps},
                       {"single_rank_losses", losses},
                       {"losses", reference.losses},
                       {"max_relative_difference", difference},
                       {"bitwise", difference == 0.0},
                       {"tolerance", tolerance}};
    }
  }

  // A resumed run from save_tag against the reference: losses and sample ids of each step after it.
  nlohmann::json resume_json = nlohmann::json::array();
  std::string exported_path;
  std::int64_t exported_parameters = 0;
  const auto check_resume = [&](Runtime& on, int n, bool save_end) {
    RunSpec spec = check;
    spec.save_at_end = save_end;
    spec.resume_tag = save_tag;
    return train_run(on, config_on(n), spec);
  };
  bool samples_identical = true;  // every resumed step read the uninterrupted step's samples
  const auto judge_resume = [&](const RunRecord& resumed, int n, bool expect_bitwise) {
    const std::vector<double> expected(reference.losses.begin() + save_step, reference.losses.end());
    const double difference = max_relative_difference(resumed.losses, expected);
    bool samples_equal = resumed.first_step == save_step && resumed.samples.size() == expected.size();
    for (std::size_t i = 0; samples_equal && i < resumed.samples.size(); ++i)
      samples_equal = resumed.samples[i] == reference.samples[static_cast<std::size_t>(save_step) + i];
    const bool losses_ok = expect_bitwise ? difference == 0.0 : difference <= tolerance;
    out.line("resume on " + std::to_string(n) + " rank(s) from step " + std::to_string(resumed.first_step) +
             ": steps " + std::to_string(save_step + 1) + "-" + std::to_string(steps) + " losses " +
             agreement_text(difference) + " to the uninterrupted run's" +
             (expect_bitwise     ? " (expected bitwise: the same layout)"
              : difference > 0.0 ? " (tolerance " + tolerance_text + ")"
                                 : "") +
             "; sample ids " + (samples_equal ? "identical" : "DIFFERENT"));
    if (!losses_ok) fail("the run resumed on " + std::to_string(n) + " rank(s) does not give the losses");
    samples_identical = samples_identical && samples_equal;
    if (!samples_equal) fail("the run resumed on " + std::to_string(n) + " rank(s) reads other samples");
    resume_json.push_back({{"ranks", n},
                           {"from_step", resumed.first_step},
                           {"losses", resumed.losses},
                           {"max_relative_difference", difference},
                           {"bitwise", difference == 0.0},
                           {"samples_identical", samples_equal}});
  };
  {
    const RunRecord same = check_resume(runtime, ranks, true);
    judge_resume(same, ranks, true);
    // Export the resumed run's final checkpoint (rank 0 alone reads it).
    std::string export_problem;
    if (leader) {
      try {
        const std::string path = checkpoint_file(checkpoint_dir.string(), same.saved_tag);
        verify_checkpoint(path);
        exported_path = (out_dir / "weights.h5").string();
        export_checkpoint(path, exported_path);
        exported_parameters = inspect_checkpoint(path).parameters;
        if (exported_parameters != same.parameters)
          export_problem = "the export holds " + std::to_string(exported_parameters) +
                           " elements, the model " + std::to_string(same.parameters);
      } catch (const std::exception& error) {
        export_problem = error.what();
      }
    }
    export_problem = broadcast_string(world, export_problem);
    if (export_problem.empty()) {
      out.line("export: " + exported_path + " (" + std::to_string(exported_parameters) +
               " parameter elements of the step-" + std::to_string(steps) + " checkpoint, verified)");
    } else {
      fail("export: " + export_problem);
    }
  }
  if (resume_ranks >= 1 && resume_ranks != ranks) {
    std::string why;
    if (global_batch % (chosen.candidate.micro_batch * resume_ranks) != 0) {
      out.line("resume on " + std::to_string(resume_ranks) + " rank(s): not run: micro-batch " +
               std::to_string(chosen.candidate.micro_batch) + " x " + std::to_string(resume_ranks) +
               " ranks does not divide the global batch");
    } else if (!fits_on(resume_ranks, why)) {
      out.line("resume on " + std::to_string(resume_ranks) + " rank(s): not run: " + why);
    } else {
      std::optional<RunRecord> other;
      if (auto sub = runtime_of_first_ranks(runtime, resume_ranks)) {
        other = check_resume(*sub, resume_ranks, false);
      }
      wait_sleeping(runtime);
      if (leader) judge_resume(*other, resume_ranks, false);
    }
  }
  // The sample stream: the reference's steps hold distinct samples within an epoch.
  std::vector<std::int64_t> stream;
  for (const auto& step : reference.samples) stream.insert(stream.end(), step.begin(), step.end());
  std::sort(stream.begin(), stream.end());
  const bool distinct = std::adjacent_find(stream.begin(), stream.end()) == stream.end();
  const bool one_epoch = stream.size() <= reference.num_samples;
  out.line("samples: " + std::to_string(steps) + " steps x " + std::to_string(global_batch) + " = " +
           std::to_string(stream.size()) + " sample ids" +
           (one_epoch ? (distinct ? ", all distinct (no sample repeated)" : ", SOME REPEATED")
                      : " (more than one epoch of " + std::to_string(reference.num_samples) + ")") +
           (samples_identical ? "; each resumed step read the uninterrupted step's samples: none skipped or "
                                "repeated"
                              : "; a resumed run read OTHER samples"));
  if (one_epoch && !distinct) fail("the uninterrupted run repeats samples within an epoch");
  // judge_resume ran on rank 0 for the other world size: every rank learns the verdict.
  std::int64_t any_failure = failed ? 1 : 0;
  world.all_reduce(&any_failure, &any_failure, 1, DType::int64, ReduceOp::max);
  failed = any_failure != 0;

  // ---- (e) the chosen config and the report ---------------------------------------------------------
  nlohmann::json plan_config = nlohmann::json::parse(chosen.config_text);
  if (options.data_path) {
    nlohmann::json& data = plan_config["data"];
    if (!data.is_object()) data = nlohmann::json::object();
    data["path"] = *options.data_path;
    data.erase("format");
  }
  const std::string plan_path = (out_dir / "plan.json").string();
  const std::string reproduce = "mpirun -n " + std::to_string(ranks) + " zerotrain train --config " +
                                plan_path + " --steps " + std::to_string(steps);
  // Ranks per node and devices: every rank's.
  std::vector<std::int64_t> node_of(static_cast<std::size_t>(ranks));
  const std::int64_t my_node = runtime.node_index();
  world.all_gather(&my_node, node_of.data(), 1, DType::int64);
  const std::vector<std::string> devices = all_gather_strings(world, runtime.device().str());
  if (!leader) return failed ? 1 : 0;

  std::vector<int> ranks_per_node(static_cast<std::size_t>(runtime.node_count()), 0);
  for (std::int64_t node : node_of) ++ranks_per_node[static_cast<std::size_t>(node)];
  nlohmann::json environment;
  for (const Report& part : {build_report(), mpi_report(runtime), device_report(), io_report()}) {
    for (const ReportLine& line : part) environment[line.section][line.key] = line.value;
  }
  nlohmann::json report = {{"zerotrain", build_info::version},
                           {"date", base::utc_timestamp_text()},
                           {"command", options.command_line},
                           {"base_config", options.config_path},
                           {"world_size", ranks},
                           {"nodes", runtime.node_count()},
                           {"hosts", runtime.hosts()},
                           {"ranks_per_node", ranks_per_node},
                           {"devices", devices},
                           {"environment", environment},
                           {"model_parameters", parameters},
                           {"data", reference.data_description},
                           {"global_batch", global_batch},
                           {"memory_limit", {{"bytes", limit.bytes}, {"source", limit.source}}},
                           {"warmup_steps", options.warmup_steps},
                           {"measure_steps", options.measure_steps}};
  nlohmann::json candidates_json = nlohmann::json::array();
  for (const Entry& entry : entries) {
    nlohmann::json item = candidate_json(entry.candidate);
    item["predicted"] = predicted_json(entry.predicted);
    if (!entry.pruned.empty()) {
      item["pruned"] = entry.pruned;
    } else {
      const RunRecord& m = *entry.measured;
      const auto rank = std::find(ranked.begin(), ranked.end(), &entry) - ranked.begin() + 1;
      item["rank"] = rank;
      item["measured"] = {{"step_time_s", entry.step_seconds},
                          {"step_times_s", m.step_seconds},
                          {"tokens_per_s", entry.tokens_per_second},
                          {"resident_model_states", m.resident},
                          {"peak_accounted", m.peak_accounted},
                          {"peak_rss", m.peak_rss},
                          {"peak_rss_of", m.rss_reset ? "the candidate's run" : "the process"},
                          {"losses", m.losses}};
    }
    candidates_json.push_back(item);
  }
  report["candidates"] = candidates_json;
  report["chosen"] = candidate_json(chosen.candidate);
  report["config"] = plan_config;
  report["baseline"] = baseline_json;
  report["resume"] = {{"saved_at_step", save_step},   {"uninterrupted_losses", reference.losses},
                      {"runs", resume_json},          {"sample_ids", stream.size()},
                      {"samples_distinct", distinct}, {"within_one_epoch", one_epoch}};
  report["export"] = {{"path", exported_path}, {"parameters", exported_parameters}};
  report["reproduce"] = {{"command", reproduce}, {"steps", steps}, {"losses", reference.losses}};
  report["passed"] = !failed;

  std::ofstream(plan_path) << plan_config.dump(2) << "\n";
  const std::string report_json_path = (out_dir / "plan-report.json").string();
  std::ofstream(report_json_path) << report.dump(2) << "\n";

  std::ostringstream md;
  md << "# zerotrain plan\n\n"
     << "`" << options.command_line << "` on " << base::utc_timestamp_text() << ": zerotrain "
     << build_info::version << ", " << environment["mpi"].value("library", std::string("MPI")) << ", HDF5 "
     << environment["io"].value("HDF5", std::string(build_info::hdf5_version)) << ".\n\n"
     << "- ranks: " << ranks << " on " << runtime.node_count() << " node(s) (";
  for (std::size_t node = 0; node < ranks_per_node.size(); ++node)
    md << (node ? ", " : "") << runtime.hosts()[node] << ": " << ranks_per_node[node];
  md << " per node); devices: ";
  for (std::size_t r = 0; r < devices.size(); ++r) md << (r ? ", " : "") << devices[r];
  md << "\n- model: " << parameters << " parameters, " << dtype_name(compute_dtype_of(base))
     << "; data: " << reference.data_description << "\n- global batch " << global_batch << "; memory limit "
     << byte_size_text(limit.bytes) << " per rank (" << limit.source << ")\n\n## Environment\n\n";
  std::vector<std::vector<std::string>> env_rows = {{"section", "key", "value"}};
  for (const auto& [section, values] : environment.items()) {
    for (const auto& [key, value] : values.items())
      env_rows.push_back({section, key, value.get<std::string>()});
  }
  md << markdown_table(env_rows) << "\n## Candidates\n\nMeasured (" << options.warmup_steps << " warm-up + "
     << options.measure_steps << " timed steps each), ranked by tokens/s:\n\n"
     << markdown_table(table) << "\n";
  std::vector<std::vector<std::string>> pruned_rows = {{"candidate", "predicted peak", "why not measured"}};
  for (const Entry& entry : entries) {
    if (!entry.pruned.empty())
      pruned_rows.push_back({entry.candidate.name(), byte_size_text(entry.predicted.peak()), entry.pruned});
  }
  if (pruned_rows.size() > 1) md << "Pruned:\n\n" << markdown_table(pruned_rows) << "\n";
  md << "## Chosen\n\n"
     << chosen.candidate.name() << ": `" << plan_path << "`\n\n```json\n"
     << plan_config.dump(2) << "\n```\n\n## Checks\n\n";
  md << "- check run: " << steps << " steps on " << ranks << " rank(s), losses";
  for (double loss : reference.losses) md << " " << format("%.6f", loss);
  md << "\n";
  if (baseline_json.value("ran", false)) {
    md << "- baseline (1 rank, same samples): "
       << agreement_text(baseline_json["max_relative_difference"].get<double>()) << "\n";
  } else {
    md << "- baseline: not run (" << baseline_json.value("reason", std::string()) << ")\n";
  }
  for (const nlohmann::json& run : resume_json) {
    md << "- resumed at step " << save_step << " on " << run["ranks"].get<int>() << " rank(s): losses "
       << agreement_text(run["max_relative_difference"].get<double>()) << ", sample ids "
       << (run["samples_identical"].get<bool>() ? "identical" : "different") << "\n";
  }
  md << "- samples: " << stream.size() << " ids, " << (distinct ? "all distinct" : "some repeated") << "\n"
     << "- export: `" << exported_path << "`, " << exported_parameters << " parameter elements\n"
     << "- reproduce: `" << reproduce << "` gives the check run's losses\n"
     << "\nResult: " << (failed ? "FAILED" : "all checks passed") << "\n";
  const std::string report_md_path = (out_dir / "plan-report.md").string();
  std::ofstream(report_md_path) << md.str();
  out.line("wrote " + plan_path + ", " + report_json_path + ", " + report_md_path);
  out.line("reproduce: " + reproduce);
  out.line(failed ? "zerotrain plan: FAILED (see above)" : "zerotrain plan: all checks passed");
  return failed ? 1 : 0;
}

}  // namespace zt::engine_detail
