// The training engine: forward, backward and step on a model, with DeepSpeed's semantics for
// gradient accumulation, mixed precision, loss scaling, clipping, LR schedules.
//
//   auto engine = zt::initialize(runtime, model, config);
//   for (micro-batch) { engine->forward(batch); engine->backward(); engine->step(); }
//
// step() is called after every micro-batch; it updates the parameters only at the gradient
// accumulation boundary (every gradient_accumulation_steps calls), as DeepSpeed's engine.step().
//
// Parameters live in flat buffers: the model's parameter and gradient tensors become views into one
// contiguous buffer each (in the compute dtype), so that communication and the optimizer run over
// a few large buffers. In bf16/fp16 the optimizer keeps an fp32 master copy and writes the 16-bit
// parameters in the same pass.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "zerotrain/checkpoint.hpp"
#include "zerotrain/communicator.hpp"
#include "zerotrain/config.hpp"
#include "zerotrain/loss_scaler.hpp"
#include "zerotrain/lr_scheduler.hpp"
#include "zerotrain/nn.hpp"
#include "zerotrain/optimizer.hpp"
#include "zerotrain/process_grid.hpp"
#include "zerotrain/tensor.hpp"

namespace zt {

class Runtime;
class ExternalModel;
namespace engine_detail {
class GradientReducer;
class ParameterGatherer;
class ParameterStore;
class SwappedOptimizerStates;
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
};

/// Where this rank's fp32 master weights (bf16/fp16 training) and optimizer states live
/// (zero_optimization.offload_optimizer; docs/offload.md).
struct OptimizerStatesPlacement {
  /// none and cpu: host memory (this build trains on the host, so both are the same place); nvme:
  /// the rank's swap file, streamed through `buffer_bytes` of host memory one sub-group at a time.
  OffloadDevice device = OffloadDevice::none;
  bool master_in_swap = false;     // nvme in 16-bit training: the fp32 master is swapped with the states
  std::string swap_file;           // nvme: this rank's swap file
  std::string swap_backend;        // nvme: io_uring, libaio or posix
  std::uint64_t swap_bytes = 0;    // reserved in the swap file
  std::uint64_t buffer_bytes = 0;  // host memory of the sub-group buffers
  std::int64_t sub_groups = 0;
  std::int64_t sub_group_elements = 0;
  /// "host memory" or "nvme <file> (<backend>), <n> sub-groups of <m> elements, <b> buffers".
  std::string describe() const;
};

/// Where this rank's stage-3 parameter pieces live (zero_optimization.offload_param;
/// docs/offload.md, "Parameters on NVMe"). Stages 0-2: device none, everything in host memory.
struct ParametersPlacement {
  /// none and cpu: host memory (this build trains on the host, so both are the same place); nvme:
  /// the rank's parameter swap file, except the pieces kept in host memory within max_in_cpu.
  OffloadDevice device = OffloadDevice::none;
  std::int64_t host_elements = 0;  // pieces in host memory (the whole shard unless nvme)
  std::int64_t nvme_elements = 0;  // pieces in the swap file
  std::string swap_file;           // nvme: this rank's parameter swap file
  std::string swap_backend;        // nvme: io_uring, libaio or posix
  std::uint64_t swap_bytes = 0;    // reserved in the swap file
  std::uint64_t buffer_bytes = 0;  // host memory of the read/write buffers
  std::int64_t buffer_count = 0;
  /// "host memory" or "nvme <file> (<backend>): <n> elements on NVMe, <m> in host memory, ...".
  std::string describe() const;
};

/// Where each parameter sits in the flat buffers and in the ZeRO partition (docs/engine.md,
/// "Partition layout"). Every parameter is padded to `padded_numel` = N * piece_numel elements
/// (N data-parallel ranks at stages 1-3; N = 1 at stage 0) and split evenly: rank r owns elements
/// [r * piece_numel, (r + 1) * piece_numel) of the padded parameter. A rank's shard is its pieces of
/// every parameter, concatenated in layout order; this parameter's piece starts at `shard_offset`.
/// The padding holds zeros that no update moves.
struct FlatParameter {
  std::string name;
  Shape shape;
  std::int64_t offset = 0;        // in the flat parameter/gradient buffers (aligned to 16 elements)
  std::int64_t numel = 0;         // real elements
  std::int64_t padded_numel = 0;  // multiple of the partition count
  std::int64_t piece_numel = 0;   // elements per rank (padded_numel at stage 0)
  std::int64_t shard_offset = 0;  // start of this rank's piece in its shard (= offset at stage 0)
};

struct EngineOptions {
  /// The data-parallel group. nullptr: the engine makes a process grid over the whole world
  /// (every rank data-parallel). A caller can pass its own, e.g. a one-rank communicator for a
  /// single-process baseline inside an MPI job.
  Communicator* data_parallel = nullptr;
};

class Engine {
 public:
  /// The engine takes the model as it is (built in the compute dtype the config asks for) and
  /// moves its parameters into flat buffers. The config's batch sizes are resolved against the
  /// data-parallel size.
  Engine(Runtime& runtime, nn::Module& model, Config config, EngineOptions options = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Forward of one micro-batch; returns its loss on this rank (unscaled, as a double).
  double forward(const Batch& batch);
  /// Backward of the last forward's loss, scaled by the loss scale and 1/accumulation steps;
  /// gradients accumulate in the flat gradient buffer.
  void backward();
  /// Counts a micro-batch; at the accumulation boundary reduces gradients across data-parallel
  /// ranks, checks for overflow, clips, updates, steps the LR schedule. Returns true at a boundary.
  bool step();
  /// Loss of a micro-batch without gradients (the model is put in eval mode and back).
  double eval(const Batch& batch);

  /// Save a checkpoint to DIR/TAG.h5 (collective over the data-parallel ranks, at an accumulation
  /// boundary): written under a temporary name, synced, renamed, then DIR/latest names it. Returns
  /// the tag. A rank that calls it alone gets an error after ZT_CHECKPOINT_SYNC_TIMEOUT seconds
  /// (default 300), not a hang.
  std::string save_checkpoint(const std::string& dir, const SaveOptions& options = {});
  /// Load a checkpoint saved at any world size and ZeRO stage (collective). Checksums are verified;
  /// a missing, truncated or corrupted file, or a model that does not match, is a zt::IoError
  /// naming the file and the dataset.
  LoadResult load_checkpoint(const std::string& dir, const LoadOptions& options = {});

  bool is_gradient_accumulation_boundary() const;
  std::int64_t global_steps() const { return global_steps_; }
  std::int64_t global_samples() const { return global_samples_; }
  std::int64_t micro_steps() const { return micro_steps_; }
  std::int64_t skipped_steps() const { return skipped_steps_; }
  /// Learning rate the next update will use.
  double lr() const;
  double loss_scale() const { return loss_scaler_.loss_scale(); }
  const StepReport& last_step() const { return last_step_; }

  const Config& config() const { return config_; }
  const BatchSizes& batch() const { return config_.batch(); }
  DType compute_dtype() const { return compute_dtype_; }
  nn::Module& model() { return model_; }
  Optimizer& optimizer() { return *optimizer_; }
  LRScheduler* lr_scheduler() { return scheduler_.get(); }
  Communicator& data_parallel() { return *data_; }
  int data_parallel_rank() const { return data_->rank(); }
  int data_parallel_size() const { return data_->size(); }
  std::int64_t parameter_count() const { return parameter_count_; }
  const std::vector<FlatParameter>& flat_layout() const { return layout_; }
  int zero_stage() const { return stage_; }
  /// This rank's fp32 master weights (the parameters themselves in fp32 training), in shard order:
  /// the whole flat buffer at stage 0, this rank's pieces of every parameter at stages 1-3.
  std::vector<float> master_parameters() const;
  /// All master weights in the flat layout (collective at stages 1-3: all-gathers the shards).
  std::vector<float> gather_master_parameters();
  /// Elements of the flat layout (stage 3 keeps no flat buffer, the layout still numbers elements)
  /// and of this rank's shard.
  std::int64_t flat_size() const { return flat_size_; }
  std::int64_t shard_size() const { return shard_size_; }
  /// Stage 3: most parameter elements gathered at once (not counting persistent ones) since the
  /// engine started; 0 at stages 0-2.
  std::int64_t peak_gathered_parameters() const;
  /// Where the fp32 master and the optimizer states of this rank live.
  OptimizerStatesPlacement optimizer_states_placement() const;
  /// Where this rank's stage-3 parameter pieces live.
  ParametersPlacement parameters_placement() const;

 private:
  /// This rank's part of one parameter as the optimizer sees it (element offsets).
  struct OwnedRange {
    std::int64_t flat_begin = 0;   // in the flat buffers (stages 0-2)
    std::int64_t shard_begin = 0;  // in the shard buffers (master, gradient shard, stage-3 parameters)
    std::int64_t count = 0;
  };
  struct ModuleUse;  // a module whose forward/backward reads parameters

  void mark_step_start();
  /// offload_param nvme: the parameter store's totals so far (parameter_* fields only).
  OffloadTiming parameter_swap_counters() const;
  double total_wait_seconds() const;
  void build_layout();
  void build_buffers();
  void install_hooks();
  void build_optimizer();
  void build_swapped_states();
  void build_parameter_store();
  /// NVMe offload: one optimizer update over the swapped sub-groups.
  OffloadTiming step_swapped_optimizer(float grad_scale, float lr);
  /// offload_param nvme with the optimizer in memory: one update, range by range.
  void step_with_swapped_parameters(float grad_scale, float lr);
  /// Update shard elements [begin, end) of owned range `index` (master and state arrays start at
  /// `begin`) and write the new parameters where they live in the compute dtype.
  void update_part(std::size_t index, std::int64_t begin, std::int64_t end, float* master,
                   std::span<float* const> state, float grad_scale, float lr);
  /// The optimizer updates an fp32 master apart from the parameters: in bf16/fp16 training, and
  /// with the parameters on NVMe.
  bool keeps_separate_master() const { return compute_dtype_ != DType::fp32 || parameters_on_nvme_; }
  /// Index in the swap file's arrays of optimizer state `state` (after the master, when swapped).
  std::size_t swapped_array_of_state(std::size_t state) const { return (master_in_swap_ ? 1 : 0) + state; }
  void reduce_external_gradients();
  void reduce_pass_leftovers();
  void all_gather_updated_parameters();
  void copy_parameters_out();
  void* gradient_of(const OwnedRange& range);
  void* parameter_of(const OwnedRange& range);
  float* master_of(const OwnedRange& range);
  const float* master_of(const OwnedRange& range) const;
  void on_backward_pre(const ModuleUse& use);
  /// This rank's share of parameter i in a checkpoint: elements [first, first + count) of the
  /// parameter (its piece; at stage 0 an even split, since every rank holds everything).
  std::pair<std::int64_t, std::int64_t> checkpoint_range(std::size_t index) const;
  void on_backward_post(const ModuleUse& use);

  Runtime& runtime_;
  nn::Module& model_;
  Config config_;
  std::unique_ptr<ProcessGrid> grid_;  // when the engine made its own
  Communicator* data_;
  ExternalModel* external_;  // the caller's buffers (bring your own model), or null
  DType compute_dtype_;
  int stage_ = 0;
  std::vector<nn::Parameter*> parameters_list_;
  std::vector<FlatParameter> layout_;
  std::vector<OwnedRange> owned_;
  std::int64_t parameter_count_ = 0;  // unpadded
  std::int64_t flat_size_ = 0;
  std::int64_t shard_size_ = 0;  // elements this rank's optimizer owns (flat_size_ at stage 0)
  Buffer parameters_;            // compute dtype: flat (stages 0-2) or this rank's shard (stage 3;
                                 // empty after construction with offload_param nvme)
  Buffer gradients_;             // compute dtype: flat (stages 0-1) or this rank's shard (stages 2-3)
  Buffer master_;                // fp32 master of this rank's shard (16-bit training only)
  Tensor allgather_staging_;     // stages 1-2: packs the updated pieces for the all-gather
  std::vector<std::unique_ptr<ModuleUse>> module_uses_;
  std::vector<int> uses_per_parameter_;  // modules whose backward accumulates into the gradient
  std::vector<int> pending_uses_;        // of the current backward
  std::vector<char> reduced_this_pass_;  // the gradient went to the reducer in this backward
  bool reducing_this_pass_ = false;      // this backward's gradients are communicated
  std::unique_ptr<engine_detail::GradientReducer> reducer_;
  std::unique_ptr<engine_detail::ParameterStore> parameter_store_;  // stage 3: the pieces' home
  bool parameters_on_nvme_ = false;                                 // offload_param nvme
  std::unique_ptr<engine_detail::ParameterGatherer> gatherer_;      // stage 3
  std::unique_ptr<Optimizer> optimizer_;  // over no buffers when its states are swapped
  std::unique_ptr<engine_detail::SwappedOptimizerStates> swapped_;  // NVMe offload
  bool master_in_swap_ = false;  // NVMe optimizer offload with a separate master: master_ is not allocated
  std::unique_ptr<LRScheduler> scheduler_;
  LossScaler loss_scaler_;
  nn::SoftmaxCrossEntropy cross_entropy_;
  nn::MseLoss mse_;
  bool last_forward_was_cross_entropy_ = true;
  bool forward_pending_ = false;  // a forward whose backward has not run yet
  double accumulated_loss_ = 0.0;
  std::int64_t accumulated_micro_batches_ = 0;
  std::int64_t micro_steps_ = 0;
  std::int64_t global_steps_ = 0;
  std::int64_t global_samples_ = 0;
  std::int64_t skipped_steps_ = 0;
  std::uint64_t wire_bytes_at_step_start_ = 0;
  double comm_seconds_at_step_start_ = 0.0;
  double step_wait_seconds_ = 0.0;  // blocking collectives in step() since construction
  double wait_seconds_at_step_start_ = 0.0;
  OffloadTiming parameter_swap_at_step_start_;  // the store's counters when the step began
  bool step_started_ = false;
  StepReport last_step_;
};

/// DeepSpeed's deepspeed.initialize for zerotrain.
std::unique_ptr<Engine> initialize(Runtime& runtime, nn::Module& model, Config config,
                                   EngineOptions options = {});

/// Build the model that a config's "model" section describes, in the config's compute dtype
/// (bf16 / fp16 when enabled, else fp32), initialized from the config's seed.
std::unique_ptr<nn::Module> build_model(const Config& config);
/// Refuse (zt::ConfigError saying what to change) settings that are valid DeepSpeed keys but that
/// this engine cannot honour yet, rather than train differently from what was asked. The Engine
/// calls it; call it first to fail before building a large model.
void check_engine_supports(const Config& config);

/// bf16 when bf16.enabled, fp16 when fp16.enabled, else fp32.
DType compute_dtype_of(const Config& config);

}  // namespace zt
