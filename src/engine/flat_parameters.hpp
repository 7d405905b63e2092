// ZeRO stages 0-2: every rank keeps all parameters in one flat buffer (the model's tensors are views
// into it); when the optimizer states are partitioned, each rank updates its pieces and the updated
// pieces are all-gathered in allgather_bucket_size buckets. Internal to the engine.
#pragma once

#include "src/engine/zero_strategy.hpp"
#include "zerotrain/tensor.hpp"

namespace zt::engine_detail {

class FlatParameters final : public ZeroStrategy {
 public:
  explicit FlatParameters(const StrategyInputs& inputs);

  void begin_forward(bool) override {}
  void before_forward(const ModuleUse&) override {}
  void after_forward(const ModuleUse&) override {}
  std::size_t forwards_in_flight_limit() const override { return 0; }
  std::byte* parameters(std::size_t index) override;
  std::byte* update_target(std::size_t index) override { return parameters(index); }
  void commit(std::size_t) override {}
  void after_update() override;
  std::pair<std::int64_t, std::int64_t> held_range(std::size_t index) const override;
  void load_parameter(std::size_t index, const float* values) override;
  void after_load() override;
  ParametersPlacement parameters_placement() const override;

 private:
  void gather_for_backward(const ModuleUse&) override {}
  void release_after_backward(const ModuleUse&) override {}
  void end_of_backward() override {}
  double parameter_wait_seconds() const override { return allgather_wait_seconds_; }
  /// Every rank updated its pieces; gather the others' in buckets of allgather_bucket_size elements,
  /// packed rank-major (this rank's pieces of a bucket's parameters together).
  void all_gather_updated_parameters();
  /// Bring your own model: the new values into the caller's buffers.
  void copy_parameters_out();

  Buffer flat_;               // compute dtype, the flat layout
  Tensor allgather_staging_;  // packs the updated pieces for the all-gather
  double allgather_wait_seconds_ = 0.0;
};

}  // namespace zt::engine_detail
