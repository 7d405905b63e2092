// The training engine: forward, backward and step on a model, with DeepSpeed's semantics for
// gradient accumulation, mixed precision, loss scaling, clipping, LR schedules.
//
//   auto engine = zt::initialize(runtime, model, config);
//   for (micro-batch) {
//     const zt::Tensor logits = engine->forward(batch.inputs);
//     engine->backward(zt::cross_entropy_loss(logits, batch.targets, engine->execution()));
//     engine->step();
//   }
// or engine->train_batch(next_micro_batch) for a whole optimizer step.
//
// step() is called after every micro-batch; it updates the parameters only at the gradient
// accumulation boundary (every gradient_accumulation_steps calls), as DeepSpeed's engine.step().
//
// Parameters live in flat buffers: the model's parameter and gradient tensors become views into one
// contiguous buffer each (in the compute dtype), so that communication and the optimizer run over
// a few large buffers. In bf16/fp16 the optimizer keeps an fp32 master copy and writes the 16-bit
// parameters in the same pass. The engine's parts (partition plan, ZeRO strategy, parallel and
// execution contexts) are private: docs/architecture.md, "The engine's seams".
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "zerotrain/checkpoint.hpp"
#include "zerotrain/communicator.hpp"
#include "zerotrain/config.hpp"
#include "zerotrain/execution.hpp"
#include "zerotrain/loss.hpp"
#include "zerotrain/loss_scaler.hpp"
#include "zerotrain/lr_scheduler.hpp"
#include "zerotrain/nn.hpp"
#include "zerotrain/optimizer.hpp"
#include "zerotrain/process_grid.hpp"
#include "zerotrain/tensor.hpp"

namespace zt {

class Runtime;
namespace engine_detail {
struct EngineAccess;
}  // namespace engine_detail

/// One micro-batch. For a GPT: int32 token ids [B, T] and int32 targets [B, T] (softmax
/// cross-entropy). Otherwise inputs [B, ...] and targets of the model's output shape in the
/// compute dtype (mean squared error).
struct Batch {
  Tensor inputs;
  Tensor targets;
};

/// Where the engine's time went in communication during one optimizer step (seconds, this rank).
struct CommTiming {
  double wait_seconds = 0.0;  // blocked waiting for collectives (not hidden behind computation)
  double busy_seconds = 0.0;  // from each collective's start until its completion was seen
};

/// The optimizer step's sub-group pipeline with NVMe offload (seconds, this rank; zero without it).
struct OffloadTiming {
  double wall_seconds = 0.0;     // from the first sub-group's read to the last one's write
  double update_seconds = 0.0;   // the optimizer's updates of the sub-groups
  double stalled_seconds = 0.0;  // waiting for reads and writes the updates did not hide
  // offload_param nvme, over the whole step (forward, backward and update):
  std::uint64_t parameter_bytes_read = 0;
  std::uint64_t parameter_bytes_written = 0;
  double parameter_wait_seconds = 0.0;  // blocked for parameter reads and writes not hidden
};

/// One pipeline stage's time in the step's schedule (seconds, this rank; zero without pipelining).
struct PipelineTiming {
  int stage = 0;
  int stages = 1;
  double busy_seconds = 0.0;  // the stage's forwards and backwards
  double idle_seconds = 0.0;  // blocked on activations and gradients of the neighbouring stages
  /// idle / (busy + idle): for equal stages, (stages - 1) / (micro-batches + stages - 1) in 1F1B.
  double bubble_fraction() const {
    const double total = busy_seconds + idle_seconds;
    return total > 0 ? idle_seconds / total : 0.0;
  }
};

/// What the last optimizer step did. Values are the same on every rank.
struct StepReport {
  std::int64_t step = 0;    // global optimizer steps after this one
  double loss = 0.0;        // mean over the micro-batches of the step and over data-parallel ranks
  double grad_norm = 0.0;   // global L2 norm of the unscaled gradients, before clipping (nan on overflow)
  double lr = 0.0;          // learning rate used (or that would have been used, when skipped)
  double loss_scale = 1.0;  // loss scale the gradients of this step were computed with
  bool skipped = false;     // overflow: no update
  std::uint64_t comm_bytes = 0;  // bytes this rank sent for the step (estimated on the wire)
  CommTiming comm;               // gradient reduction and parameter gathering of the step
  OffloadTiming offload;         // this rank's, not agreed across ranks
  PipelineTiming pipeline;       // this rank's, not agreed across ranks
};

/// Where this rank's fp32 master weights (bf16/fp16 training) and optimizer states live
/// (zero_optimization.offload_optimizer; docs/offload.md).
struct OptimizerStatesPlacement {
  /// none: the engine's device (`memory`); cpu: host memory; nvme: the rank's swap file, streamed
  /// through `buffer_bytes` of host memory one sub-group at a time.
  OffloadDevice device = OffloadDevice::none;
  Device memory = Device::host();  // where the states are without a swap file
  bool master_in_swap = false;     // nvme in 16-bit training: the fp32 master is swapped with the states
  std::string swap_file;           // nvme: this rank's swap file
  std::string swap_backend;        // nvme: io_uring, libaio or posix
  std::uint64_t swap_bytes = 0;    // reserved in the swap file
  std::uint64_t buffer_bytes = 0;  // host memory of the sub-group buffers
  /// With the engine on a device (cpu or nvme): host memory (pinned with pin_memory) of the staging
  /// buffers that bring gradients down and take new parameters up; 0 on the host.
  std::uint64_t staging_bytes = 0;
  std::int64_t sub_groups = 0;
  std::int64_t sub_group_elements = 0;
  /// "host memory" or "nvme <file> (<backend>), <n> sub-groups of <m> elements, <b> buffers".
  std::string describe() const;
};

/// Where this rank's stage-3 parameter pieces live (zero_optimization.offload_param;
/// docs/offload.md, "Parameters on NVMe"). Stages 0-2: device none, everything in host memory.
struct ParametersPlacement {
  /// none: the engine's device (`memory`); cpu: host memory; nvme: the rank's parameter swap file,
  /// except the pieces kept in host memory within max_in_cpu.
  OffloadDevice device = OffloadDevice::none;
  Device memory = Device::host();  // where the pieces of host_elements are
  /// cpu and nvme with the engine on a device: the pieces in host memory are page-locked
  /// (offload_param.pin_memory), copied to the device asynchronously.
  bool host_pinned = false;
  std::int64_t host_elements = 0;  // pieces in memory (`memory`; the whole shard unless nvme)
  std::int64_t nvme_elements = 0;  // pieces in the swap file
  std::string swap_file;           // nvme: this rank's parameter swap file
  std::string swap_backend;        // nvme: io_uring, libaio or posix
  std::uint64_t swap_bytes = 0;    // reserved in the swap file
  std::uint64_t buffer_bytes = 0;  // host memory of the read/write buffers
  std::int64_t buffer_count = 0;
  /// "host memory", "cuda:0 memory", "host memory (offload_param: cpu, page-locked)" or
  /// "nvme <file> (<backend>): <n> elements on NVMe, <m> in host memory, ...".
  std::string describe() const;
};

struct EngineOptions {
  /// The process grid to train on: ZeRO partitions across its data groups, reductions of the
  /// gradient norm span data, tensor and pipeline groups. nullptr: see data_parallel.
  ProcessGrid* grid = nullptr;
  /// Without a grid: the data-parallel group (every rank data-parallel). nullptr: the engine makes a
  /// process grid over the runtime's world. A caller can pass its own, e.g. a one-rank
  /// communicator for a single-process baseline inside an MPI job.
  Communicator* data_parallel = nullptr;
  /// Where the engine keeps the model's state and runs its kernels. This build trains on the host
  /// (the CUDA training path comes next); Device::emulated() runs the host kernels on memory only
  /// the device API may touch, which proves the engine has no host-only path left.
  Device device = Device::host();
  /// Parameters that do not train, by name, besides the config's "freeze" patterns
  /// (zt::freeze_pattern_matches): true freezes the parameter. Frozen parameters get no gradient,
  /// no optimizer state (no fp32 master either: their value stays in the compute dtype) and no
  /// reduction traffic; they are held whole on every rank (at stage 3 too) and saved in checkpoints
  /// by name (docs/adaptation-reference.md).
  std::function<bool(const std::string& name)> freeze = {};
};

class Engine {
 public:
  /// The engine takes the model as it is (built in the compute dtype the config asks for) and
  /// moves its parameters into its own buffers on options.device. The config's batch sizes are
  /// resolved against the data-parallel size.
  Engine(Runtime& runtime, nn::Module& model, Config config, EngineOptions options = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // ---- micro-batches (DeepSpeed's engine(batch), engine.backward(loss), engine.step()) ---------
  /// Forward of one micro-batch: the model's output, on the engine's device (inputs may be host
  /// tensors; they are copied there). Several forwards may wait for their backward, each keeping
  /// its activations in its own micro-batch slot (ZeRO stage 3: one at a time, its gathering follows
  /// one forward and backward), as many as the optimizer step has micro-batches left.
  Tensor forward(const Tensor& inputs);
  /// Backward of the oldest forward still waiting, from its loss: a built-in one
  /// (zt::cross_entropy_loss, zt::mse_loss on execution()) or the caller's own zt::Loss. The
  /// gradient is taken at scale loss_scale / gradient_accumulation_steps; the value (a device
  /// scalar) counts in the step's reported loss, read once per step. Gradients accumulate and are
  /// reduced across data-parallel ranks as ZeRO's stage says.
  void backward(const Loss& loss);
  /// The same from the gradient of the caller's loss with respect to the oldest forward's output
  /// (unscaled: the engine multiplies a copy by loss_scale / gradient_accumulation_steps); `loss`,
  /// when given, counts in the step's reported loss.
  void backward(const Tensor& grad_output, std::optional<double> loss = std::nullopt);
  /// One optimizer step: gradient_accumulation_steps micro-batches from `micro_batch(i)` (i = 0, 1,
  /// ...), each through forward, the built-in loss, backward and step(); returns the step's report.
  /// The loop is the engine's, so a pipeline schedule can replace it without the caller knowing.
  const StepReport& train_batch(const std::function<Batch(std::int64_t micro_batch)>& micro_batch);

  /// Forward of one micro-batch with the built-in loss (softmax cross-entropy for int32 targets,
  /// mean squared error otherwise); returns its loss on this rank (unscaled, read from the device at
  /// once). backward() then runs its backward: one such pair at a time (for several micro-batches
  /// in flight use forward(inputs) and backward(loss)).
  double forward(const Batch& batch);
  /// Backward of the last forward(batch)'s built-in loss (see backward(const Loss&)).
  void backward();
  /// Counts a micro-batch; at the accumulation boundary reduces gradients across data-parallel
  /// ranks, checks for overflow, clips, updates, steps the LR schedule. Returns true at a boundary.
  bool step();
  /// Loss of a micro-batch without gradients (the model is put in eval mode and back).
  double eval(const Batch& batch);
  /// The loss of each sample (row of dimension 0) of a micro-batch without gradients, in eval mode
  /// (dropout off): for a GPT the mean cross-entropy over the row's positions. The same on every
  /// rank of a pipeline (the last stage's values); a row's value does not depend on the other rows'
  /// contents. Optimizer state, loss scale and counters are untouched.
  std::vector<double> eval_rows(const Batch& batch);

  /// Save a checkpoint to DIR/TAG.h5 (collective over the data-parallel ranks, at an accumulation
  /// boundary): written under a temporary name, synced, renamed, then DIR/latest names it. Returns
  /// the tag. A rank that calls it alone gets an error after ZT_CHECKPOINT_SYNC_TIMEOUT seconds
  /// (default 300), not a hang.
  std::string save_checkpoint(const std::string& dir, const SaveOptions& options = {});
  /// Load a checkpoint saved at any world size and ZeRO stage (collective). Checksums are verified;
  /// a missing, truncated or corrupted file, or a model that does not match, is a zt::IoError
  /// naming the file and the dataset.
  LoadResult load_checkpoint(const std::string& dir, const LoadOptions& options = {});
  /// Set every parameter from a plain HDF5 file of named tensors (the layout of `zerotrain
  /// checkpoint export`: datasets at the root named as the model's parameters, fp32, fp64 or bf16
  /// bits; scripts/zerotrain_torch.py convert writes one from PyTorch; docs/checkpoint-format.md,
  /// "Import"). Collective. The file is checked first: a tensor of another shape or element type,
  /// missing and unexpected tensors are a zt::IoError naming each; a tied model takes a file's
  /// lm_head.weight when it equals wte.weight. Counters and optimizer states are left as they are
  /// (at step 0: zero). Returns the number of tensors loaded.
  std::size_t load_weights(const std::string& path);

  bool is_gradient_accumulation_boundary() const;
  std::int64_t global_steps() const;
  std::int64_t global_samples() const;
  std::int64_t micro_steps() const;
  std::int64_t skipped_steps() const;
  /// Learning rate the next update will use.
  double lr() const;
  double loss_scale() const;
  const StepReport& last_step() const;

  const Config& config() const;
  const BatchSizes& batch() const;
  DType compute_dtype() const;
  Device device() const;
  /// The engine's device and streams: losses and any other work on its outputs go there.
  const ExecutionContext& execution() const;
  nn::Module& model();
  Optimizer& optimizer();
  LRScheduler* lr_scheduler();
  Communicator& data_parallel();
  int data_parallel_rank() const;
  int data_parallel_size() const;
  /// Elements of the trainable parameters (those the plan partitions; frozen ones not counted).
  std::int64_t parameter_count() const;
  /// The frozen parameters (EngineOptions::freeze, the config's "freeze"), in the model's order.
  std::vector<std::string> frozen_parameters() const;
  std::int64_t frozen_parameter_count() const;
  int zero_stage() const;
  /// Where the fp32 master and the optimizer states of this rank live.
  OptimizerStatesPlacement optimizer_states_placement() const;
  /// Where this rank's stage-3 parameter pieces live.
  ParametersPlacement parameters_placement() const;

  class Impl;

 private:
  friend struct engine_detail::EngineAccess;  // the engine's internal views (src/engine/engine_access.hpp)
  std::unique_ptr<Impl> impl_;
};

/// DeepSpeed's deepspeed.initialize for zerotrain.
std::unique_ptr<Engine> initialize(Runtime& runtime, nn::Module& model, Config config,
                                   EngineOptions options = {});

/// Build the model that a config's "model" section describes, in the config's compute dtype
/// (bf16 / fp16 when enabled, else fp32), initialized from the config's seed, with activation
/// checkpoints as the config asks (Config::activation_checkpoint_interval_for). With
/// pipeline.stages > 1 a rank builds its stage with the second form.
std::unique_ptr<nn::Module> build_model(const Config& config);
/// Pipeline stage `stage` of the config's model: a zt::nn::PipelineStage of its layers
/// (zt::nn::gpt_layers, mlp_layers) split by pipeline.partition into pipeline.stages stages. The
/// stages together compute what build_model(config) does, with the same parameter names and values.
std::unique_ptr<nn::Module> build_model(const Config& config, int stage);
/// `zerotrain checkpoint import`: build the config's model (collective over the runtime's world),
/// load `weights` into it (Engine::load_weights) and save it to DIR as a step-0 checkpoint through
/// the engine's writer (tag options.tag, default "global_step0"; file and directory modes from the
/// config's "checkpoint" section), which loads at any world size and ZeRO stage. The config's
/// init.from is ignored. Returns the checkpoint file's path.
std::string import_weights(Runtime& runtime, const std::string& weights, Config config,
                           const std::string& dir, SaveOptions options = {});
/// This rank's pipeline stage in the grid the engine makes from the config (no EngineOptions.grid):
/// world rank / (world size / pipeline.stages).
int pipeline_stage_of(const Runtime& runtime, const Config& config);
/// Refuse (zt::ConfigError saying what to change) settings that are valid DeepSpeed keys but that
/// this engine cannot honour yet, rather than train differently from what was asked. The Engine
/// calls it; call it first to fail before building a large model.
void check_engine_supports(const Config& config);

/// bf16 when bf16.enabled, fp16 when fp16.enabled, else fp32.
DType compute_dtype_of(const Config& config);

}  // namespace zt
