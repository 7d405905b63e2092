// What a ZeRO stage partitions across the data-parallel group. The stage number becomes these
// three facts here and nowhere else: the config's rules, the partition plan, the choice of ZeRO
// strategy and the estimate all read them (docs/zero.md).
#pragma once

#include <cstdint>

#include "zerotrain/error.hpp"

namespace zt::engine_detail {

struct ZeroPartitioning {
  bool optimizer_states = false;  // ZeRO-1 and up: each rank updates its pieces
  bool gradients = false;         // ZeRO-2 and up: each rank keeps its pieces' reduced gradients
  bool parameters = false;        // ZeRO-3: each rank keeps its pieces of the parameters

  static ZeroPartitioning of_stage(int stage) {
    ZT_CHECK_AS(ConfigError, stage >= 0 && stage <= 3, "zero_optimization.stage is ", stage,
                "; expected 0, 1, 2 or 3");
    return {.optimizer_states = stage >= 1, .gradients = stage >= 2, .parameters = stage >= 3};
  }

  /// Pipeline stages partition within each stage's data-parallel group, except the parameters:
  /// refused (zt::ConfigError) for the engine and the estimate alike.
  void check_pipeline(std::int64_t pipeline_stages) const {
    ZT_CHECK_AS(
        ConfigError, pipeline_stages <= 1 || !parameters,
        "zero_optimization.stage 3 with pipeline.stages = ", pipeline_stages,
        ": stage 3 gathers a module's parameters around one micro-batch's forward and backward, while "
        "a pipeline keeps several micro-batches in flight on each stage; use stage 1 or 2 (they "
        "partition within each stage's data-parallel group)");
  }
};

}  // namespace zt::engine_detail
