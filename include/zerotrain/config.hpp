// The training configuration: a JSON file compatible with DeepSpeed's ds_config, parsed into typed
// structs that carry DeepSpeed's code defaults, plus zerotrain's own sections (model, data, comm).
// Wrong types or ranges throw zt::ConfigError naming the JSON path; unknown keys are warnings.
// DeepSpeed keys that zerotrain accepts but does not act on have no member here: the parser
// validates them and ignores them where that cannot change the training, and refuses values that
// would (docs/config.md, "Accepted and ignored"). See docs/config.md for every key.
//
// The header does not include nlohmann/json: the raw document is kept as a JSON string, so code
// that only reads the typed values needs no JSON library.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "zerotrain/dtype.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/lr_scheduler.hpp"  // the scheduler parameter structs and WarmupType

namespace zt {

// ---- enumerations ------------------------------------------------------------------------------

enum class GradientReduceOp { mean, sum };
enum class OptimizerType { adam, adamw, sgd };
enum class SchedulerType { warmup_lr, warmup_decay_lr, warmup_cosine_lr, one_cycle, lr_range_test };
enum class OffloadDevice { none, cpu, nvme };
enum class ModelType { gpt, mlp };
enum class MlpActivation { relu, gelu, tanh };
/// automatic: a zerotrain token file if the file starts with its magic, else text.
enum class DataFormat { automatic, tokens, text, builtin, synthetic };
/// Where zt::train computes (docs/config.md, "device"): automatic takes this rank's GPU when the
/// runtime bound a usable one (one per node-local rank), else the host with a one-line notice.
enum class DeviceChoice { automatic, cuda, host };

/// The spelling used in the JSON file (e.g. "WarmupCosineLR", "nvme", "auto").
std::string_view to_string(GradientReduceOp value);
std::string_view to_string(OptimizerType value);
std::string_view to_string(SchedulerType value);
std::string_view to_string(WarmupType value);
std::string_view to_string(OffloadDevice value);
std::string_view to_string(ModelType value);
std::string_view to_string(MlpActivation value);
std::string_view to_string(DataFormat value);
std::string_view to_string(DeviceChoice value);

// ---- DeepSpeed sections ------------------------------------------------------------------------
// The scheduler parameter structs (WarmupLRParams, ..., LRSchedulerParams) come from
// lr_scheduler.hpp, so that the parsed values feed make_lr_scheduler() directly.

/// "optimizer": {"type": ..., "params": {...}}. Types are case-insensitive; zerotrain implements
/// Adam, AdamW and SGD. Defaults are those of DeepSpeed's FusedAdam and torch.optim.SGD.
struct OptimizerConfig {
  OptimizerType type = OptimizerType::adamw;
  double lr = 1e-3;
  std::array<double, 2> betas{0.9, 0.999};  // Adam/AdamW
  double eps = 1e-8;                        // Adam/AdamW
  double weight_decay = 0.0;
  /// Adam only: decoupled (AdamW-style) weight decay. DeepSpeed defaults it to true, so "Adam"
  /// with weight decay behaves as AdamW unless this is set false. AdamW ignores it.
  bool adam_w_mode = true;
  bool bias_correction = true;  // Adam/AdamW
  double momentum = 0.0;        // SGD
  double dampening = 0.0;       // SGD
  bool nesterov = false;        // SGD

  /// Whether weight decay is applied to the weights directly (AdamW) rather than added to the gradient.
  bool decoupled_weight_decay() const {
    return type == OptimizerType::adamw || (type == OptimizerType::adam && adam_w_mode);
  }
};

/// "scheduler": {"type": ..., "params": {...}}; the scheduler steps once per optimizer step.
struct SchedulerConfig {
  SchedulerType type = SchedulerType::warmup_lr;
  /// The alternative matching `type`; the parser sets the required values (total_num_steps,
  /// cycle_min_lr, cycle_max_lr), so those optionals always hold a value in a parsed config.
  LRSchedulerParams params = WarmupLRParams{};
  std::int64_t last_batch_iteration = -1;  // -1: start from the beginning
};

/// "fp16": mixed precision with a loss scaler (static when loss_scale > 0, dynamic when 0).
struct Fp16Config {
  bool enabled = false;
  double loss_scale = 0.0;  // 0 = dynamic
  int initial_scale_power = 16;
  std::int64_t loss_scale_window = 1000;
  int hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1.0;
  bool fp16_master_weights_and_grads = false;  // ZeRO only

  bool dynamic_loss_scale() const { return loss_scale == 0.0; }
};

/// "bf16" (alias "bfloat16").
struct Bf16Config {
  bool enabled = false;
  bool check_grad_overflow = true;  // skip the step on inf/nan gradients
  bool bf16_master_weights_and_grads = false;
  bool bf16_optimizer_states = false;  // needs bf16_master_weights_and_grads and ZeRO 1-3
};

struct OffloadOptimizerConfig {
  OffloadDevice device = OffloadDevice::none;
  std::optional<std::string> nvme_path;  // required for device nvme
  bool pin_memory = true;
  std::int64_t buffer_count = 4;
  double ratio = 1.0;  // fraction offloaded; < 1 only on stage 3
  bool super_offload = false;
};

struct OffloadParamConfig {
  OffloadDevice device = OffloadDevice::none;  // != none only on stage 3
  std::optional<std::string> nvme_path;
  bool pin_memory = true;
  std::int64_t buffer_count = 5;
  std::int64_t buffer_size = 100'000'000;
  std::int64_t max_in_cpu = 1'000'000'000;
};

/// "zero_optimization". Sizes count elements, not bytes.
struct ZeroConfig {
  int stage = 0;
  bool overlap_comm = false;  // default derived: true for stage 3, false otherwise
  std::int64_t reduce_bucket_size = 500'000'000;
  std::int64_t allgather_bucket_size = 500'000'000;  // a multiple of 2
  std::int64_t sub_group_size = 1'000'000'000;
  std::int64_t stage3_prefetch_bucket_size = 50'000'000;
  std::int64_t stage3_param_persistence_threshold = 100'000;
  std::int64_t stage3_max_live_parameters = 1'000'000'000;
  std::int64_t stage3_max_reuse_distance = 1'000'000'000;
  OffloadOptimizerConfig offload_optimizer;
  OffloadParamConfig offload_param;
};

/// "aio": asynchronous I/O for NVMe offload and swapping.
struct AioConfig {
  std::int64_t block_size = 1'048'576;
  std::int64_t queue_depth = 8;
  std::int64_t intra_op_parallelism = 1;  // formerly "thread_count"
  bool single_submit = false;
  bool overlap_events = true;
  bool use_gds = false;
};

/// "tensorboard" and "csv_monitor" (DeepSpeed's monitor sections, docs/metrics.md): rank 0 writes
/// the step scalars under output_path/job_name/ (DeepSpeed's layout) when enabled.
struct MonitorConfig {
  bool enabled = false;
  std::string output_path;                    // "": the working directory
  std::string job_name = "DeepSpeedJobName";  // DeepSpeed's default
  /// output_path/job_name, the directory the files go to.
  std::string directory() const;
};

/// "alerts" (zerotrain, docs/metrics.md): a warning and an `alert` metrics event when a rank's
/// memory passes `memory_fraction` of its limit (memory_limit bytes, else the cgroup's limit or
/// the physical memory, whichever is smaller).
struct AlertsConfig {
  std::optional<std::int64_t> memory_limit;  // bytes; nullopt: the cgroup's or physical limit
  double memory_fraction = 0.95;
};

/// "checkpoint": zerotrain's keys (DeepSpeed's are accepted and ignored, or refused).
struct CheckpointConfig {
  std::optional<std::string> save_dir;  // nullopt: the engine saves only where asked
  std::int64_t save_interval = 0;       // save every N optimizer steps; 0: no periodic saves
  std::int64_t keep_last = 0;           // keep the newest N tags; 0: keep all
  std::uint32_t file_mode = 0640;       // permission bits of files written ("0640" in JSON)
  std::uint32_t dir_mode = 0750;        // permission bits of directories created
};

/// "pipeline" (docs/pipeline.md): how many stages the built-in model is split into, how, and the
/// schedule that runs them.
enum class PipelineSchedule : std::uint8_t { one_f_one_b, gpipe };

struct PipelineConfig {
  std::optional<std::int64_t> stages;  // nullopt: "auto" (one stage)
  /// How the built-in model's layers are split: "parameters" (DeepSpeed's "best" is the same),
  /// "uniform" or "type:<regex>" (zt::nn::partition_layers).
  std::string partition = "parameters";
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;  // "1f1b" or "gpipe"
  /// pipeline.stages, or 1 for "auto".
  std::int64_t stage_count() const { return stages.value_or(1); }
  /// Activation checkpointing of the built-in models: every N consecutive layers (GPT blocks; a
  /// pipeline stage's layers) in one nn::ActivationCheckpoint; 0: see
  /// ActivationCheckpointingConfig::number_checkpoints.
  std::int64_t activation_checkpoint_interval = 0;
};

/// "activation_checkpointing" (docs/config.md): how the built-in models' checkpoints keep their
/// inputs; whether there are checkpoints says pipeline.activation_checkpoint_interval or, without
/// it, number_checkpoints.
struct ActivationCheckpointingConfig {
  /// Splits the kept inputs across the tensor-parallel group; no effect without one (this build
  /// has no tensor-parallel layers).
  bool partition_activations = false;
  /// The kept inputs in host memory when the engine's device is not the host.
  bool cpu_checkpointing = false;
  /// Without an interval: about this many checkpoints, ceil(layers / number_checkpoints) layers each.
  std::optional<std::int64_t> number_checkpoints;
  /// No effect (accepted for DeepSpeed configs): the inputs are not partitioned (see above), so
  /// there is nothing to make contiguous.
  bool contiguous_memory_optimization = false;
  /// No effect: the engine's devices (the host, the emulated device) run work as it is queued.
  bool synchronize_checkpoint_boundary = false;
  /// No effect: DeepSpeed's per-checkpoint timers; the step metrics time the whole step.
  bool profile = false;
};

// ---- zerotrain sections ------------------------------------------------------------------------

/// "model": {"type": "gpt", ...}: a GPT-2 style decoder.
struct GptModelConfig {
  std::int64_t n_layer = 0;  // all five sizes required
  std::int64_t n_head = 0;
  std::int64_t d_model = 0;  // a multiple of n_head
  std::int64_t seq_len = 0;
  std::int64_t vocab_size = 0;
  bool tie_embeddings = true;
  double dropout = 0.0;
};

/// "model": {"type": "mlp", "sizes": [in, hidden..., out], "activation": ...}.
struct MlpModelConfig {
  std::vector<std::int64_t> sizes;  // at least two layer widths
  MlpActivation activation = MlpActivation::relu;
};

using ModelConfig = std::variant<GptModelConfig, MlpModelConfig>;

/// "data": the training data set.
struct DataConfig {
  std::optional<std::string> path;    // required unless format is builtin or synthetic
  std::optional<std::uint64_t> seed;  // nullopt: the top-level seed
  DataFormat format = DataFormat::automatic;
};

/// "eval" (zerotrain): the validation loss of `zerotrain train` (docs/config.md, "eval"): the mean
/// loss over `batches` global batches of the eval data (its first batches x train_batch_size
/// windows, in file order), after every `interval`-th optimizer step and at the end of the run.
struct EvalConfig {
  std::optional<std::string> data;  // the eval data (any data path); --eval-data wins
  std::int64_t interval = 0;        // optimizer steps; 0: only at the end of the run
  std::int64_t batches = 10;        // global batches of train_batch_size samples each
};

/// "init" (zerotrain): the weights training starts from (docs/config.md, "init";
/// docs/adaptation-reference.md).
struct InitConfig {
  /// A plain HDF5 file of named tensors (the layout of `zerotrain checkpoint export`, or
  /// scripts/zerotrain_torch.py convert's output): zt::train loads it into the model before the
  /// first step (Engine::load_weights) unless it resumes from a checkpoint. nullopt: the seed's
  /// random initialization.
  std::optional<std::string> from;
};

/// "comm" (zerotrain): the watchdog's collective timeout (docs/fault-detection.md).
struct CommConfig {
  /// Seconds; 0 (or "off" in the file) turns the watchdog off; else kMinimumCollectiveTimeoutSeconds
  /// to kMaximumCollectiveTimeoutSeconds (zerotrain/watchdog.hpp). nullopt: not given (the runtime's
  /// default, 600 s). The environment variable ZT_COLLECTIVE_TIMEOUT overrides it; the runtime
  /// starts the watchdog, so it reaches it through zt::runtime_options_for(config)
  /// (zerotrain/trainer.hpp), as `zerotrain train` does.
  std::optional<double> timeout_s;
};

// ---- the configuration ---------------------------------------------------------------------------

/// The three batch values after applying DeepSpeed's rule for a data-parallel size.
struct BatchSizes {
  std::int64_t train_batch_size = 0;
  std::int64_t train_micro_batch_size_per_gpu = 0;
  std::int64_t gradient_accumulation_steps = 0;
  int data_parallel_size = 0;
};

/// Receives each warning once, already formatted as one line (no trailing newline).
using ConfigWarningSink = std::function<void(std::string_view line)>;

/// The default sink: writes the line to stderr.
void print_config_warning_to_stderr(std::string_view line);

struct ConfigParseOptions {
  /// Where warnings go as they are found; an empty function only collects them (Config::warnings()).
  /// Engines pass a sink that prints on rank 0 only.
  ConfigWarningSink warning_sink = print_config_warning_to_stderr;
};

class Config {
 public:
  /// All defaults, as if parsed from "{}".
  Config() = default;

  /// Parse a file; ConfigError names the file (and line and column for invalid JSON).
  static Config from_file(const std::filesystem::path& path, const ConfigParseOptions& options = {});
  /// Parse a file and resolve the batch sizes for this data-parallel size.
  static Config from_file(const std::filesystem::path& path, int data_parallel_size,
                          const ConfigParseOptions& options = {});
  static Config from_string(std::string_view json_text, const ConfigParseOptions& options = {});
  static Config from_string(std::string_view json_text, int data_parallel_size,
                            const ConfigParseOptions& options = {});

  /// Apply DeepSpeed's batch rule: derive the missing values of train_batch_size,
  /// train_micro_batch_size_per_gpu and gradient_accumulation_steps by integer division and check
  /// train_batch_size == micro * gas * data_parallel_size. Throws ConfigError otherwise. May be
  /// called again with another size: it always starts from the values given in the file.
  const BatchSizes& resolve_batch(int data_parallel_size);
  bool batch_resolved() const { return resolved_batch_.has_value(); }
  /// The resolved values; throws zt::ConfigError before resolve_batch().
  const BatchSizes& batch() const;

  /// Warnings found while parsing, in order, each "path: message".
  const std::vector<std::string>& warnings() const { return warnings_; }
  /// The document as given (re-serialized, without comments or formatting).
  const std::string& raw_json() const { return raw_json_; }
  /// The file path, or "<string>".
  const std::string& source() const { return source_; }

  /// The effective configuration with every default filled in (resolved batch sizes when
  /// resolved); parsing it again gives the same values and no warnings.
  std::string to_json_string(int indent = 2) const;
  /// A few human-readable lines for logs.
  std::string summary() const;
  /// The dtype of parameters, gradients and activations: bf16 or fp16 when enabled, else fp32.
  DType compute_dtype() const;
  /// Layers per activation checkpoint of a built-in model of `layers` layers (GPT blocks, MLP
  /// Linear+activation pairs): pipeline.activation_checkpoint_interval when > 0, else
  /// ceil(layers / activation_checkpointing.number_checkpoints) when that is set, else 0 (none).
  std::int64_t activation_checkpoint_interval_for(std::int64_t layers) const;

  // The values, named after their JSON keys. Validated when parsed; code that changes them
  // bypasses validation.
  std::optional<std::int64_t> train_batch_size;  // as given; see batch()
  std::optional<std::int64_t> train_micro_batch_size_per_gpu;
  std::optional<std::int64_t> gradient_accumulation_steps;
  double gradient_clipping = 1.0;                 // global-norm clip; 0 disables
  std::optional<std::int64_t> steps_per_print;    // nullopt: no progress log
  DeviceChoice device = DeviceChoice::automatic;  // zerotrain: "auto" | "cuda" | "host"
  GradientReduceOp gradient_allreduce_op = GradientReduceOp::mean;
  std::optional<DType> communication_data_type;  // fp32 | fp16 | bf16; nullopt: the gradients' dtype
  bool managed_gradient_accumulation = true;
  std::uint64_t seed = 1234;  // zerotrain: base seed for initialization and data order

  std::optional<OptimizerConfig> optimizer;  // nullopt: the application supplies one
  std::optional<SchedulerConfig> scheduler;
  Fp16Config fp16;
  Bf16Config bf16;
  ZeroConfig zero_optimization;
  AioConfig aio;
  CheckpointConfig checkpoint;
  PipelineConfig pipeline;
  ActivationCheckpointingConfig activation_checkpointing;
  MonitorConfig tensorboard;
  MonitorConfig csv_monitor;
  AlertsConfig alerts;  // zerotrain

  std::optional<ModelConfig> model;  // zerotrain
  std::optional<DataConfig> data;    // zerotrain
  std::optional<EvalConfig> eval;    // zerotrain
  CommConfig comm;                   // zerotrain
  InitConfig init;                   // zerotrain
  /// zerotrain: "freeze": parameters that do not train, by name: shell globs ("wte.*", "h.0.*"; `*`
  /// and `?` match any characters, dots included) or, with the prefix "re:", ECMAScript regular
  /// expressions that must match the whole name ("re:h\\.[0-3]\\..*"). Empty: every parameter trains.
  /// docs/config.md, "freeze"; EngineOptions::freeze takes a predicate instead.
  std::vector<std::string> freeze;

 private:
  friend class ConfigParser;

  std::optional<BatchSizes> resolved_batch_;
  std::vector<std::string> warnings_;
  std::string raw_json_ = "{}";
  std::string source_ = "<string>";
};

/// Whether parameter `name` matches a "freeze" pattern: a shell glob (fnmatch(3) without flags: `*`
/// and `?` match any characters, dots included, `[...]` a class) or "re:REGEX", an ECMAScript regular
/// expression that must match the whole name.
bool freeze_pattern_matches(const std::string& pattern, const std::string& name);
/// Why a "freeze" pattern cannot be used ("" when it can): an empty pattern or regular expression,
/// or one that does not compile.
std::string freeze_pattern_problem(const std::string& pattern);

}  // namespace zt
