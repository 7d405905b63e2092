// zt::train: the loop behind `zerotrain train`.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "base/resident_memory.hpp"
#include "src/engine/checkpoint_directory.hpp"
#include "src/engine/device_choice.hpp"
#include "src/engine/evaluation.hpp"
#include "src/engine/metrics.hpp"
#include "src/engine/model_flops.hpp"
#include "src/engine/model_layers.hpp"
#include "src/engine/partition_plan.hpp"
#include "src/engine/pipeline_schedule.hpp"
#include "src/engine/string_broadcast.hpp"
#include "zerotrain/checkpoint.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/estimate.hpp"
#include "zerotrain/runtime.hpp"
#include "zerotrain/trainer.hpp"
#include "zerotrain/watchdog.hpp"

namespace zt {
namespace {

using Clock = std::chrono::steady_clock;

nlohmann::json model_description(const Config& config, std::int64_t parameters) {
  nlohmann::json model;
  if (const auto* gpt = std::get_if<GptModelConfig>(&*config.model)) {
    model = {{"type", "gpt"},
             {"n_layer", gpt->n_layer},
             {"n_head", gpt->n_head},
             {"d_model", gpt->d_model},
             {"seq_len", gpt->seq_len},
             {"vocab_size", gpt->vocab_size},
             {"tie_embeddings", gpt->tie_embeddings},
             {"dropout", gpt->dropout}};
  } else {
    const auto& mlp = std::get<MlpModelConfig>(*config.model);
    model = {{"type", "mlp"}, {"sizes", mlp.sizes}, {"activation", to_string(mlp.activation)}};
  }
  model["parameters"] = parameters;
  return model;
}

/// Memory by category as the maximum over ranks: per category the peak since the step began
/// (parameters, gradients and states are steady; activations peak inside the step, and so do stage
/// 3's gathered parameters and stages 2-3's transient full gradients), the peak of the total, and
/// under "resident" the model states held between steps: what the run allocated since `baseline`
/// (taken before the model was built) and still holds, which is what `zerotrain estimate` predicts;
/// next to them the process's resident set as the kernel counts it: now (`rss_bytes`) and its peak
/// since the step began (`peak_rss_bytes`), which the accounted `peak` plus the runtime's own
/// resident memory should explain (docs/metrics.md, "Resident memory"). On a GPU (`on_gpu`), the
/// GPU's own: its accounted peak (`device_peak`) and what its caching pool keeps on top of the
/// buffers now (`device_cached`).
nlohmann::json memory_max_over_ranks(Communicator& world, const MemorySnapshot& baseline, bool on_gpu) {
  // Every kind of memory the engine may keep its state in: the host, a GPU, the emulated test device.
  const MemorySnapshot host = memory_snapshot(DeviceType::host);
  MemorySnapshot devices = memory_snapshot(DeviceType::cuda);
  const MemorySnapshot emulated = memory_snapshot(DeviceType::emulated);
  for (std::size_t i = 0; i < kMemoryCategoryCount; ++i) {
    devices.by_category[i].current += emulated.by_category[i].current;
    devices.by_category[i].peak += emulated.by_category[i].peak;
  }
  devices.total.peak += emulated.total.peak;
  constexpr MemoryCategory kReported[] = {MemoryCategory::parameters,       MemoryCategory::gradients,
                                          MemoryCategory::optimizer_states, MemoryCategory::activations,
                                          MemoryCategory::comm_buffers,     MemoryCategory::workspace};
  constexpr MemoryCategory kModelStates[] = {MemoryCategory::parameters, MemoryCategory::gradients,
                                             MemoryCategory::optimizer_states};
  constexpr std::size_t kPeak = std::size(kReported);
  constexpr std::size_t kRss = kPeak + 1 + std::size(kModelStates);
  constexpr std::size_t kDevicePeak = kRss + 2;
  std::int64_t values[kDevicePeak + 2];
  for (std::size_t i = 0; i < std::size(kReported); ++i) {
    values[i] = static_cast<std::int64_t>(host[kReported[i]].peak + devices[kReported[i]].peak);
  }
  values[kPeak] = static_cast<std::int64_t>(host.total.peak + devices.total.peak);
  for (std::size_t i = 0; i < std::size(kModelStates); ++i) {
    values[kPeak + 1 + i] =
        static_cast<std::int64_t>(host[kModelStates[i]].current + devices[kModelStates[i]].current) -
        static_cast<std::int64_t>(baseline[kModelStates[i]].current);
  }
  const base::ResidentMemory rss = base::resident_memory();
  values[kRss] = rss.current;
  values[kRss + 1] = rss.peak;
  const MemorySnapshot gpu = memory_snapshot(DeviceType::cuda);
  values[kDevicePeak] = static_cast<std::int64_t>(gpu.total.peak);
  values[kDevicePeak + 1] = static_cast<std::int64_t>(gpu.cached);
  world.all_reduce(values, values, std::size(values), DType::int64, ReduceOp::max);
  nlohmann::json memory;
  for (std::size_t i = 0; i < std::size(kReported); ++i)
    memory[memory_category_name(kReported[i])] = values[i];
  memory["peak"] = values[kPeak];
  for (std::size_t i = 0; i < std::size(kModelStates); ++i)
    memory["resident"][memory_category_name(kModelStates[i])] = values[kPeak + 1 + i];
  memory["rss_bytes"] = values[kRss];
  memory["peak_rss_bytes"] = values[kRss + 1];
  if (on_gpu) {
    memory["device_peak"] = values[kDevicePeak];
    memory["device_cached"] = values[kDevicePeak + 1];
  }
  return memory;
}

/// This rank's peak of `category` since the step began, over every kind of memory.
std::int64_t rank_peak(MemoryCategory category) {
  std::uint64_t peak = 0;
  for (DeviceType type : {DeviceType::host, DeviceType::cuda, DeviceType::emulated})
    peak += memory_snapshot(type)[category].peak;
  return static_cast<std::int64_t>(peak);
}

const char* schedule_name(PipelineSchedule schedule) {
  return schedule == PipelineSchedule::gpipe ? "gpipe" : "1f1b";
}

/// How the config's pipeline splits the model: its stages' layers and parameters (a tied copy
/// counts on the stage that holds it), as zt::build_model(config, stage) builds them.
struct PipelineLayout {
  std::vector<std::string> stage_layers;
  std::vector<std::int64_t> stage_parameters;
};

PipelineLayout pipeline_layout_of(const Config& config) {
  const std::vector<nn::LayerSpec> layers = engine_detail::layers_of_config(config);
  const std::vector<std::int64_t> boundaries = engine_detail::stage_boundaries_of_config(config);
  PipelineLayout layout;
  for (int stage = 0; stage + 1 < static_cast<int>(boundaries.size()); ++stage) {
    layout.stage_layers.push_back(engine_detail::describe_stage_layers(layers, boundaries, stage));
    std::int64_t parameters = 0;
    for (const engine_detail::PlannedParameter& parameter :
         engine_detail::planned_parameters_of_stage(config, stage))
      parameters += shape_numel(parameter.shape);
    layout.stage_parameters.push_back(parameters);
  }
  return layout;
}

/// The step's pipeline metrics for every stage, gathered from all ranks (collective over `world`):
/// each stage's busy and idle seconds and its peak of activation memory, each the maximum over
/// the stage's data-parallel ranks, and its bubble fraction (the largest of its ranks' idle /
/// (busy + idle)); with the schedule, the micro-batches and the ideal bubble of equal stages.
nlohmann::json pipeline_step_metrics(Communicator& world, const PipelineTiming& timing,
                                     PipelineSchedule schedule, std::int64_t micro_batches) {
  const auto stages = static_cast<std::size_t>(timing.stages);
  const auto stage = static_cast<std::size_t>(timing.stage);
  // Four rows of one value per stage; this rank fills its stage's column, the maximum gathers them.
  std::vector<double> values(4 * stages, 0.0);
  values[0 * stages + stage] = timing.busy_seconds;
  values[1 * stages + stage] = timing.idle_seconds;
  values[2 * stages + stage] = timing.bubble_fraction();
  values[3 * stages + stage] =
      static_cast<double>(rank_peak(MemoryCategory::activations));  // exact below 2^53
  world.all_reduce(values.data(), values.data(), values.size(), DType::fp64, ReduceOp::max);
  auto row = [&](std::size_t i) {
    return std::vector<double>(values.begin() + static_cast<std::ptrdiff_t>(i * stages),
                               values.begin() + static_cast<std::ptrdiff_t>((i + 1) * stages));
  };
  std::vector<std::int64_t> peaks;
  for (double peak : row(3)) peaks.push_back(static_cast<std::int64_t>(peak));
  return {
      {"stages", timing.stages},
      {"schedule", schedule_name(schedule)},
      {"micro_batches", micro_batches},
      {"ideal_bubble", engine_detail::ideal_bubble_fraction(timing.stages, static_cast<int>(micro_batches))},
      {"stage_busy_seconds", row(0)},
      {"stage_idle_seconds", row(1)},
      {"bubble_fraction", row(2)},
      {"stage_peak_activations", peaks}};
}

volatile std::sig_atomic_t stop_signal_received = 0;

extern "C" void remember_stop_signal(int signal) {
  stop_signal_received = signal;
}

/// The signal any rank received (0: none); every rank gets the same answer (collective).
int agreed_stop_signal(Communicator& world) {
  std::int64_t signal = StopSignalScope::received();
  world.all_reduce(&signal, &signal, 1, DType::int64, ReduceOp::max);
  return static_cast<int>(signal);
}

const char* stop_signal_name(int signal) {
  return signal == SIGTERM ? "SIGTERM" : "SIGUSR1";
}

/// --resume auto with TrainOptions::resume_job_id: the checkpoint at `path` must have been saved by
/// that Slurm job. Rank 0 reads its record; every rank throws the same refusal, none is left waiting.
void check_resume_job(Runtime& runtime, const std::string& path, const std::string& job_id) {
  std::string refusal;
  if (runtime.world_rank() == 0) {
    const std::string saved_by = inspect_checkpoint(path).slurm_job_id;
    if (saved_by != job_id) {
      refusal = "refusing to resume from '" + path + "': it was saved " +
                (saved_by.empty() ? std::string("outside Slurm (no slurm_job_id recorded)")
                                  : "by Slurm job " + saved_by) +
                ", and this is Slurm job " + job_id +
                ", which resumes only its own checkpoints from its own directory (--resume-job " + job_id +
                "). To continue that run, resume without --resume-job (jobscripts/slurm.sbatch: "
                "ZT_RESUME_FOREIGN=1, or ZT_SAVE_DIR naming the directory)";
    }
  }
  refusal = engine_detail::broadcast_string(runtime.world(), refusal);
  ZT_CHECK_AS(ConfigError, refusal.empty(), refusal);
}

/// The watchdog's report (a lost rank, a hung collective) goes to the metrics file as an alert
/// while the run trains, when this rank writes metrics and reports.
class WatchdogReportsToMetrics {
 public:
  WatchdogReportsToMetrics(engine_detail::MetricsWriter& metrics, int rank) {
    if (!metrics.active()) return;
    installed_ = true;
    set_watchdog_report_listener([&metrics, rank](const std::string& report, int exit_code) {
      const bool lost = exit_code == kWatchdogRankLostExitCode;
      // The job ends right after: wait briefly for a step being written, never for long.
      (void)metrics.try_write(
          {{"event", "alert"},
           {"kind", lost ? "rank_lost" : "collective_timeout"},
           {"rank", rank},
           {"exit_code", exit_code},
           {"message", lost ? "the watchdog lost a rank; the job ends"
                            : "a collective did not complete within the timeout; the job ends"},
           {"report", report}},
          1.0);
    });
  }
  ~WatchdogReportsToMetrics() {
    if (installed_) set_watchdog_report_listener({});
  }
  WatchdogReportsToMetrics(const WatchdogReportsToMetrics&) = delete;
  WatchdogReportsToMetrics& operator=(const WatchdogReportsToMetrics&) = delete;

 private:
  bool installed_ = false;
};

/// A warning and an alert once each time the rank with the fullest memory passes the configured
/// fraction of its limit (re-armed when it falls below). Collective over `world` every step.
class MemoryAlerts {
 public:
  explicit MemoryAlerts(const AlertsConfig& alerts)
      : fraction_(alerts.memory_fraction), limit_(engine_detail::host_memory_limit(alerts)) {}

  void check(Communicator& world, engine_detail::MetricsWriter& metrics, std::int64_t step) {
    // This rank's use: what it holds now, or what it allocated at the step's peak if more.
    const std::int64_t used =
        std::max(engine_detail::resident_bytes(),
                 static_cast<std::int64_t>(memory_snapshot(DeviceType::host).total.peak));
    const std::int64_t parts_per_million =
        limit_.bytes > 0 ? static_cast<std::int64_t>(std::min(
                               1e6 * static_cast<double>(used) / static_cast<double>(limit_.bytes), 1e11))
                         : 0;
    // One integer per rank, the largest wins: parts per million in the high bits (at most 1e11 <
    // 2^37, so the key stays below 2^61), the rank below.
    constexpr int kRankBits = 24;
    std::int64_t key = (parts_per_million << kRankBits) | world.rank();
    world.all_reduce(&key, &key, 1, DType::int64, ReduceOp::max);
    const double worst = static_cast<double>(key >> kRankBits) / 1e6;
    const int worst_rank = static_cast<int>(key & ((std::int64_t{1} << kRankBits) - 1));
    if (worst < fraction_) {
      active_ = false;
      return;
    }
    if (active_) return;
    active_ = true;
    // The fullest rank's numbers, for the message.
    std::int64_t numbers[2] = {used, limit_.bytes};
    world.broadcast(numbers, 2, DType::int64, worst_rank);
    char message[256];
    std::snprintf(message, sizeof message,
                  "memory of rank %d passed %.0f %% of its limit at step %lld: %.1f MiB of %.1f MiB (%s)",
                  worst_rank, 100.0 * fraction_, static_cast<long long>(step),
                  static_cast<double>(numbers[0]) / (1 << 20), static_cast<double>(numbers[1]) / (1 << 20),
                  limit_.source.c_str());
    if (world.rank() == 0) {
      engine_detail::raise_alert(metrics, worst_rank, "memory", message,
                                 {{"step", step},
                                  {"bytes", numbers[0]},
                                  {"limit_bytes", numbers[1]},
                                  {"limit", limit_.source},
                                  {"fraction", worst}});
    }
  }

 private:
  double fraction_;
  engine_detail::MemoryLimit limit_;
  bool active_ = false;
};

/// "1:02:03": hours, minutes and seconds, for the progress line's elapsed time and ETA.
std::string clock_text(double seconds) {
  const auto whole = static_cast<long long>(std::max(0.0, std::round(seconds)));
  char text[32];
  std::snprintf(text, sizeof text, "%lld:%02lld:%02lld", whole / 3600, whole / 60 % 60, whole % 60);
  return text;
}

/// The MFU's denominator, the peak FLOP/s of the whole job: options.peak_flops per rank, or the sum
/// of every rank's own (engine_detail::rank_peak_flops: a GPU's data-sheet figure, else the measured
/// matmul rate; the ranks measure side by side, sharing their node's cores as they will in training).
/// Collective. `description` says where the figure came from.
struct PeakFlops {
  double total = 0.0;
  std::string source;       // "--peak-flops", "data sheet", "matmul probe" (rank 0's)
  std::string description;  // for the run's header
};
PeakFlops job_peak_flops(Runtime& runtime, const Config& config, const TrainOptions& options, Device device) {
  PeakFlops peak;
  char text[320];
  if (options.peak_flops) {
    peak.total = *options.peak_flops * runtime.world_size();
    peak.source = "--peak-flops";
    std::snprintf(text, sizeof text, "peak %.3g FLOP/s = %d rank(s) x --peak-flops %.3g", peak.total,
                  runtime.world_size(), *options.peak_flops);
  } else {
    const DType dtype = compute_dtype_of(config);
    runtime.world().barrier();
    const engine_detail::RankPeakFlops rank = engine_detail::rank_peak_flops(device, dtype);
    peak.total = rank.flops_per_second;
    runtime.world().all_reduce(&peak.total, &peak.total, 1, DType::fp64, ReduceOp::sum);
    peak.source = rank.source;
    std::snprintf(text, sizeof text,
                  "peak %.3g FLOP/s = the ranks' %s (rank 0: %.3g, %s; --peak-flops sets it)", peak.total,
                  rank.source == "data sheet" ? "data-sheet peaks" : "matmul probes", rank.flops_per_second,
                  rank.detail.c_str());
  }
  peak.description = text;
  return peak;
}

/// The warning for a run whose --steps goes past the end of its lr schedule (total_num_steps of
/// WarmupDecayLR and WarmupCosineLR; the other schedules have no end): the steps after it train
/// with the lr the schedule ends at, which is rarely what was meant. Step s runs with the lr of
/// scheduler iteration L + s - g - 1 (L the scheduler's iteration and g the global steps now; steps
/// skipped on an fp16 overflow do not advance it), so a fresh run's schedule ends at step
/// total_num_steps.
std::optional<std::string> schedule_end_warning(Engine& engine, std::int64_t target_steps) {
  const Config& cfg = engine.config();
  const LRScheduler* scheduler = engine.lr_scheduler();
  if (!cfg.scheduler || scheduler == nullptr) return std::nullopt;
  const std::optional<std::int64_t> total = std::visit(
      [](const auto& params) -> std::optional<std::int64_t> {
        if constexpr (requires { params.total_num_steps; }) {
          return params.total_num_steps;
        } else {
          return std::nullopt;
        }
      },
      cfg.scheduler->params);
  if (!total) return std::nullopt;
  const std::int64_t now = engine.global_steps();
  const auto iteration = [&](std::int64_t step) {
    return scheduler->last_batch_iteration() + step - now - 1;
  };
  const std::int64_t end_step = *total + (now - 1 - scheduler->last_batch_iteration());
  if (target_steps <= end_step) return std::nullopt;
  const std::int64_t first = std::max(end_step + 1, now + 1);
  const double first_lr = scheduler->lr_at(iteration(first));
  const double last_lr = scheduler->lr_at(iteration(target_steps));
  char text[512];
  const int written = std::snprintf(
      text, sizeof text,
      "--steps %lld goes past the end of the %s schedule (scheduler.params.total_num_steps = %lld",
      static_cast<long long>(target_steps), std::string(scheduler->name()).c_str(),
      static_cast<long long>(*total));
  std::string message(text, static_cast<std::size_t>(std::max(0, written)));
  if (end_step != *total) message += ", its end at global step " + std::to_string(end_step) + " in this run";
  if (first_lr == last_lr) {
    std::snprintf(text, sizeof text, "): steps %lld..%lld all train with lr %.3e, the value it ends at",
                  static_cast<long long>(first), static_cast<long long>(target_steps), first_lr);
  } else {
    std::snprintf(text, sizeof text, "): steps %lld..%lld train with lr %.3e (step %lld) to %.3e (step %lld)",
                  static_cast<long long>(first), static_cast<long long>(target_steps), first_lr,
                  static_cast<long long>(first), last_lr, static_cast<long long>(target_steps));
  }
  return message + text;
}

int stop_scope_depth = 0;
struct sigaction previous_term = {};
struct sigaction previous_usr1 = {};

/// What each rank may allocate on its GPU: the smallest free memory over the job's ranks
/// (cudaMemGetInfo, before the model), so that every rank decides check_fits_device_memory alike.
DeviceMemory job_device_memory(Runtime& runtime, Device device) {
  // The smallest over the ranks, as the largest of the negated values (the reductions have no min).
  std::int64_t negated = -static_cast<std::int64_t>(device_memory_info(device).free);
  runtime.world().all_reduce(&negated, &negated, 1, DType::int64, ReduceOp::max);
  const std::int64_t free_bytes = -negated;
  char text[160];
  std::snprintf(text, sizeof text,
                "%.1f GiB is free on the GPU with the least (cudaMemGetInfo over the job's %d rank(s))",
                static_cast<double>(free_bytes) / (1024.0 * 1024.0 * 1024.0), runtime.world_size());
  return {static_cast<std::uint64_t>(std::max<std::int64_t>(free_bytes, 0)), text};
}

}  // namespace

StopSignalScope::StopSignalScope() : outermost_(stop_scope_depth++ == 0) {
  if (!outermost_) return;
  stop_signal_received = 0;
  struct sigaction action = {};
  action.sa_handler = remember_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &action, &previous_term);
  sigaction(SIGUSR1, &action, &previous_usr1);
}

StopSignalScope::~StopSignalScope() {
  --stop_scope_depth;
  if (!outermost_) return;
  sigaction(SIGTERM, &previous_term, nullptr);
  sigaction(SIGUSR1, &previous_usr1, nullptr);
}

int StopSignalScope::received() {
  return stop_signal_received;
}

RuntimeOptions runtime_options_for(const Config& config, RuntimeOptions options) {
  if (!config.comm.timeout_s) return options;
  options.collective_timeout = std::chrono::duration<double>(*config.comm.timeout_s);
  options.collective_timeout_source =
      "comm.timeout_s in " + (config.source() == "<string>" ? std::string("the config string")
                                                            : "config file '" + config.source() + "'");
  return options;
}

TrainSummary train(Runtime& runtime, Config config, const TrainOptions& options) {
  ZT_CHECK_AS(ConfigError, options.steps >= 0, "--steps must be >= 0, got ", options.steps);
  // Before anything slow: a signal while the model is built or a checkpoint loads stops the run
  // at the next agreement point below instead of killing it (`zerotrain train` installs it even
  // before MPI starts).
  StopSignalScope stop_signals;
  const bool leader = runtime.world_rank() == 0;
  // The watchdog started with the runtime: a comm.timeout_s that did not reach it is said, not
  // silently ignored.
  if (const auto& timeout = config.comm.timeout_s;
      leader && timeout && std::getenv("ZT_COLLECTIVE_TIMEOUT") == nullptr &&
      runtime.collective_timeout_source().find("comm.timeout_s") == std::string::npos) {
    std::fprintf(
        stderr,
        "zerotrain: warning: comm.timeout_s (%g s) is not in force: the watchdog runs with %g s from "
        "%s; create the runtime with zt::runtime_options_for(config)\n",
        *timeout, runtime.collective_timeout().count(), runtime.collective_timeout_source().c_str());
  }
  check_engine_supports(config);
  // Where to compute, agreed on every rank before anything costly (docs/config.md, "device").
  const Device device =
      options.device ? *options.device : engine_detail::resolve_training_device(runtime, config.device);
  // Sizes that cannot fit fail here, naming their keys, not as "out of host memory" after the
  // allocations have run for a while.
  check_fits_host_memory(config, runtime.world_size(), runtime.local_size(),
                         host_memory(runtime.local_size()), device.type);
  if (device.is_cuda())
    check_fits_device_memory(config, runtime.world_size(), job_device_memory(runtime, device));
  // Device memory counts too, from whatever this process held before the model.
  MemorySnapshot before_model = memory_snapshot(DeviceType::host);
  for (std::size_t i = 0; i < kMemoryCategoryCount; ++i) {
    before_model.by_category[i].current += memory_snapshot(DeviceType::cuda).by_category[i].current +
                                           memory_snapshot(DeviceType::emulated).by_category[i].current;
  }
  // The save directory, checked and locked before anything costly: a second job on it, or a
  // directory that cannot be written, fails now instead of at the first save hours later.
  const std::optional<std::string> save_dir =
      options.save_dir ? options.save_dir : config.checkpoint.save_dir;
  std::shared_ptr<engine_detail::CheckpointDirectoryLock> directory_lock;  // rank 0's, for the run
  if (save_dir) {
    engine_detail::check_checkpoint_modes(config.checkpoint.file_mode, config.checkpoint.dir_mode);
    engine_detail::on_rank0_everywhere(runtime.world(), [&] {
      engine_detail::prepare_checkpoint_directory(*save_dir, config.checkpoint.dir_mode);
      directory_lock =
          engine_detail::CheckpointDirectoryLock::acquire(*save_dir, config.checkpoint.file_mode);
    });
  }
  // The MFU's peak, before the model takes the memory and the cores. Its buffers go back to the
  // kernel before the runtime's resident memory is read (the threads it started count there).
  const PeakFlops peak_flops = job_peak_flops(runtime, config, options, device);
  base::release_freed_heap();
  // What the process holds before the model (MPI, UCX, the libraries, OpenBLAS's buffers): the
  // runtime's fixed resident memory, reported in the start record.
  std::int64_t runtime_rss = base::resident_memory().current;
  // With pipeline stages each rank builds only its stage; the engine makes the pipeline x data grid.
  const int stages = static_cast<int>(config.pipeline.stage_count());
  std::unique_ptr<nn::Module> model =
      stages > 1 ? build_model(config, pipeline_stage_of(runtime, config)) : build_model(config);
  Engine engine(runtime, *model, std::move(config), EngineOptions{.device = device});
  runtime.world().all_reduce(&runtime_rss, &runtime_rss, 1, DType::int64, ReduceOp::max);
  const Config& cfg = engine.config();
  // The whole model's parameters (the engine holds this stage's).
  const std::int64_t model_parameters =
      stages > 1 ? model_parameter_count(cfg) : engine.parameter_count() + engine.frozen_parameter_count();
  const PipelineLayout pipeline = stages > 1 ? pipeline_layout_of(cfg) : PipelineLayout{};
  std::unique_ptr<TrainingData> data = make_training_data(cfg, engine, options.data_path);
  // The validation loss (docs/config.md, "eval"): --eval-data wins over eval.data.
  const std::optional<std::string> eval_path =
      options.eval_data_path ? options.eval_data_path : (cfg.eval ? cfg.eval->data : std::nullopt);
  ZT_CHECK_AS(ConfigError, eval_path || !cfg.eval,
              "the config's \"eval\" section names no eval data: set eval.data "
              "or pass --eval-data PATH");
  std::unique_ptr<engine_detail::Evaluator> evaluator =
      eval_path ? std::make_unique<engine_detail::Evaluator>(runtime, cfg, engine, *eval_path) : nullptr;
  const BatchSizes& batch = engine.batch();
  const std::int64_t print_every = options.print_every.value_or(cfg.steps_per_print.value_or(10));

  engine_detail::MetricsWriter metrics =
      leader ? engine_detail::MetricsWriter(options.metrics_path, cfg) : engine_detail::MetricsWriter();
  const WatchdogReportsToMetrics watchdog_reports(metrics, runtime.world_rank());
  MemoryAlerts memory_alerts(cfg.alerts);
  TrainSummary summary;

  // Checkpoints: the flags win over the config's "checkpoint" section (save_dir above).
  const std::int64_t save_interval = options.save_interval.value_or(cfg.checkpoint.save_interval);
  ZT_CHECK_AS(ConfigError, save_interval >= 0, "--save-interval must be >= 0, got ", save_interval);
  // Recorded in every checkpoint; rank 0's, so that the collective attribute write sees one value.
  const char* job_variable = std::getenv("SLURM_JOB_ID");
  const std::string slurm_job_id =
      engine_detail::broadcast_string(runtime.world(), leader && job_variable ? job_variable : "");
  ZT_CHECK_AS(ConfigError, options.keep_last.value_or(0) >= 0, "--keep-last must be >= 0 (0 keeps all), got ",
              options.keep_last.value_or(0));
  ZT_CHECK_AS(ConfigError, print_every >= 0, "--print-every must be >= 0 (0 prints no progress lines), got ",
              print_every);
  auto save = [&](const char* why) {
    const auto began = Clock::now();
    SaveOptions save_options;
    save_options.data_position = data->position();
    save_options.keep_last = options.keep_last.value_or(cfg.checkpoint.keep_last);
    save_options.file_mode = cfg.checkpoint.file_mode;
    save_options.dir_mode = cfg.checkpoint.dir_mode;
    save_options.slurm_job_id = slurm_job_id;
    const std::string tag = engine.save_checkpoint(*save_dir, save_options);
    const double seconds = std::chrono::duration<double>(Clock::now() - began).count();
    summary.last_saved = tag;
    metrics.write({{"event", "checkpoint"},
                   {"tag", tag},
                   {"step", engine.global_steps()},
                   {"reason", why},
                   {"path", checkpoint_file(*save_dir, tag)},
                   {"seconds", seconds}});
    if (leader) {
      std::printf("zerotrain train: saved checkpoint %s (step %lld, %s) in %.2f s\n",
                  checkpoint_file(*save_dir, tag).c_str(), static_cast<long long>(engine.global_steps()), why,
                  seconds);
      std::fflush(stdout);
    }
  };
  // A signal during start-up: every rank stops here together (one collective, the same on all), with
  // kPreemptedExitCode and nothing saved: no step was taken, the last checkpoint is still the state.
  int startup_signal = 0;
  auto stopped_during_startup = [&](const char* before) {
    if (startup_signal == 0) startup_signal = agreed_stop_signal(runtime.world());
    if (startup_signal != 0 && leader) {
      std::printf("zerotrain train: %s received during start-up; stopping before %s (nothing new to save)\n",
                  stop_signal_name(startup_signal), before);
      std::fflush(stdout);
    }
    return startup_signal != 0;
  };
  // What the trainer's checkpoints promise beyond their checksums: the sampler's position is where
  // the engine's global samples end (global batch k starts at stream position k * B).
  const auto check_data_position = [](const CheckpointSummary& checkpoint) {
    if (!checkpoint.data_position) return;
    ZT_CHECK_AS(
        IoError,
        checkpoint.data_position->stream_position() == static_cast<std::uint64_t>(checkpoint.global_samples),
        "its data position (epoch ", checkpoint.data_position->epoch, ", offset ",
        checkpoint.data_position->offset, " of ", checkpoint.data_position->num_samples,
        " samples) is not where its ", checkpoint.global_samples, " global samples end");
  };
  bool resumed = false;  // from a checkpoint (step 0's too: an imported one)
  if (options.resume && !stopped_during_startup("loading the checkpoint")) {
    std::string dir;
    std::optional<std::string> tag;
    if (*options.resume == "auto") {
      ZT_CHECK_AS(ConfigError, save_dir.has_value(),
                  "--resume auto looks in the save directory: give --save-dir (or checkpoint.save_dir)");
      dir = *save_dir;
      std::string found;
      std::string refusal;
      if (leader && std::filesystem::is_directory(dir)) {
        found = newest_valid_checkpoint(dir, check_data_position).value_or("");
        const std::vector<std::string> tags = checkpoint_tags_newest_first(dir);
        if (found.empty() &&
            (!tags.empty() || std::filesystem::exists(std::filesystem::path(dir) / "latest"))) {
          refusal = "--resume auto: none of the " + std::to_string(tags.size()) + " checkpoint(s) in '" +
                    dir +
                    "' is valid (the reasons are above); refusing to start from step 0 over them. Repair or "
                    "move them away to start afresh, or --resume DIR/TAG.h5 to load one regardless of "
                    "its verification";
        }
      }
      found = engine_detail::broadcast_string(runtime.world(), found);
      refusal = engine_detail::broadcast_string(runtime.world(), refusal);
      if (!refusal.empty()) throw NoValidCheckpointError(refusal);
      if (!found.empty()) tag = found;
      if (tag && options.resume_job_id)
        check_resume_job(runtime, checkpoint_file(dir, *tag), *options.resume_job_id);
    } else if (std::filesystem::path(*options.resume).extension() == ".h5") {
      dir = std::filesystem::path(*options.resume).parent_path().string();
      tag = std::filesystem::path(*options.resume).stem().string();
    } else {
      dir = *options.resume;
    }
    if (tag || *options.resume != "auto") {
      LoadOptions load_options;
      load_options.tag = tag;
      const LoadResult loaded = engine.load_checkpoint(dir, load_options);
      if (loaded.data_position) {
        ZT_CHECK_AS(
            IoError,
            loaded.data_position->stream_position() == static_cast<std::uint64_t>(engine.global_samples()),
            "checkpoint '", loaded.path, "': its data position (epoch ", loaded.data_position->epoch,
            ", offset ", loaded.data_position->offset, " of ", loaded.data_position->num_samples,
            " samples) is not where ", engine.global_samples(),
            " global samples end; the file is damaged or was edited");
        data->restore(*loaded.data_position);
      }
      summary.resumed_from_step = engine.global_steps();
      resumed = true;
      if (leader) {
        std::printf(
            "zerotrain train: resumed from %s at step %lld (saved on %lld rank(s) at ZeRO stage %d)\n",
            loaded.path.c_str(), static_cast<long long>(engine.global_steps()),
            static_cast<long long>(loaded.saved_world_size), loaded.saved_zero_stage);
      }
    } else if (leader) {
      std::printf("zerotrain train: no checkpoint in %s yet; starting from step 0\n", dir.c_str());
    }
  }
  // "init": {"from": PATH}: a fresh run starts from the file's weights; a resumed one from its checkpoint.
  if (cfg.init.from && !resumed && startup_signal == 0) {
    const std::size_t tensors = engine.load_weights(*cfg.init.from);
    if (leader) {
      std::printf("zerotrain train: initialized %zu tensors from %s (init.from)\n", tensors,
                  cfg.init.from->c_str());
    }
  }
  if (!cfg.freeze.empty() && leader) {
    std::printf(
        "zerotrain train: %zu parameter tensors frozen (%lld elements; freeze): no gradient, optimizer "
        "state or reduction for them\n",
        engine.frozen_parameters().size(), static_cast<long long>(engine.frozen_parameter_count()));
  }
  if (startup_signal == 0) stopped_during_startup("the first step");
  summary.preempted = startup_signal != 0;
  const double flops_per_token = engine_detail::model_flops_per_token(cfg, model_parameters);
  if (const std::optional<std::string> warning = schedule_end_warning(engine, options.steps);
      leader && warning)
    std::fprintf(stderr, "zerotrain train: warning: %s\n", warning->c_str());
  nlohmann::json start = {{"event", "start"},
                          {"world_size", runtime.world_size()},
                          {"data_parallel_size", batch.data_parallel_size},
                          {"zero_stage", cfg.zero_optimization.stage},
                          {"params_total", model_parameters},
                          {"params_frozen", engine.frozen_parameter_count()},
                          {"dtype", dtype_name(engine.compute_dtype())},
                          {"model", model_description(cfg, model_parameters)},
                          {"train_batch_size", batch.train_batch_size},
                          {"micro_batch_size", batch.train_micro_batch_size_per_gpu},
                          {"gradient_accumulation_steps", batch.gradient_accumulation_steps},
                          {"optimizer", to_string(cfg.optimizer->type)},
                          {"data", data->description()},
                          {"target_steps", options.steps},
                          {"resumed_from_step", summary.resumed_from_step},
                          {"flops_per_token", flops_per_token},
                          {"peak_flops", peak_flops.total},
                          {"peak_flops_source", peak_flops.source},
                          {"runtime_rss_bytes", runtime_rss}};
  const std::int64_t micro_batches = batch.gradient_accumulation_steps;
  if (stages > 1) {
    start["pipeline"] = {
        {"stages", stages},
        {"schedule", schedule_name(cfg.pipeline.schedule)},
        {"partition", cfg.pipeline.partition},
        {"micro_batches", micro_batches},
        {"ideal_bubble", engine_detail::ideal_bubble_fraction(stages, static_cast<int>(micro_batches))},
        {"stage_layers", pipeline.stage_layers},
        {"stage_parameters", pipeline.stage_parameters}};
  }
  const OptimizerStatesPlacement placement = engine.optimizer_states_placement();
  if (placement.device != OffloadDevice::none) {  // rank 0's; the other ranks' files differ by rank
    start["optimizer_states"] = {
        {"offload", to_string(placement.device)},   {"where", placement.describe()},
        {"swap_bytes", placement.swap_bytes},       {"host_buffer_bytes", placement.buffer_bytes},
        {"staging_bytes", placement.staging_bytes}, {"sub_groups", placement.sub_groups}};
  }
  const ParametersPlacement parameters = engine.parameters_placement();
  if (parameters.device != OffloadDevice::none) {
    start["parameters"] = {
        {"offload", to_string(parameters.device)},   {"where", parameters.describe()},
        {"host_elements", parameters.host_elements}, {"nvme_elements", parameters.nvme_elements},
        {"swap_bytes", parameters.swap_bytes},       {"host_buffer_bytes", parameters.buffer_bytes}};
  }
  if (evaluator) {
    start["eval"] = {{"data", evaluator->description()},
                     {"interval", evaluator->interval()},
                     {"batches", evaluator->batches()},
                     {"samples", evaluator->samples()}};
  }
  metrics.write(start);
  if (leader) {
    std::printf("zerotrain train: %s model, %lld parameters, %s, ZeRO stage %d, %d rank(s) on %d node(s)\n",
                std::holds_alternative<GptModelConfig>(*cfg.model) ? "GPT" : "MLP",
                static_cast<long long>(model_parameters),
                std::string(dtype_name(engine.compute_dtype())).c_str(), engine.zero_stage(),
                runtime.world_size(), runtime.node_count());
    std::printf("  batch %lld = micro %lld x accumulation %lld x data-parallel %d; data: %s\n",
                static_cast<long long>(batch.train_batch_size),
                static_cast<long long>(batch.train_micro_batch_size_per_gpu),
                static_cast<long long>(batch.gradient_accumulation_steps), batch.data_parallel_size,
                data->description().c_str());
    if (stages > 1) {
      std::printf(
          "  pipeline: %d stages x %d data-parallel, schedule %s, %lld micro-batches (ideal bubble %.3f), "
          "partition %s\n",
          stages, batch.data_parallel_size, schedule_name(cfg.pipeline.schedule),
          static_cast<long long>(micro_batches),
          engine_detail::ideal_bubble_fraction(stages, static_cast<int>(micro_batches)),
          cfg.pipeline.partition.c_str());
      for (int stage = 0; stage < stages; ++stage) {
        const auto s = static_cast<std::size_t>(stage);
        std::printf("    stage %d: %s, %lld parameters\n", stage, pipeline.stage_layers[s].c_str(),
                    static_cast<long long>(pipeline.stage_parameters[s]));
      }
    }
    if (evaluator) {
      std::printf("  eval: %s; %lld batches (%lld samples) %s\n", evaluator->description().c_str(),
                  static_cast<long long>(evaluator->batches()), static_cast<long long>(evaluator->samples()),
                  evaluator->interval() > 0
                      ? ("every " + std::to_string(evaluator->interval()) + " steps and at the end").c_str()
                      : "at the end");
    }
    for (const std::string& destination : metrics.destinations())
      std::printf("  metrics: %s\n", destination.c_str());
    if (placement.device != OffloadDevice::none)
      std::printf("  optimizer states (rank 0): %s\n", placement.describe().c_str());
    if (parameters.device != OffloadDevice::none)
      std::printf("  parameters (rank 0): %s\n", parameters.describe().c_str());
    std::printf("  MFU: %.4g model FLOPs per token (%s), %s\n", flops_per_token,
                std::holds_alternative<GptModelConfig>(*cfg.model)
                    ? "6 x parameters + 12 x layers x seq_len x d_model"
                    : "6 x parameters",
                peak_flops.description.c_str());
    std::fflush(stdout);
  }

  const double tokens_per_step = static_cast<double>(batch.train_batch_size * data->tokens_per_sample());
  double total_seconds = 0;
  const auto loop_began = Clock::now();
  std::int64_t peak_accounted = 0, peak_rss = 0;  // over the steps, maximum over ranks
  while (!summary.preempted && engine.global_steps() < options.steps) {
    reset_memory_peaks();
    base::reset_resident_peak();
    const auto began = Clock::now();
    engine.train_batch([&](std::int64_t micro) { return data->load(static_cast<std::uint64_t>(micro)); });
    data->advance();
    const double seconds = std::chrono::duration<double>(Clock::now() - began).count();
    total_seconds += seconds;
    const StepReport& report = engine.last_step();
    if (summary.steps == 0) summary.first_loss = report.loss;
    summary.last_loss = report.loss;
    ++summary.steps;

    const nlohmann::json memory = memory_max_over_ranks(runtime.world(), before_model, device.is_cuda());
    peak_accounted = std::max(peak_accounted, memory["peak"].get<std::int64_t>());
    peak_rss = std::max(peak_rss, memory["peak_rss_bytes"].get<std::int64_t>());
    const nlohmann::json pipeline_step =
        stages > 1
            ? pipeline_step_metrics(runtime.world(), report.pipeline, cfg.pipeline.schedule, micro_batches)
            : nlohmann::json();
    const double tokens_per_second = tokens_per_step / seconds;
    const double mfu = tokens_per_second * flops_per_token / peak_flops.total;
    nlohmann::json step_line = {
        {"event", "step"},
        {"step", report.step},
        {"samples", engine.global_samples()},
        {"tokens", static_cast<std::int64_t>(engine.global_samples()) *
                       static_cast<std::int64_t>(data->tokens_per_sample())},
        {"loss", report.loss},
        {"lr", report.lr},
        {"loss_scale", report.loss_scale},
        {"grad_norm", std::isfinite(report.grad_norm) ? nlohmann::json(report.grad_norm) : nlohmann::json()},
        {"skipped", report.skipped},
        {"step_time_s", seconds},
        {"tokens_per_s", tokens_per_second},
        {"mfu", mfu},
        {"mem", memory},
        {"comm_bytes", report.comm_bytes},
        {"comm_wait_s", report.comm.wait_seconds},
        {"comm_busy_s", report.comm.busy_seconds}};
    if (placement.device == OffloadDevice::nvme) {  // rank 0's sub-group pipeline
      step_line["offload_wall_s"] = report.offload.wall_seconds;
      step_line["offload_update_s"] = report.offload.update_seconds;
      step_line["offload_stall_s"] = report.offload.stalled_seconds;
    }
    if (parameters.device == OffloadDevice::nvme) {  // rank 0's parameter swap traffic
      step_line["param_read_bytes"] = report.offload.parameter_bytes_read;
      step_line["param_written_bytes"] = report.offload.parameter_bytes_written;
      step_line["param_wait_s"] = report.offload.parameter_wait_seconds;
    }
    if (stages > 1) step_line["pipeline"] = pipeline_step;
    metrics.write(step_line);
    memory_alerts.check(runtime.world(), metrics, report.step);
    if (leader && print_every > 0 &&
        (report.step % print_every == 0 || report.step == 1 || report.step == options.steps)) {
      char gpu_peak[64] = "";
      if (device.is_cuda())
        std::snprintf(gpu_peak, sizeof gpu_peak, " (GPU %.1f MiB)",
                      static_cast<double>(memory["device_peak"].get<std::int64_t>()) / (1 << 20));
      char bubble[64] = "";
      if (stages > 1) {  // the stage with the largest bubble
        const std::vector<double> fractions = pipeline_step["bubble_fraction"].get<std::vector<double>>();
        std::snprintf(bubble, sizeof bubble, " | bubble %.2f",
                      *std::max_element(fractions.begin(), fractions.end()));
      }
      // Elapsed: this run's loop; the ETA from its mean step time, saves and evaluations included.
      const double elapsed = std::chrono::duration<double>(Clock::now() - loop_began).count();
      const double eta =
          elapsed / static_cast<double>(summary.steps) * static_cast<double>(options.steps - report.step);
      std::printf(
          "step %6lld/%lld | loss %.4f | lr %.3e | scale %g | grad norm %.3f%s | %.0f tok/s | %.1f ms/step | "
          "MFU %.1f%% | peak %.1f MiB%s%s | elapsed %s | ETA %s\n",
          static_cast<long long>(report.step), static_cast<long long>(options.steps), report.loss, report.lr,
          report.loss_scale, report.grad_norm, report.skipped ? " (skipped)" : "", tokens_per_second,
          seconds * 1e3, mfu * 100.0, static_cast<double>(memory["peak"].get<std::int64_t>()) / (1 << 20),
          gpu_peak, bubble, clock_text(elapsed).c_str(), clock_text(eta).c_str());
      std::fflush(stdout);
    }
    if (evaluator && evaluator->due(report.step, report.step == options.steps)) {
      const engine_detail::EvalResult eval = evaluator->run(engine);
      summary.last_eval_loss = eval.loss;
      ++summary.evaluations;
      metrics.write({{"event", "eval"},
                     {"step", report.step},
                     {"samples", engine.global_samples()},
                     {"loss", eval.loss},
                     {"perplexity", eval.perplexity},
                     {"batches", eval.batches},
                     {"eval_samples", eval.samples},
                     {"tokens", eval.tokens},
                     {"time_s", eval.seconds}});
      if (leader && print_every > 0) {
        std::printf("eval step %lld: loss %.4f ppl %.3f (%lld batches, %.2f s)\n",
                    static_cast<long long>(report.step), eval.loss, eval.perplexity,
                    static_cast<long long>(eval.batches), eval.seconds);
        std::fflush(stdout);
      }
    }
    if (options.on_step) options.on_step(report);
    if (const int signal = agreed_stop_signal(runtime.world()); signal != 0) {
      summary.preempted = true;
      if (leader) {
        std::printf("zerotrain train: %s received; stopping after step %lld\n", stop_signal_name(signal),
                    static_cast<long long>(report.step));
        std::fflush(stdout);
      }
      if (save_dir) {
        save(stop_signal_name(signal));
      } else if (leader) {
        std::printf("zerotrain train: no --save-dir: nothing saved\n");
      }
      break;
    }
    if (save_dir && save_interval > 0 && report.step % save_interval == 0) save("interval");
  }
  if (save_dir && !summary.preempted && summary.steps > 0 &&
      summary.last_saved != "global_step" + std::to_string(engine.global_steps())) {
    save("end of run");
  }
  summary.mean_step_seconds = summary.steps > 0 ? total_seconds / static_cast<double>(summary.steps) : 0.0;
  if (leader && summary.steps > 0) {
    std::printf("zerotrain train: %lld steps, loss %.4f -> %.4f, %.1f ms/step, %lld skipped\n",
                static_cast<long long>(summary.steps), summary.first_loss, summary.last_loss,
                summary.mean_step_seconds * 1e3, static_cast<long long>(engine.skipped_steps()));
    std::printf(
        "zerotrain train: memory per rank: accounted peak %.1f MiB, peak RSS %.1f MiB (%.1f MiB before the "
        "model: MPI and libraries)\n",
        static_cast<double>(peak_accounted) / (1 << 20), static_cast<double>(peak_rss) / (1 << 20),
        static_cast<double>(runtime_rss) / (1 << 20));
  }
  metrics.write({{"event", "end"},
                 {"steps", engine.global_steps()},
                 {"preempted", summary.preempted},
                 {"skipped_steps", engine.skipped_steps()},
                 {"first_loss", summary.first_loss},
                 {"last_loss", summary.last_loss},
                 {"mean_step_time_s", summary.mean_step_seconds},
                 {"peak_bytes", peak_accounted},
                 {"peak_rss_bytes", peak_rss}});
  return summary;
}

}  // namespace zt
