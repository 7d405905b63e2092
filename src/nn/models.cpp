// Models: GPT-2 and a plain MLP, with deterministic initialization from a seed.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include "kernels/nn_kernels.hpp"
#include "zerotrain/nn.hpp"

namespace zt::nn {
namespace {

/// FNV-1a: a stable 64-bit hash of a parameter's name, so that its init stream depends on the name only.
std::uint64_t name_hash(std::string_view name) {
  std::uint64_t hash = 0xcbf29ce484222325ull;
  for (char c : name) hash = (hash ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return hash;
}

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

}  // namespace

void init_normal(Parameter& parameter, double stddev, std::uint64_t seed) {
  Tensor& value = parameter.value;
  const Stream& stream = default_stream(value.device());
  // On the default stream: done on return (kernels/dispatch.hpp), before any stream uses the parameter.
  kernels::fill_normal(stream, value.dtype(), value.raw_data(), value.numel(), 0.0, stddev,
                       seed ^ name_hash(parameter.name));
}

std::int64_t gpt_parameter_count(const GptConfig& config) {
  const std::int64_t C = config.d_model, V = config.vocab_size;
  const std::int64_t per_layer = 2 * (2 * C)            // ln1, ln2
                                 + (C * 3 * C + 3 * C)  // attn.qkv
                                 + (C * C + C)          // attn.proj
                                 + (C * 4 * C + 4 * C)  // mlp.fc
                                 + (4 * C * C + C);     // mlp.proj
  return V * C + config.seq_len * C + config.n_layer * per_layer + 2 * C +
         (config.tie_embeddings ? 0 : V * C);
}

Gpt::Gpt(const GptConfig& config, DType dtype, std::uint64_t seed, Device device)
    : Module("GPT"), config_(config), dtype_(dtype) {
  ZT_CHECK(config.n_layer > 0 && config.n_head > 0 && config.d_model > 0 && config.seq_len > 0 &&
               config.vocab_size > 0,
           "GptConfig needs positive n_layer, n_head, d_model, seq_len and vocab_size, got n_layer ",
           config.n_layer, ", n_head ", config.n_head, ", d_model ", config.d_model, ", seq_len ",
           config.seq_len, ", vocab_size ", config.vocab_size);
  ZT_CHECK(config.d_model % config.n_head == 0, "GptConfig: d_model ", config.d_model,
           " must be a multiple of n_head ", config.n_head);
  ZT_CHECK(dtype_is_floating(dtype), "Gpt in dtype ", dtype_name(dtype),
           ": expected fp32, fp64, bf16 or fp16");
  ZT_CHECK(config.activation_checkpoint_interval >= 0, "GptConfig: activation_checkpoint_interval ",
           config.activation_checkpoint_interval, ", expected >= 0 (0: no activation checkpointing)");
  wte_ =
      &register_module("wte", std::make_unique<Embedding>(config.vocab_size, config.d_model, dtype, device));
  wpe_ = &register_module(
      "wpe", std::make_unique<PositionalEmbedding>(config.seq_len, config.d_model, dtype, device));
  // Every dropout gets its own seed so that masks of different layers are independent.
  drop_ = &register_module("drop", std::make_unique<Dropout>(config.dropout, seed * 1000 + 1));
  blocks_ = &register_module("h", std::make_unique<Sequential>());
  const auto block = [&](std::int64_t layer) {
    return std::make_unique<TransformerBlock>(config.d_model, config.n_head, dtype, config.dropout,
                                              seed * 1000 + 2 * static_cast<std::uint64_t>(layer) + 2,
                                              device);
  };
  const std::int64_t interval = config.activation_checkpoint_interval;
  if (interval == 0) {
    for (std::int64_t layer = 0; layer < config.n_layer; ++layer) blocks_->append(block(layer));
  } else {
    // The checkpoints add no level: block `layer` is "h.<layer>" as without them.
    ActivationCheckpoint* previous = nullptr;
    for (std::int64_t first = 0; first < config.n_layer; first += interval) {
      auto& checkpoint =
          blocks_->append_at("", std::make_unique<ActivationCheckpoint>(config.cpu_checkpointing));
      checkpoint.set_previous_checkpoint(previous);  // its backward comes next
      previous = &checkpoint;
      for (std::int64_t layer = first; layer < std::min(first + interval, config.n_layer); ++layer)
        checkpoint.append(block(layer), std::to_string(layer));
    }
  }
  ln_f_ = &register_module("ln_f", std::make_unique<LayerNorm>(config.d_model, dtype, 1e-5, device));
  if (config.tie_embeddings) {
    lm_head_ = &register_module("lm_head", std::make_unique<LmHead>(wte_->weight()));
  } else {
    lm_head_ = &register_module("lm_head",
                                std::make_unique<LmHead>(config.d_model, config.vocab_size, dtype, device));
  }

  init_gpt2(*this, config.n_layer, seed);
}

void init_gpt2(Module& module, std::int64_t n_layer, std::uint64_t seed) {
  // LayerNorms keep weight 1 / bias 0 and biases stay 0 from construction.
  const double residual_stddev = 0.02 / std::sqrt(2.0 * static_cast<double>(n_layer));
  for (Module* part : module.modules()) {
    if (part->type_name() == "LayerNorm") continue;
    const bool residual_projection =
        ends_with(part->name(), "attn.proj") || ends_with(part->name(), "mlp.proj");
    for (Parameter* parameter : part->direct_parameters()) {
      if (ends_with(parameter->name, ".bias")) continue;
      init_normal(*parameter, residual_projection ? residual_stddev : 0.02, seed);
    }
  }
}

Tensor Gpt::forward(const Tensor& tokens, const RunContext& context) {
  ZT_CHECK(tokens.defined() && tokens.dtype() == DType::int32 && tokens.ndim() == 2, "GPT: tokens ",
           tokens.description(), ", expected int32 [batch, T]");
  ZT_CHECK(tokens.size(1) <= config_.seq_len, "GPT: sequence length ", tokens.size(1),
           " exceeds the model's seq_len ", config_.seq_len);
  Tensor x = drop_->run_forward(wpe_->run_forward(wte_->run_forward(tokens, context), context), context);
  x = ln_f_->run_forward(blocks_->run_forward(x, context), context);
  return lm_head_->run_forward(x, context);
}

Tensor Gpt::backward(const Tensor& grad_output, const RunContext& context) {
  Tensor grad = ln_f_->run_backward(lm_head_->run_backward(grad_output, context), context);
  grad = drop_->run_backward(blocks_->run_backward(grad, context), context);
  return wte_->run_backward(wpe_->run_backward(grad, context), context);
}

Mlp::Mlp(const MlpConfig& config, DType dtype, std::uint64_t seed, Device device) : Sequential("Mlp") {
  ZT_CHECK(config.sizes.size() >= 2, "MlpConfig.sizes has ", config.sizes.size(),
           " entries: expected at least input and output sizes");
  ZT_CHECK(config.activation_checkpoint_interval >= 0, "MlpConfig: activation_checkpoint_interval ",
           config.activation_checkpoint_interval, ", expected >= 0 (0: no activation checkpointing)");
  const auto interval = static_cast<std::size_t>(config.activation_checkpoint_interval);
  std::size_t module_index = 0;  // the name of the next module: "0", "1", ...
  ActivationCheckpoint* checkpoint = nullptr;
  const auto add = [&]<typename Layer>(std::unique_ptr<Layer> layer) -> Layer& {
    const std::string path = std::to_string(module_index++);
    if (checkpoint == nullptr) return append(std::move(layer));  // named by its index, as `path`
    return checkpoint->append(std::move(layer), path);
  };
  for (std::size_t i = 0; i + 1 < config.sizes.size(); ++i) {
    if (interval > 0 && i % interval == 0) {
      ActivationCheckpoint* previous = checkpoint;
      checkpoint = &append_at("", std::make_unique<ActivationCheckpoint>(config.cpu_checkpointing));
      checkpoint->set_previous_checkpoint(previous);  // its backward comes next
    }
    auto& linear = add(std::make_unique<Linear>(config.sizes[i], config.sizes[i + 1], true, dtype, device));
    init_normal(linear.weight(), 1.0 / std::sqrt(static_cast<double>(config.sizes[i])), seed);
    if (i + 2 < config.sizes.size()) add(std::make_unique<Activation>(config.activation));
  }
}

}  // namespace zt::nn
