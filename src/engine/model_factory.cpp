// Models described by a config's "model" section.
#include <variant>

#include "zerotrain/engine.hpp"
#include "zerotrain/error.hpp"

namespace zt {

std::unique_ptr<nn::Module> build_model(const Config& config) {
  ZT_CHECK_AS(ConfigError, config.model.has_value(),
              "the config has no \"model\" section; e.g. {\"type\": \"gpt\", \"n_layer\": 4, \"n_head\": 4, "
              "\"d_model\": 128, \"seq_len\": 64, \"vocab_size\": 256} or {\"type\": \"mlp\", \"sizes\": "
              "[32, 64, 8]}");
  const DType dtype = compute_dtype_of(config);
  if (const auto* gpt = std::get_if<GptModelConfig>(&*config.model)) {
    nn::GptConfig model;
    model.n_layer = gpt->n_layer;
    model.n_head = gpt->n_head;
    model.d_model = gpt->d_model;
    model.seq_len = gpt->seq_len;
    model.vocab_size = gpt->vocab_size;
    model.tie_embeddings = gpt->tie_embeddings;
    model.dropout = gpt->dropout;
    model.activation_checkpoint_interval = config.activation_checkpoint_interval_for(gpt->n_layer);
    model.cpu_checkpointing = config.activation_checkpointing.cpu_checkpointing;
    return std::make_unique<nn::Gpt>(model, dtype, config.seed);
  }
  const auto& mlp = std::get<MlpModelConfig>(*config.model);
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
  return std::make_unique<nn::Mlp>(model, dtype, config.seed);
}

}  // namespace zt
