// Models described by a config's "model" section.
#include <string>
#include <variant>
#include <vector>

#include "src/engine/model_layers.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/pipeline.hpp"
#include "zerotrain/process_grid.hpp"
#include "zerotrain/runtime.hpp"

namespace zt {

namespace {

void check_has_model(const Config& config) {
  ZT_CHECK_AS(ConfigError, config.model.has_value(),
              "the config has no \"model\" section; e.g. {\"type\": \"gpt\", \"n_layer\": 4, \"n_head\": 4, "
              "\"d_model\": 128, \"seq_len\": 64, \"vocab_size\": 256} or {\"type\": \"mlp\", \"sizes\": "
              "[32, 64, 8]}");
}

nn::GptConfig gpt_config_of(const Config& config, const GptModelConfig& gpt) {
  nn::GptConfig model;
  model.n_layer = gpt.n_layer;
  model.n_head = gpt.n_head;
  model.d_model = gpt.d_model;
  model.seq_len = gpt.seq_len;
  model.vocab_size = gpt.vocab_size;
  model.tie_embeddings = gpt.tie_embeddings;
  model.dropout = gpt.dropout;
  model.activation_checkpoint_interval = config.activation_checkpoint_interval_for(gpt.n_layer);
  model.cpu_checkpointing = config.activation_checkpointing.cpu_checkpointing;
  return model;
}

nn::MlpConfig mlp_config_of(const Config& config, const MlpModelConfig& mlp) {
  nn::MlpConfig model;
  model.sizes = mlp.sizes;
  model.activation_checkpoint_interval =
      config.activation_checkpoint_interval_for(static_cast<std::int64_t>(mlp.sizes.size()) - 1);
  model.cpu_checkpointing = config.activation_checkpointing.cpu_checkpointing;
  switch (mlp.activation) {
    case MlpActivation::relu:
      model.activation = nn::ActivationKind::relu;
      break;
    case MlpActivation::gelu:
      model.activation = nn::ActivationKind::gelu;
      break;
    case MlpActivation::tanh:
      model.activation = nn::ActivationKind::tanh;
      break;
  }
  return model;
}

}  // namespace

std::unique_ptr<nn::Module> build_model(const Config& config) {
  check_has_model(config);
  ZT_CHECK_AS(ConfigError, config.pipeline.stage_count() == 1, "pipeline.stages is ",
              config.pipeline.stage_count(),
              ": build this rank's stage with zt::build_model(config, stage) (stage: "
              "zt::pipeline_stage_of(runtime, config), or the grid's coordinates().pipeline)");
  const DType dtype = compute_dtype_of(config);
  if (const auto* gpt = std::get_if<GptModelConfig>(&*config.model))
    return std::make_unique<nn::Gpt>(gpt_config_of(config, *gpt), dtype, config.seed);
  return std::make_unique<nn::Mlp>(mlp_config_of(config, std::get<MlpModelConfig>(*config.model)), dtype,
                                   config.seed);
}

std::unique_ptr<nn::Module> build_model(const Config& config, int stage) {
  const std::vector<nn::LayerSpec> layers = engine_detail::layers_of_config(config);
  const std::vector<std::int64_t> boundaries = engine_detail::stage_boundaries_of_config(config);
  const int stages = static_cast<int>(boundaries.size()) - 1;
  ZT_CHECK_AS(ConfigError, stage >= 0 && stage < stages, "build_model: stage ", stage, " of pipeline.stages ",
              stages);
  // Activation checkpoints over the stage's layers (DeepSpeed's PipelineModule), by the config's rule.
  const std::int64_t stage_layers =
      boundaries[static_cast<std::size_t>(stage) + 1] - boundaries[static_cast<std::size_t>(stage)];
  const nn::StageCheckpointing checkpointing{
      .interval = config.activation_checkpoint_interval_for(stage_layers),
      .keep_input_on_host = config.activation_checkpointing.cpu_checkpointing};
  return std::make_unique<nn::PipelineStage>(layers, boundaries, stage, checkpointing);
}

namespace engine_detail {

std::vector<nn::LayerSpec> layers_of_config(const Config& config) {
  check_has_model(config);
  const DType dtype = compute_dtype_of(config);
  return std::holds_alternative<GptModelConfig>(*config.model)
             ? nn::gpt_layers(gpt_config_of(config, std::get<GptModelConfig>(*config.model)), dtype,
                              config.seed)
             : nn::mlp_layers(mlp_config_of(config, std::get<MlpModelConfig>(*config.model)), dtype,
                              config.seed);
}

std::vector<std::int64_t> stage_boundaries_of_config(const Config& config) {
  return nn::partition_layers(layers_of_config(config), static_cast<int>(config.pipeline.stage_count()),
                              config.pipeline.partition);
}

std::string describe_stage_layers(const std::vector<nn::LayerSpec>& layers,
                                  const std::vector<std::int64_t>& boundaries, int stage) {
  const auto first = static_cast<std::size_t>(boundaries.at(static_cast<std::size_t>(stage)));
  const auto end = static_cast<std::size_t>(boundaries.at(static_cast<std::size_t>(stage) + 1));
  const std::size_t count = end - first;
  std::string text = layers.at(first).key;
  if (count > 1) text += " .. " + layers.at(end - 1).key;
  return text + " (" + std::to_string(count) + (count == 1 ? " layer)" : " layers)");
}

}  // namespace engine_detail

int pipeline_stage_of(const Runtime& runtime, const Config& config) {
  const int stages = static_cast<int>(config.pipeline.stage_count());
  ZT_CHECK_AS(ConfigError, stages >= 1 && runtime.world_size() % stages == 0, "pipeline.stages is ", stages,
              " but the job has ", runtime.world_size(),
              " ranks: the ranks must split into stages of equal data-parallel size (ranks = stages x data)");
  return ProcessGrid::coordinates_of(runtime.world_rank(),
                                     GridShape{runtime.world_size() / stages, stages, 1})
      .pipeline;
}

}  // namespace zt
