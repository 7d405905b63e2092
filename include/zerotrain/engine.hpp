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
#include <string>
#include <vector>

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

/// One micro-batch. For a GPT: int32 token ids [B, T] and int32 targets [B, T] (softmax
/// cross-entropy). Otherwise inputs [B, ...] and targets of the model's output shape in the
/// compute dtype (mean squared error).
struct Batch {
  Tensor inputs;
  Tensor targets;
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
};

/// Where each parameter sits in the flat buffers (element offsets; starts aligned to 16 elements).
struct FlatParameter {
  std::string name;
  Shape shape;
  std::int64_t offset = 0;
  std::int64_t numel = 0;
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
  /// This rank's fp32 master weights (the parameters themselves in fp32 training): the whole flat
  /// buffer at stage 0, this rank's shard [rank * shard_size, (rank + 1) * shard_size) at stage 1.
  std::span<const float> master_parameters() const;
  /// All master weights, flat, in layout order (collective: all-gathers the shards at stage 1).
  std::vector<float> gather_master_parameters();
  /// Elements of the flat buffers (padded to a multiple of ranks x 16) and of this rank's shard.
  std::int64_t flat_size() const { return flat_size_; }
  std::int64_t shard_size() const { return shard_size_; }
  std::int64_t shard_offset() const { return shard_offset_; }

 private:
  void build_flat_buffers();
  void copy_external_gradients_in();
  void copy_parameters_out();
  float* master_shard();
  void reduce_gradients();

  Runtime& runtime_;
  nn::Module& model_;
  Config config_;
  std::unique_ptr<ProcessGrid> grid_;  // when the engine made its own
  Communicator* data_;
  ExternalModel* external_;  // the caller's buffers (bring your own model), or null
  DType compute_dtype_;
  std::vector<FlatParameter> layout_;
  std::int64_t parameter_count_ = 0;  // unpadded
  std::int64_t flat_size_ = 0;        // padded to a multiple of ranks x 16
  std::int64_t shard_size_ = 0;       // elements this rank's optimizer owns (flat_size_ at stage 0)
  std::int64_t shard_offset_ = 0;
  Buffer parameters_;  // compute dtype; the model's parameters view into it
  Buffer gradients_;   // compute dtype; the model's gradients view into it
  Buffer master_;      // fp32 master of this rank's shard (16-bit training only)
  std::unique_ptr<Optimizer> optimizer_;
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
