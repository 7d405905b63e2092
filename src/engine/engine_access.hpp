// The engine's internal views, for the engine's own parts and its tests: the partition plan and
// this rank's master weights. Not part of the public API (include/zerotrain/engine.hpp).
//
//   const auto& layout = zt::engine_detail::inspect(engine).plan().layout();
#pragma once

#include <cstdint>
#include <vector>

#include "src/engine/partition_plan.hpp"
#include "zerotrain/communicator.hpp"
#include "zerotrain/engine.hpp"

namespace zt::engine_detail {

class EngineInspection {
 public:
  explicit EngineInspection(Engine::Impl& impl) : impl_(impl) {}
  const PartitionPlan& plan() const;
  /// Where each parameter sits in the flat layout and the partition.
  const std::vector<FlatParameter>& flat_layout() const { return plan().layout(); }
  /// Elements of the flat layout (stage 3 keeps no flat buffer, the layout still numbers elements)
  /// and of this rank's shard.
  std::int64_t flat_size() const { return plan().flat_size(); }
  std::int64_t shard_size() const { return plan().shard_size(); }
  /// This rank's fp32 master weights (the parameters themselves in fp32 training), in shard order:
  /// the whole flat buffer without partitioning, this rank's pieces of every parameter with it.
  std::vector<float> master_parameters();
  /// All master weights in the flat layout (collective when partitioned: all-gathers the shards).
  std::vector<float> gather_master_parameters();
  /// Stage 3: most parameter elements gathered at once (not counting persistent ones) since the
  /// engine started; 0 at stages 0-2.
  std::int64_t peak_gathered_parameters() const;
  /// The backend of the data-parallel group's communicator for the engine's device: local for a group
  /// of one rank (copies; ZT_ONE_RANK_GROUPS=device changes that), NCCL on a GPU, MPI otherwise.
  CommBackend data_group_backend() const;

 private:
  Engine::Impl& impl_;
};

struct EngineAccess {
  static EngineInspection inspect(Engine& engine);
};

inline EngineInspection inspect(Engine& engine) {
  return EngineAccess::inspect(engine);
}

}  // namespace zt::engine_detail
