// The training driver behind `zerotrain train`: data from the config (or a path), the engine, the
// loop to a target step, progress lines and JSON-lines metrics. Usable in-process as well.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "zerotrain/config.hpp"
#include "zerotrain/data.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/runtime.hpp"

namespace zt {

/// Runtime options with the config's comm.timeout_s as the watchdog's collective timeout (when
/// given; ZT_COLLECTIVE_TIMEOUT still overrides it), named as its source in `zerotrain report` and
/// in the watchdog's messages. The runtime starts the watchdog, so the config is read before it:
///   zt::Runtime runtime(&argc, &argv, zt::runtime_options_for(config));
RuntimeOptions runtime_options_for(const Config& config, RuntimeOptions options = {});

/// Whether zt::train with this device choice can compute on a GPU: "cuda" does, "host" never does,
/// and "auto" only once this build's training engine has run on a GPU (`zerotrain report`, "gpu
/// path"). A job that cannot may create its runtime with RuntimeOptions::bind_device = false, as
/// `zerotrain train` does, so that no rank makes a CUDA context on a GPU node (since CUDA 12 binding
/// a GPU creates one: some hundreds of MiB of that GPU's memory per rank). Keep the binding where
/// code of your own computes on the GPU beside a host training.
bool device_choice_may_use_gpu(DeviceChoice choice);

/// Where a run's micro-batches come from. Rank-local: each rank loads its share of global batch k.
class TrainingData {
 public:
  virtual ~TrainingData() = default;
  /// Micro-batch `micro_step` (0 .. gradient_accumulation_steps-1) of the current global batch.
  virtual Batch load(std::uint64_t micro_step) = 0;
  /// Move to the next global batch (once per optimizer step, on every rank).
  virtual void advance() = 0;
  virtual DataPosition position() const = 0;
  /// The sample ids load(micro_step) reads on this rank, in row order.
  virtual std::vector<std::uint64_t> sample_ids(std::uint64_t micro_step) const = 0;
  virtual void restore(const DataPosition& position) = 0;
  /// "builtin corpus (1500172 tokens)", "tokens file data/x.bin (...)", ...
  virtual std::string description() const = 0;
  /// Tokens per sample (seq_len for a GPT, 1 for MLP samples), for throughput figures.
  virtual std::uint64_t tokens_per_sample() const = 0;
};

/// The data a config (and an optional path override) describes, sharded for this engine's
/// data-parallel rank: token files, text files (byte tokens), the built-in corpus for a GPT, and
/// synthetic regression samples for an MLP.
std::unique_ptr<TrainingData> make_training_data(const Config& config, const Engine& engine,
                                                 const std::optional<std::string>& path_override);

/// The eval data of a GPT at `path` (any data path; its format detected): its windows of seq_len
/// in file order, not shuffled, sharded for this engine's data-parallel rank like the training data.
std::unique_ptr<TrainingData> make_eval_data(const Config& config, const Engine& engine,
                                             const std::string& path);

/// What `zerotrain train` exits with after a SIGTERM or SIGUSR1 stopped it: the step finished and
/// the checkpoint is saved, or the signal came during start-up and there was nothing new to save
/// (EX_TEMPFAIL: "try again", e.g. requeue and --resume auto).
inline constexpr int kPreemptedExitCode = 75;

/// While one lives, SIGTERM and SIGUSR1 (what Slurm and PBS send before a job's end) only record
/// that they came; zt::train stops at its next agreement point: before loading a checkpoint,
/// before its first step, or after the step it is in. zt::train holds one itself; a program makes
/// its own first thing in main, before zt::Runtime starts MPI, so that a signal during MPI start-up
/// or a long checkpoint load also ends in kPreemptedExitCode instead of killing the process.
/// Nested scopes share the outermost one's record; the previous handlers come back when it ends.
/// Main thread only.
class StopSignalScope {
 public:
  StopSignalScope();
  ~StopSignalScope();
  StopSignalScope(const StopSignalScope&) = delete;
  StopSignalScope& operator=(const StopSignalScope&) = delete;

  /// The signal number that came (SIGTERM or SIGUSR1) since the outermost scope began, 0 if none;
  /// this rank's view only (zt::train agrees on it over all ranks).
  static int received();

 private:
  bool outermost_ = false;
};

/// What `zerotrain train --resume auto` exits with when the save directory holds checkpoints but
/// none of them is valid (EX_IOERR): starting from step 0 over them would silently throw the run
/// away, and a requeue loop would go on doing so (docs/checkpoint-format.md, "Resuming").
inline constexpr int kNoValidCheckpointExitCode = 74;

/// Thrown by train() on every rank for kNoValidCheckpointExitCode; the message lists each
/// checkpoint and why it was refused.
class NoValidCheckpointError : public IoError {
 public:
  using IoError::IoError;
};

/// Thrown by train() on every rank alike when the device the config's "device" (or the CLI's
/// --device) asks for cannot be had: "cuda" on a rank without a usable GPU, two node-local ranks on
/// one GPU. The message names the first rank concerned and the reason (cuda_status().reason).
class DeviceChoiceError : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

struct TrainOptions {
  std::int64_t steps = 100;                 // train until the global optimizer step reaches this
  std::optional<std::string> data_path;     // overrides the config's data.path
  std::optional<std::string> metrics_path;  // JSON lines, written by rank 0
  std::optional<std::int64_t> print_every;  // progress line interval; default: steps_per_print or 10
  /// The validation loss's data; overrides the config's eval.data (docs/config.md, "eval").
  std::optional<std::string> eval_data_path;
  /// Checkpoints: directory (default: the config's checkpoint.save_dir), interval in optimizer
  /// steps (default: checkpoint.save_interval; 0 = only at the end and on a signal) and how many
  /// to keep (default: checkpoint.keep_last; 0 = all). With a directory the run also saves when it
  /// reaches `steps`, and when SIGTERM or SIGUSR1 arrives (after finishing the current step). The
  /// directory is created and locked at the start (one job at a time; a second fails at once).
  std::optional<std::string> save_dir;
  std::optional<std::int64_t> save_interval;
  std::optional<std::int64_t> keep_last;
  /// "auto": the newest checkpoint in save_dir that verifies (no checkpoint there at all: start
  /// afresh; checkpoints there but none valid: NoValidCheckpointError); otherwise a checkpoint
  /// directory to load (its latest tag) or DIR/TAG.h5. Either way the data position must agree
  /// with the engine's global samples.
  std::optional<std::string> resume;
  /// With resume "auto": the Slurm job id the checkpoint must have been saved by (each save records
  /// SLURM_JOB_ID); one saved by another job, or outside Slurm, is refused with both ids named.
  /// jobscripts/slurm.sbatch passes it when the save directory is its per-job default.
  std::optional<std::string> resume_job_id;
  /// Where the engine keeps the model's state and runs its kernels (EngineOptions::device). Not set:
  /// the config's "device" decides (docs/config.md): "auto" takes this rank's GPU when the runtime
  /// bound a usable one, else the host.
  std::optional<Device> device;
  /// One rank's peak FLOP/s, the denominator of the MFU (model FLOPs utilization) in the progress
  /// line and the metrics: the hardware's figure for the compute dtype. Not given: a rank on a GPU
  /// that zerotrain's table holds takes its data sheet's dense figure, any other rank measures its
  /// matmul rate once before the model is built (docs/metrics.md, "MFU").
  std::optional<double> peak_flops;
  /// Called on every rank after each optimizer step (progress hooks, tests).
  std::function<void(const StepReport&)> on_step;
};

struct TrainSummary {
  std::int64_t steps = 0;
  double first_loss = 0.0;
  double last_loss = 0.0;
  double mean_step_seconds = 0.0;
  std::int64_t resumed_from_step = 0;     // global step of the loaded checkpoint (0: fresh start)
  std::optional<std::string> last_saved;  // tag of the last checkpoint written
  bool preempted = false;                 // stopped by SIGTERM / SIGUSR1 (exit kPreemptedExitCode)
  std::optional<double> last_eval_loss;   // the last validation loss (with eval data)
  std::int64_t evaluations = 0;           // how many times the validation loss was computed
};

/// Build the model and engine from the config and train. Collective: every rank calls it.
TrainSummary train(Runtime& runtime, Config config, const TrainOptions& options);

}  // namespace zt
