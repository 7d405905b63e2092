// The config's "model" section as pipeline layers, and how pipeline.stages and pipeline.partition
// split them: shared by zt::build_model(config, stage), the partition plan of a stage
// (planned_parameters_of_stage) and `zerotrain train`'s description of the stages, so that all
// three see the same split.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zerotrain/config.hpp"
#include "zerotrain/pipeline.hpp"

namespace zt::engine_detail {

/// The config's model as layer specs (zt::nn::gpt_layers or mlp_layers in the compute dtype, from
/// the config's seed). Describing the layers builds nothing.
std::vector<nn::LayerSpec> layers_of_config(const Config& config);

/// The boundaries of pipeline.stages stages over layers_of_config(config) by pipeline.partition
/// (zt::nn::partition_layers); one stage: {0, layers}.
std::vector<std::int64_t> stage_boundaries_of_config(const Config& config);

/// "h.2 .. head (3 layers)" or "embeddings (1 layer)": the layers of `stage`.
std::string describe_stage_layers(const std::vector<nn::LayerSpec>& layers,
                                  const std::vector<std::int64_t>& boundaries, int stage);

}  // namespace zt::engine_detail
