// The layers: thin wrappers that check shapes, allocate outputs and call the kernels.
#include <cmath>

#include "kernels/nn_kernels.hpp"
#include "src/nn/nn_checks.hpp"
#include "zerotrain/nn.hpp"

namespace zt::nn {

using detail::activation_tensor;
using detail::check_input;
using detail::grad_pointer;

// ---- Sequential -------------------------------------------------------------------------------

Tensor Sequential::forward(const Tensor& input) {
  Tensor x = input;
  for (Module* child : children()) x = child->run_forward(x);
  return x;
}

Tensor Sequential::backward(const Tensor& grad_output) {
  Tensor grad = grad_output;
  const std::vector<Module*> layers = children();
  for (auto it = layers.rbegin(); it != layers.rend(); ++it) grad = (*it)->run_backward(grad);
  return grad;
}

// ---- Linear -----------------------------------------------------------------------------------

Linear::Linear(std::int64_t in_features, std::int64_t out_features, bool bias, DType dtype)
    : Module("Linear"), in_features_(in_features), out_features_(out_features) {
  ZT_CHECK(in_features > 0 && out_features > 0, "Linear(", in_features, ", ", out_features,
           "): expected positive feature counts");
  weight_ = &register_parameter("weight", Tensor::zeros({out_features, in_features}, dtype, Device::host(),
                                                        MemoryCategory::parameters));
  if (bias) {
    bias_ = &register_parameter(
        "bias", Tensor::zeros({out_features}, dtype, Device::host(), MemoryCategory::parameters));
  }
}

Tensor Linear::forward(const Tensor& input) {
  check_input(*this, "input", input, weight_->value.dtype(), in_features_);
  Shape output_shape = input.shape();
  output_shape.back() = out_features_;
  Tensor output = activation_tensor(output_shape, input);
  const kernels::MatmulShape shape{input.numel() / in_features_, in_features_, out_features_};
  kernels::matmul_forward(default_stream(input.device()), input.dtype(), input.raw_data(),
                          weight_->value.raw_data(), bias_ != nullptr ? bias_->value.raw_data() : nullptr,
                          output.raw_data(), shape);
  saved_input_ = input;
  return output;
}

Tensor Linear::backward(const Tensor& grad_output) {
  ZT_CHECK(saved_input_.defined(), "backward of Linear '", name(), "' before its forward");
  check_input(*this, "grad_output", grad_output, saved_input_.dtype(), out_features_);
  ZT_CHECK(grad_output.numel() / out_features_ == saved_input_.numel() / in_features_, "Linear '", name(),
           "': grad_output ", grad_output.description(), " does not match the forward input ",
           saved_input_.description());
  Tensor grad_input = activation_tensor(saved_input_.shape(), saved_input_);
  const kernels::MatmulShape shape{saved_input_.numel() / in_features_, in_features_, out_features_};
  kernels::matmul_backward(default_stream(grad_output.device()), grad_output.dtype(), grad_output.raw_data(),
                           saved_input_.raw_data(), weight_->value.raw_data(), grad_input.raw_data(),
                           grad_pointer(*weight_), bias_ != nullptr ? grad_pointer(*bias_) : nullptr, shape);
  return grad_input;
}

// ---- Embedding --------------------------------------------------------------------------------

Embedding::Embedding(std::int64_t num_embeddings, std::int64_t dim, DType dtype)
    : Module("Embedding"), num_embeddings_(num_embeddings), dim_(dim) {
  ZT_CHECK(num_embeddings > 0 && dim > 0, "Embedding(", num_embeddings, ", ", dim,
           "): expected positive sizes");
  weight_ = &register_parameter(
      "weight", Tensor::zeros({num_embeddings, dim}, dtype, Device::host(), MemoryCategory::parameters));
}

Tensor Embedding::forward(const Tensor& tokens) {
  ZT_CHECK(tokens.defined() && tokens.dtype() == DType::int32, "Embedding '", name(),
           "': expected int32 token indices, got ", tokens.description());
  Shape output_shape = tokens.shape();
  output_shape.push_back(dim_);
  const Tensor& table = weight_->value;
  Tensor output = Tensor::empty(output_shape, table.dtype(), table.device(), MemoryCategory::activations);
  // [batch, T] for error messages that name the position of a bad token; any rank works.
  const std::int64_t positions = tokens.ndim() == 0 ? 1 : tokens.size(-1);
  const kernels::EmbeddingShape shape{positions == 0 ? 0 : tokens.numel() / positions, positions,
                                      num_embeddings_, dim_};
  kernels::embedding_forward(default_stream(table.device()), table.dtype(), tokens.data<std::int32_t>(),
                             table.raw_data(), nullptr, output.raw_data(), shape);
  saved_tokens_ = tokens;
  return output;
}

Tensor Embedding::backward(const Tensor& grad_output) {
  ZT_CHECK(saved_tokens_.defined(), "backward of Embedding '", name(), "' before its forward");
  check_input(*this, "grad_output", grad_output, weight_->value.dtype(), dim_);
  ZT_CHECK(grad_output.numel() == saved_tokens_.numel() * dim_, "Embedding '", name(), "': grad_output ",
           grad_output.description(), " does not match the tokens ", saved_tokens_.description());
  const kernels::EmbeddingShape shape{saved_tokens_.numel(), 1, num_embeddings_, dim_};  // positions unused
  kernels::embedding_backward(default_stream(grad_output.device()), grad_output.dtype(),
                              saved_tokens_.data<std::int32_t>(), grad_output.raw_data(),
                              grad_pointer(*weight_), nullptr, shape);
  return {};
}

// ---- PositionalEmbedding ----------------------------------------------------------------------

PositionalEmbedding::PositionalEmbedding(std::int64_t max_positions, std::int64_t dim, DType dtype)
    : Module("PositionalEmbedding"), max_positions_(max_positions), dim_(dim) {
  ZT_CHECK(max_positions > 0 && dim > 0, "PositionalEmbedding(", max_positions, ", ", dim,
           "): expected positive sizes");
  weight_ = &register_parameter(
      "weight", Tensor::zeros({max_positions, dim}, dtype, Device::host(), MemoryCategory::parameters));
}

Tensor PositionalEmbedding::forward(const Tensor& input) {
  check_input(*this, "input", input, weight_->value.dtype(), dim_);
  ZT_CHECK(input.ndim() == 3 && input.size(1) <= max_positions_, "PositionalEmbedding '", name(), "': input ",
           input.description(), ", expected [batch, T, ", dim_, "] with T <= ", max_positions_);
  const std::int64_t batch = input.size(0), row_elements = input.size(1) * dim_;
  Tensor output = activation_tensor(input.shape(), input);
  const Tensor positions = weight_->value.flat_slice(0, row_elements);
  for (std::int64_t b = 0; b < batch; ++b) {
    kernels::add(default_stream(input.device()), input.dtype(),
                 input.flat_slice(b * row_elements, row_elements).raw_data(), positions.raw_data(),
                 output.flat_slice(b * row_elements, row_elements).raw_data(), row_elements);
  }
  return output;
}

Tensor PositionalEmbedding::backward(const Tensor& grad_output) {
  check_input(*this, "grad_output", grad_output, weight_->value.dtype(), dim_);
  ZT_CHECK(grad_output.ndim() == 3 && grad_output.size(1) <= max_positions_, "PositionalEmbedding '", name(),
           "': grad_output ", grad_output.description(), ", expected [batch, T, ", dim_, "]");
  if (weight_->grad.defined()) {
    const std::int64_t batch = grad_output.size(0), row_elements = grad_output.size(1) * dim_;
    // Batches one after another: a fixed summation order.
    for (std::int64_t b = 0; b < batch; ++b) {
      kernels::accumulate(default_stream(grad_output.device()), grad_output.dtype(), weight_->grad.raw_data(),
                          grad_output.flat_slice(b * row_elements, row_elements).raw_data(), row_elements);
    }
  }
  return grad_output;  // x + positions: the input gradient is the output gradient
}

// ---- LayerNorm --------------------------------------------------------------------------------

LayerNorm::LayerNorm(std::int64_t dim, DType dtype, double eps) : Module("LayerNorm"), dim_(dim), eps_(eps) {
  ZT_CHECK(dim > 0 && eps > 0, "LayerNorm(", dim, ", eps ", eps, "): expected a positive size and eps");
  weight_ =
      &register_parameter("weight", Tensor::empty({dim}, dtype, Device::host(), MemoryCategory::parameters));
  weight_->value.fill_(1.0);
  bias_ =
      &register_parameter("bias", Tensor::zeros({dim}, dtype, Device::host(), MemoryCategory::parameters));
}

Tensor LayerNorm::forward(const Tensor& input) {
  check_input(*this, "input", input, weight_->value.dtype(), dim_);
  const std::int64_t rows = input.numel() / dim_;
  Tensor output = activation_tensor(input.shape(), input);
  const DType stats = kernels::stat_dtype(input.dtype());
  saved_mean_ = Tensor::empty({rows}, stats, input.device(), MemoryCategory::activations);
  saved_rstd_ = Tensor::empty({rows}, stats, input.device(), MemoryCategory::activations);
  kernels::layernorm_forward(default_stream(input.device()), input.dtype(), input.raw_data(),
                             weight_->value.raw_data(), bias_->value.raw_data(), output.raw_data(),
                             saved_mean_.raw_data(), saved_rstd_.raw_data(), rows, dim_, eps_);
  saved_input_ = input;
  return output;
}

Tensor LayerNorm::backward(const Tensor& grad_output) {
  ZT_CHECK(saved_input_.defined(), "backward of LayerNorm '", name(), "' before its forward");
  check_input(*this, "grad_output", grad_output, saved_input_.dtype(), dim_);
  ZT_CHECK(grad_output.numel() == saved_input_.numel(), "LayerNorm '", name(), "': grad_output ",
           grad_output.description(), " does not match the forward input ", saved_input_.description());
  Tensor grad_input = activation_tensor(saved_input_.shape(), saved_input_);
  kernels::layernorm_backward(
      default_stream(grad_output.device()), grad_output.dtype(), grad_output.raw_data(),
      saved_input_.raw_data(), weight_->value.raw_data(), saved_mean_.raw_data(), saved_rstd_.raw_data(),
      grad_input.raw_data(), grad_pointer(*weight_), grad_pointer(*bias_), saved_input_.numel() / dim_, dim_);
  return grad_input;
}

// ---- Activation -------------------------------------------------------------------------------

std::string_view activation_name(ActivationKind kind) {
  switch (kind) {
    case ActivationKind::gelu:
      return "gelu";
    case ActivationKind::relu:
      return "relu";
    case ActivationKind::tanh:
      return "tanh";
  }
  return "?";
}

namespace {
kernels::Activation kernel_activation(ActivationKind kind) {
  switch (kind) {
    case ActivationKind::gelu:
      return kernels::Activation::gelu;
    case ActivationKind::relu:
      return kernels::Activation::relu;
    case ActivationKind::tanh:
      return kernels::Activation::tanh;
  }
  ZT_THROW("unknown activation kind ", static_cast<int>(kind));
}
}  // namespace

Activation::Activation(ActivationKind kind)
    : Module(kind == ActivationKind::gelu ? "GELU" : "Activation"), kind_(kind) {}

Tensor Activation::forward(const Tensor& input) {
  check_input(*this, "input", input, input.dtype(), -1);
  Tensor output = activation_tensor(input.shape(), input);
  kernels::activation_forward(default_stream(input.device()), input.dtype(), kernel_activation(kind_),
                              input.raw_data(), output.raw_data(), input.numel());
  saved_input_ = input;
  return output;
}

Tensor Activation::backward(const Tensor& grad_output) {
  ZT_CHECK(saved_input_.defined(), "backward of ", activation_name(kind_), " '", name(),
           "' before its forward");
  check_input(*this, "grad_output", grad_output, saved_input_.dtype(), -1);
  ZT_CHECK(grad_output.numel() == saved_input_.numel(), activation_name(kind_), " '", name(),
           "': grad_output ", grad_output.description(), " does not match the forward input ",
           saved_input_.description());
  Tensor grad_input = activation_tensor(saved_input_.shape(), saved_input_);
  kernels::activation_backward(default_stream(grad_output.device()), grad_output.dtype(),
                               kernel_activation(kind_), saved_input_.raw_data(), grad_output.raw_data(),
                               grad_input.raw_data(), grad_output.numel());
  return grad_input;
}

// ---- Dropout ----------------------------------------------------------------------------------

Dropout::Dropout(double p, std::uint64_t seed) : Module("Dropout"), p_(p), seed_(seed) {
  ZT_CHECK(p >= 0 && p < 1, "Dropout probability must lie in [0, 1), got ", p);
}

Tensor Dropout::forward(const Tensor& input) {
  last_was_identity_ = !training() || p_ == 0;
  if (last_was_identity_) return input;
  check_input(*this, "input", input, input.dtype(), -1);
  last_stream_ = next_stream_++;
  Tensor output = activation_tensor(input.shape(), input);
  kernels::dropout_forward(default_stream(input.device()), input.dtype(), input.raw_data(), output.raw_data(),
                           input.numel(), p_, seed_, last_stream_);
  return output;
}

Tensor Dropout::backward(const Tensor& grad_output) {
  if (last_was_identity_) return grad_output;
  check_input(*this, "grad_output", grad_output, grad_output.dtype(), -1);
  Tensor grad_input = activation_tensor(grad_output.shape(), grad_output);
  kernels::dropout_backward(default_stream(grad_output.device()), grad_output.dtype(), grad_output.raw_data(),
                            grad_input.raw_data(), grad_output.numel(), p_, seed_, last_stream_);
  return grad_input;
}

// ---- CausalSelfAttention ----------------------------------------------------------------------

CausalSelfAttention::CausalSelfAttention(std::int64_t d_model, std::int64_t n_head, DType dtype,
                                         double dropout, std::uint64_t dropout_seed)
    : Module("CausalSelfAttention"), d_model_(d_model), n_head_(n_head) {
  ZT_CHECK(n_head > 0 && d_model > 0 && d_model % n_head == 0, "CausalSelfAttention: d_model ", d_model,
           " must be a positive multiple of n_head ", n_head);
  qkv_ = &register_module("qkv", std::make_unique<Linear>(d_model, 3 * d_model, true, dtype));
  proj_ = &register_module("proj", std::make_unique<Linear>(d_model, d_model, true, dtype));
  dropout_ = &register_module("dropout", std::make_unique<Dropout>(dropout, dropout_seed));
}

Tensor CausalSelfAttention::forward(const Tensor& input) {
  check_input(*this, "input", input, input.dtype(), d_model_);
  ZT_CHECK(input.ndim() == 3, "CausalSelfAttention '", name(), "': input ", input.description(),
           ", expected [batch, T, ", d_model_, "]");
  const kernels::AttentionShape shape{input.size(0), input.size(1), n_head_, d_model_ / n_head_};
  Tensor qkv = qkv_->run_forward(input);
  saved_probabilities_ =
      Tensor::empty({shape.batch, n_head_, shape.seq_len, shape.seq_len}, kernels::stat_dtype(input.dtype()),
                    input.device(), MemoryCategory::activations);
  Tensor attended = activation_tensor(input.shape(), input);
  kernels::attention_forward(default_stream(input.device()), input.dtype(), qkv.raw_data(),
                             attended.raw_data(), saved_probabilities_.raw_data(), shape);
  saved_qkv_ = qkv;
  return dropout_->run_forward(proj_->run_forward(attended));
}

Tensor CausalSelfAttention::backward(const Tensor& grad_output) {
  ZT_CHECK(saved_qkv_.defined(), "backward of CausalSelfAttention '", name(), "' before its forward");
  const Tensor grad_attended = proj_->run_backward(dropout_->run_backward(grad_output));
  const kernels::AttentionShape shape{saved_qkv_.size(0), saved_qkv_.size(1), n_head_, d_model_ / n_head_};
  Tensor grad_qkv = activation_tensor(saved_qkv_.shape(), saved_qkv_);
  kernels::attention_backward(default_stream(grad_output.device()), grad_output.dtype(),
                              grad_attended.raw_data(), saved_qkv_.raw_data(),
                              saved_probabilities_.raw_data(), grad_qkv.raw_data(), shape);
  return qkv_->run_backward(grad_qkv);
}

// ---- MLPBlock ---------------------------------------------------------------------------------

MLPBlock::MLPBlock(std::int64_t d_model, DType dtype, double dropout, std::uint64_t dropout_seed)
    : Module("MLPBlock") {
  fc_ = &register_module("fc", std::make_unique<Linear>(d_model, 4 * d_model, true, dtype));
  gelu_ = &register_module("gelu", std::make_unique<GELU>());
  proj_ = &register_module("proj", std::make_unique<Linear>(4 * d_model, d_model, true, dtype));
  dropout_ = &register_module("dropout", std::make_unique<Dropout>(dropout, dropout_seed));
}

Tensor MLPBlock::forward(const Tensor& input) {
  return dropout_->run_forward(proj_->run_forward(gelu_->run_forward(fc_->run_forward(input))));
}

Tensor MLPBlock::backward(const Tensor& grad_output) {
  return fc_->run_backward(gelu_->run_backward(proj_->run_backward(dropout_->run_backward(grad_output))));
}

// ---- TransformerBlock -------------------------------------------------------------------------

TransformerBlock::TransformerBlock(std::int64_t d_model, std::int64_t n_head, DType dtype, double dropout,
                                   std::uint64_t dropout_seed)
    : Module("TransformerBlock") {
  ln1_ = &register_module("ln1", std::make_unique<LayerNorm>(d_model, dtype));
  attn_ = &register_module(
      "attn", std::make_unique<CausalSelfAttention>(d_model, n_head, dtype, dropout, dropout_seed));
  ln2_ = &register_module("ln2", std::make_unique<LayerNorm>(d_model, dtype));
  mlp_ = &register_module("mlp", std::make_unique<MLPBlock>(d_model, dtype, dropout, dropout_seed + 1));
}

Tensor TransformerBlock::forward(const Tensor& input) {
  const Tensor attended = attn_->run_forward(ln1_->run_forward(input));
  Tensor residual = activation_tensor(input.shape(), input);
  kernels::add(default_stream(input.device()), input.dtype(), input.raw_data(), attended.raw_data(),
               residual.raw_data(), input.numel());
  const Tensor transformed = mlp_->run_forward(ln2_->run_forward(residual));
  Tensor output = activation_tensor(input.shape(), input);
  kernels::add(default_stream(input.device()), input.dtype(), residual.raw_data(), transformed.raw_data(),
               output.raw_data(), input.numel());
  return output;
}

Tensor TransformerBlock::backward(const Tensor& grad_output) {
  // Each residual branch adds its gradient to the one that skips it. LayerNorm returns a fresh
  // tensor, so accumulating into it is safe.
  Tensor grad_residual = ln2_->run_backward(mlp_->run_backward(grad_output));
  kernels::accumulate(default_stream(grad_output.device()), grad_output.dtype(), grad_residual.raw_data(),
                      grad_output.raw_data(), grad_output.numel());
  Tensor grad_input = ln1_->run_backward(attn_->run_backward(grad_residual));
  kernels::accumulate(default_stream(grad_output.device()), grad_output.dtype(), grad_input.raw_data(),
                      grad_residual.raw_data(), grad_output.numel());
  return grad_input;
}

// ---- LmHead -----------------------------------------------------------------------------------

LmHead::LmHead(Parameter& embedding_weight) : Module("LmHead"), weight_(&embedding_weight), tied_(true) {}

LmHead::LmHead(std::int64_t d_model, std::int64_t vocab_size, DType dtype) : Module("LmHead"), tied_(false) {
  weight_ = &register_parameter(
      "weight", Tensor::zeros({vocab_size, d_model}, dtype, Device::host(), MemoryCategory::parameters));
}

std::vector<Parameter*> LmHead::borrowed_parameters() {
  if (tied_) return {weight_};
  return {};
}

Tensor LmHead::forward(const Tensor& input) {
  const Tensor& weight = weight_->value;
  ZT_CHECK(weight.ndim() == 2, "LmHead '", name(), "': weight '", weight_->name, "' is ",
           weight.description(), ", expected [vocab, d_model]");
  const std::int64_t vocab = weight.size(0), d_model = weight.size(1);
  check_input(*this, "input", input, weight.dtype(), d_model);
  Shape output_shape = input.shape();
  output_shape.back() = vocab;
  Tensor logits = activation_tensor(output_shape, input);
  kernels::matmul_forward(default_stream(input.device()), input.dtype(), input.raw_data(), weight.raw_data(),
                          nullptr, logits.raw_data(), {input.numel() / d_model, d_model, vocab});
  saved_input_ = input;
  return logits;
}

Tensor LmHead::backward(const Tensor& grad_output) {
  ZT_CHECK(saved_input_.defined(), "backward of LmHead '", name(), "' before its forward");
  const Tensor& weight = weight_->value;
  const std::int64_t vocab = weight.size(0), d_model = weight.size(1);
  check_input(*this, "grad_output", grad_output, weight.dtype(), vocab);
  Tensor grad_input = activation_tensor(saved_input_.shape(), saved_input_);
  kernels::matmul_backward(default_stream(grad_output.device()), grad_output.dtype(), grad_output.raw_data(),
                           saved_input_.raw_data(), weight.raw_data(), grad_input.raw_data(),
                           grad_pointer(*weight_), nullptr, {saved_input_.numel() / d_model, d_model, vocab});
  return grad_input;
}

}  // namespace zt::nn
