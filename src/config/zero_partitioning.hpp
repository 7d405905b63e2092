// What a ZeRO stage partitions across the data-parallel group. The stage number becomes these
// three facts here and nowhere else: the config's rules, the partition plan, the choice of ZeRO
// strategy and the estimate all read them (docs/zero.md).
#pragma once

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
};

}  // namespace zt::engine_detail
