// ZeRO stage 3: every rank keeps its piece of every parameter, in its shard in memory or in the
// parameter store's NVMe swap file, and a module's parameters are gathered around its forward and
// backward (ParameterGatherer). Internal to the engine.
#pragma once

#include <memory>

#include "src/engine/parameter_gatherer.hpp"
#include "src/engine/parameter_store.hpp"
#include "src/engine/zero_strategy.hpp"

namespace zt::engine_detail {

class ShardedParameters final : public ZeroStrategy {
 public:
  explicit ShardedParameters(const StrategyInputs& inputs);
  ~ShardedParameters() override;

  void begin_forward(bool training) override;
  void before_forward(const ModuleUse& use) override;
  void after_forward(const ModuleUse& use) override;
  /// The gathering trace follows one micro-batch's forward and backward.
  std::size_t forwards_in_flight_limit() const override { return 1; }
  std::byte* parameters(std::size_t index) override;
  std::byte* update_target(std::size_t index) override;
  void commit(std::size_t index) override;
  void after_update() override;
  std::pair<std::int64_t, std::int64_t> held_range(std::size_t index) const override;
  void load_parameter(std::size_t index, const float* values) override;
  void after_load() override;
  ParametersPlacement parameters_placement() const override;
  std::int64_t peak_gathered_parameters() const override { return gatherer_->peak_live_elements(); }
  OffloadTiming parameter_swap_counters() const override;
  /// Once the optimizer's master holds the initial values: with the pieces on NVMe the shard in
  /// memory is no longer needed.
  void drop_initial_shard();

 private:
  void gather_for_backward(const ModuleUse& use) override;
  void release_after_backward(const ModuleUse& use) override;
  void end_of_backward() override;
  double parameter_wait_seconds() const override { return gatherer_->wait_seconds(); }

  Buffer shard_;  // this rank's pieces (compute dtype); empty once they live on NVMe
  std::unique_ptr<ParameterStore> store_;
  std::unique_ptr<ParameterGatherer> gatherer_;
};

}  // namespace zt::engine_detail
