// Checkpoints of the engine's state on parallel HDF5 over the partition plan: every rank writes
// and reads the ranges the plan gives it, whatever the stage and world size it was saved or is
// loaded at (docs/checkpoint-format.md). Internal to the engine.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "src/engine/optimizer_states.hpp"
#include "src/engine/parallel_context.hpp"
#include "src/engine/partition_plan.hpp"
#include "src/engine/zero_strategy.hpp"
#include "zerotrain/checkpoint.hpp"
#include "zerotrain/config.hpp"
#include "zerotrain/execution.hpp"
#include "zerotrain/loss_scaler.hpp"
#include "zerotrain/lr_scheduler.hpp"
#include "zerotrain/nn.hpp"

namespace zt::engine_detail {

class CheckpointDirectoryLock;

/// The engine's counters, as a checkpoint saves and restores them.
struct TrainingProgress {
  std::int64_t global_steps = 0;
  std::int64_t global_samples = 0;
  std::int64_t skipped_steps = 0;
  std::int64_t micro_steps = 0;
};

/// What a checkpoint covers besides the model states: the counters, the loss scaler, the LR
/// schedule, the config.
struct TrainingState {
  TrainingProgress& progress;
  LossScaler& loss_scaler;
  LRScheduler* scheduler = nullptr;
  const Config& config;
  std::int64_t gradient_accumulation_steps = 1;
  std::int64_t train_batch_size = 1;
};

class Checkpointer {
 public:
  /// `saved_here[i]`: this stage saves parameter i of the plan (false for a tied copy of a lower
  /// stage's parameter, which that stage saves). Collective over the pipeline group (the stages
  /// exchange what they save: a checkpoint holds every stage's parameters in one global layout).
  ///
  /// `frozen`: the parameters outside the plan (EngineOptions::freeze, the config's "freeze"), held
  /// whole on every rank in the compute dtype on `execution`'s device; saved by name as the others,
  /// without optimizer state, and listed in /model attribute `frozen`.
  Checkpointer(const PartitionPlan& plan, const ParallelContext& parallel, ZeroStrategy& strategy,
               OptimizerStates& states, nn::Module& model, std::vector<char> saved_here,
               std::vector<nn::Parameter*> frozen, const ExecutionContext& execution);

  /// Save to DIR/TAG.h5 (collective over every rank of the grid); returns the tag.
  std::string save(const std::string& dir, const SaveOptions& options, const TrainingState& state);
  /// Load a checkpoint of any world size and stage (collective); checksums are verified.
  LoadResult load(const std::string& dir, const LoadOptions& options, TrainingState state);
  /// Set every parameter from a plain HDF5 file of named tensors (Engine::load_weights; collective):
  /// rank 0 checks names, shapes and element types first and refuses a file that does not fit with
  /// every mismatch, missing and unexpected tensor named. Returns the number of tensors loaded.
  std::size_t load_weights(const std::string& path);

 private:
  /// Whether this rank's copy of parameter `index` counts in the file: every tensor-parallel rank
  /// holds a replicated parameter, the first of them writes it.
  bool writes(std::size_t index) const;
  /// The global (unsliced) shape of parameter `index`.
  std::vector<std::int64_t> global_shape(std::size_t index) const;
  /// Elements [first, first + count) of parameter `index` this rank owns in its optimizer (its
  /// piece, or the whole parameter without partitioning), the padding cut off.
  std::pair<std::int64_t, std::int64_t> owned_range(std::size_t index) const;

  /// A parameter of the whole model as the file holds it, whichever stage holds it.
  struct GlobalParameter {
    std::string name;
    std::vector<std::int64_t> shape;  // global (unsliced)
    std::string role;                 // "replicated" or "sharded"
    std::int64_t shard_dim = 0;
    std::int64_t stage = 0;   // the pipeline stage that saves it
    std::int64_t local = -1;  // its index in this rank's plan when this stage saves it, else -1
  };
  /// A dropout of the whole model, and its mask stream (the same on every data-parallel rank).
  struct GlobalDropout {
    std::string name;
    std::uint64_t stream = 0;
    nn::Dropout* local = nullptr;  // when this stage holds it
  };
  /// Every stage's dropouts in stage order, with their current streams (collective over the pipeline group).
  std::vector<GlobalDropout> global_dropouts() const;
  /// A frozen parameter's value from fp32 `values` (its whole tensor), in the compute dtype.
  void set_frozen_value(nn::Parameter& parameter, const float* values) const;
  /// A frozen parameter's value as fp32.
  std::vector<float> frozen_value(const nn::Parameter& parameter) const;

  const PartitionPlan& plan_;
  const ParallelContext& parallel_;
  ZeroStrategy& strategy_;
  OptimizerStates& states_;
  nn::Module& model_;
  std::vector<char> saved_here_;
  std::vector<nn::Parameter*> frozen_;
  const ExecutionContext& execution_;
  std::vector<GlobalParameter> global_;      // stage by stage, each in its plan's order
  std::vector<std::int64_t> global_of_;      // per plan index: its position in global_, or -1 (a tied copy)
  std::int64_t global_parameter_count_ = 0;  // every parameter's elements, the frozen ones' too
  /// Rank 0's locks of the directories this engine saved into, held for the engine's life.
  std::vector<std::shared_ptr<CheckpointDirectoryLock>> directory_locks_;
};

}  // namespace zt::engine_detail
