// Where the optimizer's fp32 master and states live, chosen once (make_optimizer_states): in
// memory next to the parameters (the optimizer's own buffers), or in the rank's NVMe swap file,
// streamed through host buffers one sub-group at a time (ZeRO-Infinity). Internal to the engine
// (docs/offload.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>

#include "src/engine/partition_plan.hpp"
#include "src/engine/zero_strategy.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/execution.hpp"
#include "zerotrain/optimizer.hpp"

namespace zt::engine_detail {

/// Updates shard elements [begin, end) of owned range `index`; `master` and `state[k]` point at
/// element `begin`.
using UpdatePart = std::function<void(std::size_t index, std::int64_t begin, std::int64_t end, float* master,
                                      std::span<float* const> state)>;

class OptimizerStates {
 public:
  virtual ~OptimizerStates() = default;
  OptimizerStates(const OptimizerStates&) = delete;
  OptimizerStates& operator=(const OptimizerStates&) = delete;

  Optimizer& optimizer() { return *optimizer_; }
  const Optimizer& optimizer() const { return *optimizer_; }
  /// One optimizer step: begin_step, then `part` over every element of every owned range, in shard
  /// order (whole ranges in memory; pieces of sub-groups on NVMe). Returns the NVMe pipeline's timing.
  virtual OffloadTiming update(float grad_scale, float lr, const UpdatePart& part) = 0;

  /// Checkpoints: owned range `index`'s master (its count elements) and optimizer state `state`.
  virtual void read_master(std::size_t index, float* destination) = 0;
  virtual void write_master(std::size_t index, const float* source) = 0;
  virtual void read_state(std::size_t state, std::size_t index, float* destination) = 0;
  virtual void write_state(std::size_t state, std::size_t index, const float* source) = 0;
  /// Reads and writes of the checkpoint calls above have reached their home (and caches are freed).
  virtual void flush() {}

  virtual OptimizerStatesPlacement placement() const = 0;

 protected:
  OptimizerStates(const PartitionPlan& plan, ZeroStrategy& strategy, const ExecutionContext& execution)
      : plan_(plan), strategy_(strategy), execution_(execution) {}
  /// The fp32 master of owned range `index` when it is in memory: the separate master, or the fp32
  /// parameters themselves.
  float* master_in_memory(std::size_t index);

  const PartitionPlan& plan_;
  ZeroStrategy& strategy_;
  const ExecutionContext& execution_;
  std::unique_ptr<Optimizer> optimizer_;
  Buffer master_;  // the separate master in memory (bf16/fp16 training, parameters on NVMe)
};

/// The home the plan calls for, its master initialized from the strategy's parameters and its
/// states zero. The one place where the choice is made.
std::unique_ptr<OptimizerStates> make_optimizer_states(const PartitionPlan& plan, ZeroStrategy& strategy,
                                                       const Config& config,
                                                       const ExecutionContext& execution);

}  // namespace zt::engine_detail
