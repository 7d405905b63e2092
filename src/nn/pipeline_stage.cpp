// Pipeline stages built from layer specs, and the built-in models as layer specs (pipeline.hpp).
#include <cmath>
#include <string>

#include "zerotrain/error.hpp"
#include "zerotrain/pipeline.hpp"

namespace zt::nn {
namespace {

/// wte, wpe and the embedding dropout of GPT-2: tokens int32 [B, T] -> x [B, T, C].
class GptEmbeddings : public Module {
 public:
  GptEmbeddings(const GptConfig& config, DType dtype, std::uint64_t seed) : Module("GptEmbeddings") {
    seq_len_ = config.seq_len;
    wte_ = &register_module("wte", std::make_unique<Embedding>(config.vocab_size, config.d_model, dtype));
    wpe_ =
        &register_module("wpe", std::make_unique<PositionalEmbedding>(config.seq_len, config.d_model, dtype));
    drop_ = &register_module("drop", std::make_unique<Dropout>(config.dropout, seed * 1000 + 1));
  }

 protected:
  Tensor forward(const Tensor& tokens, const RunContext& context) override {
    ZT_CHECK(tokens.defined() && tokens.dtype() == DType::int32 && tokens.ndim() == 2,
             "GPT embeddings: tokens ", tokens.description(), ", expected int32 [batch, T]");
    ZT_CHECK(tokens.size(1) <= seq_len_, "GPT embeddings: sequence length ", tokens.size(1),
             " exceeds the model's seq_len ", seq_len_);
    return drop_->run_forward(wpe_->run_forward(wte_->run_forward(tokens, context), context), context);
  }
  Tensor backward(const Tensor& grad_output, const RunContext& context) override {
    return wte_->run_backward(wpe_->run_backward(drop_->run_backward(grad_output, context), context),
                              context);
  }

 private:
  std::int64_t seq_len_;
  Embedding* wte_;
  PositionalEmbedding* wpe_;
  Dropout* drop_;
};

/// ln_f and the LM head of GPT-2: x [B, T, C] -> logits [B, T, V]. Tied, the head uses the stage's
/// "wte.weight", or a copy of it that this layer holds (a tied layer: the engine sums the copies'
/// gradients between the stages that hold one).
class GptHead : public Module {
 public:
  GptHead(const GptConfig& config, DType dtype, PipelineStage& stage) : Module("GptHead") {
    Parameter* tied = nullptr;
    if (config.tie_embeddings) {
      tied = stage.find_parameter("wte.weight");
      if (tied == nullptr) {
        tied = &register_module("wte", std::make_unique<Embedding>(config.vocab_size, config.d_model, dtype))
                    .weight();
      }
    }
    ln_f_ = &register_module("ln_f", std::make_unique<LayerNorm>(config.d_model, dtype, 1e-5));
    lm_head_ =
        tied != nullptr
            ? &register_module("lm_head", std::make_unique<LmHead>(*tied))
            : &register_module("lm_head", std::make_unique<LmHead>(config.d_model, config.vocab_size, dtype));
  }

 protected:
  Tensor forward(const Tensor& input, const RunContext& context) override {
    return lm_head_->run_forward(ln_f_->run_forward(input, context), context);
  }
  Tensor backward(const Tensor& grad_output, const RunContext& context) override {
    return ln_f_->run_backward(lm_head_->run_backward(grad_output, context), context);
  }

 private:
  LayerNorm* ln_f_;
  LmHead* lm_head_;
};

}  // namespace

PipelineStage::PipelineStage(const std::vector<LayerSpec>& layers,
                             const std::vector<std::int64_t>& boundaries, int stage,
                             StageCheckpointing checkpointing)
    : Module("PipelineStage"), stage_(stage), stages_(static_cast<int>(boundaries.size()) - 1) {
  ZT_CHECK_AS(ConfigError, stages_ >= 1 && stage >= 0 && stage < stages_, "PipelineStage: stage ", stage,
              " of ", stages_, " (from ", boundaries.size(), " boundaries): expected 0 <= stage < stages");
  ZT_CHECK_AS(ConfigError,
              boundaries.front() == 0 && boundaries.back() == static_cast<std::int64_t>(layers.size()),
              "PipelineStage: boundaries run from ", boundaries.front(), " to ", boundaries.back(),
              "; expected 0 to the number of layers, ", layers.size());
  for (std::size_t s = 0; s + 1 < boundaries.size(); ++s) {
    ZT_CHECK_AS(ConfigError, boundaries[s] < boundaries[s + 1], "PipelineStage: stage ", s, " holds layers [",
                boundaries[s], ", ", boundaries[s + 1],
                "): every stage needs at least one layer (partition_layers makes valid boundaries)");
  }
  ZT_CHECK_AS(ConfigError, checkpointing.interval >= 0, "PipelineStage: activation checkpoint interval ",
              checkpointing.interval, "; expected >= 0 (0: no checkpoints)");
  first_layer_ = boundaries[static_cast<std::size_t>(stage)];
  end_layer_ = boundaries[static_cast<std::size_t>(stage) + 1];
  ActivationCheckpoint* group = nullptr;
  for (std::int64_t i = first_layer_; i < end_layer_; ++i) {
    const LayerSpec& spec = layers[static_cast<std::size_t>(i)];
    ZT_CHECK(spec.build != nullptr, "PipelineStage: layer ", i, " ('", spec.key, "') has no build function");
    // A group is registered before its layers are built, so a tied layer finds the parameters of
    // the layers before it in the same group.
    if (checkpointing.interval > 0 && (i - first_layer_) % checkpointing.interval == 0) {
      ActivationCheckpoint* previous = group;
      group = &register_module_at("checkpoint." + std::to_string(runs_.size()), "",
                                  std::make_unique<ActivationCheckpoint>(checkpointing.keep_input_on_host));
      group->set_previous_checkpoint(previous);  // its backward comes next
      runs_.push_back(group);
    }
    std::unique_ptr<Module> built = spec.build(*this);
    ZT_CHECK(built != nullptr, "PipelineStage: layer ", i, " ('", spec.key, "') built nothing");
    Module& layer = group != nullptr ? group->append(std::move(built), spec.path)
                                     : register_module_at(spec.key, spec.path, std::move(built));
    if (group == nullptr) runs_.push_back(&layer);
    if (spec.initialize) spec.initialize(layer);
    for (Parameter* parameter : layer.parameters()) parameter->pipeline_stage = stage;
    layers_.push_back(&layer);
  }
}

Tensor PipelineStage::forward(const Tensor& input, const RunContext& context) {
  Tensor x = input;
  for (Module* run : runs_) x = run->run_forward(x, context);
  return x;
}

Tensor PipelineStage::backward(const Tensor& grad_output, const RunContext& context) {
  Tensor grad = grad_output;
  for (auto it = runs_.rbegin(); it != runs_.rend(); ++it) grad = (*it)->run_backward(grad, context);
  return grad;
}

std::vector<LayerSpec> gpt_layers(const GptConfig& config, DType dtype, std::uint64_t seed) {
  ZT_CHECK(config.n_layer > 0 && config.n_head > 0 && config.d_model > 0 && config.seq_len > 0 &&
               config.vocab_size > 0 && config.d_model % config.n_head == 0,
           "gpt_layers: GptConfig needs positive sizes and d_model a multiple of n_head, got n_layer ",
           config.n_layer, ", n_head ", config.n_head, ", d_model ", config.d_model, ", seq_len ",
           config.seq_len, ", vocab_size ", config.vocab_size);
  ZT_CHECK(dtype_is_floating(dtype), "gpt_layers in dtype ", dtype_name(dtype),
           ": expected fp32, fp64, bf16 or fp16");
  const std::int64_t C = config.d_model, V = config.vocab_size;
  auto initialize = [n_layer = config.n_layer, seed](Module& layer) { init_gpt2(layer, n_layer, seed); };
  std::vector<LayerSpec> layers;
  layers.push_back({.key = "embeddings",
                    .path = "",
                    .type = "GptEmbeddings",
                    .parameter_count = V * C + config.seq_len * C,
                    .build = [config, dtype, seed](PipelineStage&) -> std::unique_ptr<Module> {
                      return std::make_unique<GptEmbeddings>(config, dtype, seed);
                    },
                    .initialize = initialize});
  const std::int64_t per_block =
      2 * (2 * C) + (C * 3 * C + 3 * C) + (C * C + C) + (C * 4 * C + 4 * C) + (4 * C * C + C);
  for (std::int64_t layer = 0; layer < config.n_layer; ++layer) {
    const std::string name = "h." + std::to_string(layer);
    layers.push_back({.key = name,
                      .path = name,
                      .type = "TransformerBlock",
                      .parameter_count = per_block,
                      .build = [config, dtype, seed, layer](PipelineStage&) -> std::unique_ptr<Module> {
                        return std::make_unique<TransformerBlock>(
                            config.d_model, config.n_head, dtype, config.dropout,
                            seed * 1000 + 2 * static_cast<std::uint64_t>(layer) + 2);
                      },
                      .initialize = initialize});
  }
  layers.push_back({.key = "head",
                    .path = "",
                    .type = "GptHead",
                    .parameter_count = 2 * C + V * C,
                    .build = [config, dtype](PipelineStage& stage) -> std::unique_ptr<Module> {
                      return std::make_unique<GptHead>(config, dtype, stage);
                    },
                    .initialize = initialize});
  return layers;
}

std::vector<LayerSpec> mlp_layers(const MlpConfig& config, DType dtype, std::uint64_t seed) {
  ZT_CHECK(config.sizes.size() >= 2, "mlp_layers: MlpConfig.sizes has ", config.sizes.size(),
           " entries: expected at least input and output sizes");
  std::vector<LayerSpec> layers;
  for (std::size_t i = 0; i + 1 < config.sizes.size(); ++i) {
    const std::int64_t in = config.sizes[i], out = config.sizes[i + 1];
    const std::string linear_name = std::to_string(layers.size());
    layers.push_back({.key = linear_name,
                      .path = linear_name,
                      .type = "Linear",
                      .parameter_count = in * out + out,
                      .build = [in, out, dtype](PipelineStage&) -> std::unique_ptr<Module> {
                        return std::make_unique<Linear>(in, out, true, dtype);
                      },
                      .initialize =
                          [in, seed](Module& layer) {
                            init_normal(static_cast<Linear&>(layer).weight(),
                                        1.0 / std::sqrt(static_cast<double>(in)), seed);
                          }});
    if (i + 2 < config.sizes.size()) {
      const std::string activation_name = std::to_string(layers.size());
      const ActivationKind kind = config.activation;
      layers.push_back({.key = activation_name,
                        .path = activation_name,
                        .type = "Activation",
                        .parameter_count = 0,
                        .build = [kind](PipelineStage&) -> std::unique_ptr<Module> {
                          return std::make_unique<Activation>(kind);
                        },
                        .initialize = {}});
    }
  }
  return layers;
}

}  // namespace zt::nn
