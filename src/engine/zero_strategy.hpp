// ZeRO behind one interface: where the parameters and gradients live and how they travel, as the
// hooks around each module's forward and backward, the update and the checkpoint see it.
// Internal to the engine (docs/zero.md, docs/architecture.md "The engine's seams").
//
// Two implementations, chosen once by make_zero_strategy from the partition plan:
//   - flat parameters (stages 0-2): every rank keeps all parameters in one flat buffer; the
//     optimizer's pieces are all-gathered after an update when the optimizer states are partitioned;
//   - sharded parameters (stage 3): every rank keeps its pieces (in memory or on NVMe) and gathers a
//     module's parameters around its forward and backward.
// Both reduce gradients the same way (this base class): in place in a flat gradient buffer,
// communicated in the boundary micro-batch's backward (stages 0-1), or per micro-batch into the
// rank's gradient shard (stages 2-3). There every module's contribution is reduced on its own when
// its backward ends (a tied embedding's two contributions travel separately and add up in the
// shard), and a module that streams its gradients (nn::Module::streams_gradients) hands them over
// one rank's piece at a time, straight into the reduce bucket: no full-shape gradient of a
// streamed parameter exists, only the rows of one piece (docs/zero.md, "Memory per rank").
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "src/engine/gradient_reducer.hpp"
#include "src/engine/parallel_context.hpp"
#include "src/engine/partition_plan.hpp"
#include "zerotrain/config.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/execution.hpp"
#include "zerotrain/nn.hpp"

namespace zt {
class ExternalModel;
}

namespace zt::engine_detail {

/// A module whose forward and backward read parameters (its own and borrowed ones).
struct ModuleUse {
  std::size_t index = 0;  // in the engine's list of uses (the order of model.modules())
  nn::Module* module = nullptr;
  std::vector<std::size_t> parameters;  // indices into the plan's layout
};

/// Where a backward pass stands in its optimizer step.
struct BackwardPass {
  bool first_of_step = true;  // no backward since the last update
  bool boundary = true;       // the last backward before the update
};

/// What a strategy is built from.
struct StrategyInputs {
  const PartitionPlan& plan;
  const ExecutionContext& execution;  // the device the states live on, and its streams
  const ParallelContext& parallel;
  const Config& config;
  std::vector<nn::Parameter*> parameters;  // the model's, in plan order
  const std::vector<ModuleUse>& uses;
  ExternalModel* external = nullptr;  // the caller's buffers (bring your own model), or null
};

class ZeroStrategy : private nn::GradientSink {
 public:
  virtual ~ZeroStrategy();
  ZeroStrategy(const ZeroStrategy&) = delete;
  ZeroStrategy& operator=(const ZeroStrategy&) = delete;

  // ---- the model's passes (the engine's module hooks call these) -------------------------------
  /// A forward starts (training: gradients will follow; evaluation: no backward).
  virtual void begin_forward(bool training) = 0;
  virtual void before_forward(const ModuleUse& use) = 0;
  virtual void after_forward(const ModuleUse& use) = 0;
  /// How many forwards may wait for their backward at once (0: no limit).
  virtual std::size_t forwards_in_flight_limit() const = 0;
  void begin_backward(BackwardPass pass);
  void before_backward(const ModuleUse& use);
  void after_backward(const ModuleUse& use);
  void end_backward();
  /// Bring your own model, at the boundary: reduce the caller's complete gradients.
  void take_external_gradients();

  // ---- the update ----------------------------------------------------------------------------
  /// Owned range `index`'s reduced gradient (compute dtype).
  const std::byte* gradient(std::size_t index) const;
  std::byte* gradient(std::size_t index);
  /// Owned range `index`'s parameters in the compute dtype, where they are in memory (the flat
  /// buffer or the shard); nullptr when they live on NVMe.
  virtual std::byte* parameters(std::size_t index) = 0;
  /// Where the update writes owned range `index`'s new parameters in the compute dtype when the
  /// optimizer keeps a separate fp32 master (the plan's separate_master()).
  virtual std::byte* update_target(std::size_t index) = 0;
  /// Range `index`'s new parameters are complete (its piece may start its way to NVMe).
  virtual void commit(std::size_t index) = 0;
  /// After an update: every rank gets the new parameters it holds (all-gather of the updated
  /// pieces; refresh of stage 3's persistent parameters; the caller's buffers).
  virtual void after_update() = 0;
  /// After the step: gradients accumulated in place start again from zero.
  void clear_gradients();

  // ---- checkpoints ---------------------------------------------------------------------------
  /// Elements [first, first + count) of parameter `index` this rank holds in the compute dtype
  /// (the whole parameter with flat parameters, its piece when sharded).
  virtual std::pair<std::int64_t, std::int64_t> held_range(std::size_t index) const = 0;
  /// Set held_range(index) from fp32 `values` (count elements).
  virtual void load_parameter(std::size_t index, const float* values) = 0;
  /// After a load: gradients cleared, derived copies (persistent parameters, the caller's buffers) refreshed.
  virtual void after_load() = 0;

  // ---- reports -------------------------------------------------------------------------------
  virtual ParametersPlacement parameters_placement() const = 0;
  /// Most parameter elements gathered at once (not counting persistent ones); 0 without gathering.
  virtual std::int64_t peak_gathered_parameters() const { return 0; }
  /// Time blocked waiting for this strategy's collectives since construction.
  double wait_seconds() const;
  /// offload_param nvme: the parameter store's counters (parameter_* fields only).
  virtual OffloadTiming parameter_swap_counters() const { return {}; }

 protected:
  explicit ZeroStrategy(const StrategyInputs& inputs);
  /// The parameter side of the backward hooks (gathering around the module's backward).
  virtual void gather_for_backward(const ModuleUse& use) = 0;
  virtual void release_after_backward(const ModuleUse& use) = 0;
  virtual void end_of_backward() = 0;
  virtual double parameter_wait_seconds() const = 0;

  std::size_t element_size() const { return dtype_size(dtype_); }
  std::byte* gradient_buffer() { return gradients_.as<std::byte>(); }

  const PartitionPlan& plan_;
  const ExecutionContext& execution_;
  const ParallelContext& parallel_;
  std::vector<nn::Parameter*> model_parameters_;
  ExternalModel* external_;
  DType dtype_;

 private:
  /// Parameter `index`'s full gradient (or, partitioned, one module's contribution to it) is final
  /// in this pass: into the reducer (and freed, when the gradients are partitioned).
  void reduce(std::size_t index);
  // nn::GradientSink, for the parameters of the streaming module whose backward runs.
  void stream(nn::Parameter& parameter, std::int64_t rows, const RowsFunction& compute) override;
  Tensor& full_gradient(nn::Parameter& parameter) override;

  Buffer gradients_;  // flat (accumulated in place) or this rank's reduced shard
  std::unique_ptr<GradientReducer> reducer_;
  std::vector<int> uses_per_parameter_;  // modules whose backward accumulates into the gradient
  std::vector<int> pending_uses_;        // of the current backward
  std::vector<char>
      reduced_this_pass_;  // (a contribution to) the gradient went to the reducer in this backward
  const ModuleUse* streaming_use_ = nullptr;  // the module whose backward streams into the reducer
  bool reducing_this_pass_ = false;           // this backward's gradients are communicated
};

/// The strategy the plan calls for: flat parameters when they are not partitioned, else sharded.
/// The one place where the choice is made.
std::unique_ptr<ZeroStrategy> make_zero_strategy(const StrategyInputs& inputs);

}  // namespace zt::engine_detail
