// Predicted model-state memory per rank (the ZeRO paper's formulas), for `zerotrain estimate`.
#pragma once

#include <cstdint>
#include <string>

#include "zerotrain/config.hpp"

namespace zt {

struct MemoryEstimate {
  std::int64_t parameters_count = 0;  // Ψ
  int world_size = 1;                 // N, the data-parallel size
  int zero_stage = 0;
  DType compute_dtype = DType::fp32;
  std::uint64_t parameters = 0;  // bytes per rank
  std::uint64_t gradients = 0;
  std::uint64_t optimizer_states = 0;  // fp32 master (16-bit training) + optimizer moments
  std::uint64_t total() const { return parameters + gradients + optimizer_states; }
  /// Communication staging the engine keeps on top (bytes): gradient reduction buckets
  /// (reduce_bucket_size elements of communication_data_type, two with overlap_comm) and, at stages
  /// 1-2, the parameter all-gather bucket (allgather_bucket_size). Each is capped at the model's size
  /// and holds at least its largest parameter, which only a config with a "model" section tells.
  std::uint64_t bucket_buffers = 0;
  /// Bytes of optimizer state per parameter: fp32 master (4, in bf16/fp16) + moments (Adam 8,
  /// SGD with momentum 4, plain SGD 0). Mixed-precision Adam: K = 12 as in the ZeRO paper.
  int optimizer_bytes_per_parameter = 0;
  /// A text table with the formula of each line.
  std::string table() const;
};

/// Per-rank model-state bytes for the config's precision and optimizer at ZeRO stage
/// config.zero_optimization.stage on `world_size` data-parallel ranks, for `parameters_count`
/// parameters (or, when 0, the count of the config's "model"):
///   stage 0: params kΨ, grads kΨ, states KΨ          (k = 2 in bf16/fp16, 4 in fp32)
///   stage 1: params kΨ, grads kΨ, states KΨ/N
///   stage 2: params kΨ, grads kΨ/N, states KΨ/N
///   stage 3: params kΨ/N, grads kΨ/N, states KΨ/N
/// Partitioned sizes round up to whole elements per rank.
MemoryEstimate estimate_model_state_memory(const Config& config, int world_size,
                                           std::int64_t parameters_count = 0);

/// Number of parameters of the config's "model" section (without building it).
std::int64_t model_parameter_count(const Config& config);

}  // namespace zt
