// The layers: thin wrappers that check shapes, allocate outputs on the run context's device and call
// the kernels on its compute stream.
#include <cmath>

#include "kernels/nn_kernels.hpp"
#include "src/nn/nn_checks.hpp"
#include "zerotrain/nn.hpp"

namespace zt::nn {

using detail::activation_tensor;
using detail::check_input;
using detail::grad_pointer;
using detail::value_of;

namespace {
const Stream& stream_of(const RunContext& context) {
  return context.exec().compute();
}
}  // namespace

// ---- Sequential -------------------------------------------------------------------------------

Tensor Sequential::forward(const Tensor& input, const RunContext& context) {
  Tensor x = input;
  for (Module* child : children()) x = child->run_forward(x, context);
  return x;
}

Tensor Sequential::backward(const Tensor& grad_output, const RunContext& context) {
  Tensor grad = grad_output;
  const std::vector<Module*> layers = children();
  for (auto it = layers.rbegin(); it != layers.rend(); ++it) grad = (*it)->run_backward(grad, context);
  return grad;
}

// ---- Linear -----------------------------------------------------------------------------------

Linear::Linear(std::int64_t in_features, std::int64_t out_features, bool bias, DType dtype, Device device)
    : Module("Linear"), in_features_(in_features), out_features_(out_features) {
  ZT_CHECK(in_features > 0 && out_features > 0, "Linear(", in_features, ", ", out_features,
           "): expected positive feature counts");
  weight_ = &register_parameter(
      "weight", Tensor::zeros({out_features, in_features}, dtype, device, MemoryCategory::parameters));
  if (bias) {
    bias_ =
        &register_parameter("bias", Tensor::zeros({out_features}, dtype, device, MemoryCategory::parameters));
  }
}

Tensor Linear::forward(const Tensor& input, const RunContext& context) {
  const Tensor& weight = value_of(*this, *weight_, context);
  check_input(*this, "input", input, weight.dtype(), in_features_, context);
  Shape output_shape = input.shape();
  output_shape.back() = out_features_;
  Tensor output = activation_tensor(output_shape, input, context);
  const kernels::MatmulShape shape{input.numel() / in_features_, in_features_, out_features_};
  kernels::matmul_forward(stream_of(context), input.dtype(), input.raw_data(), weight.raw_data(),
                          bias_ != nullptr ? value_of(*this, *bias_, context).raw_data() : nullptr,
                          output.raw_data(), shape);
  if (saves_for_backward(context)) saved_input_.save(context, input);
  return output;
}

Tensor Linear::backward(const Tensor& grad_output, const RunContext& context) {
  const Tensor input = saved_input_.take(context);
  check_input(*this, "grad_output", grad_output, input.dtype(), out_features_, context);
  ZT_CHECK(grad_output.numel() / out_features_ == input.numel() / in_features_, "Linear '", name(),
           "': grad_output ", grad_output.description(), " does not match the forward input ",
           input.description());
  Tensor grad_input = activation_tensor(input.shape(), input, context);
  const kernels::MatmulShape shape{input.numel() / in_features_, in_features_, out_features_};
  kernels::matmul_backward(stream_of(context), grad_output.dtype(), grad_output.raw_data(), input.raw_data(),
                           value_of(*this, *weight_, context).raw_data(), grad_input.raw_data(), nullptr,
                           bias_ != nullptr ? grad_pointer(*this, *bias_, context) : nullptr, shape);
  detail::accumulate_gradient_rows(
      *this, *weight_, context, out_features_, [&](std::int64_t first, std::int64_t count, void* rows) {
        kernels::matmul_weight_grad_rows(stream_of(context), grad_output.dtype(), grad_output.raw_data(),
                                         input.raw_data(), rows, shape, first, count);
      });
  return grad_input;
}

// ---- Embedding --------------------------------------------------------------------------------

Embedding::Embedding(std::int64_t num_embeddings, std::int64_t dim, DType dtype, Device device)
    : Module("Embedding"), num_embeddings_(num_embeddings), dim_(dim) {
  ZT_CHECK(num_embeddings > 0 && dim > 0, "Embedding(", num_embeddings, ", ", dim,
           "): expected positive sizes");
  weight_ = &register_parameter(
      "weight", Tensor::zeros({num_embeddings, dim}, dtype, device, MemoryCategory::parameters));
}

Tensor Embedding::forward(const Tensor& tokens, const RunContext& context) {
  ZT_CHECK(tokens.defined() && tokens.dtype() == DType::int32, "Embedding '", name(),
           "': expected int32 token indices, got ", tokens.description());
  detail::check_on_device(*this, "tokens", tokens, context);
  Shape output_shape = tokens.shape();
  output_shape.push_back(dim_);
  const Tensor& table = value_of(*this, *weight_, context);
  Tensor output = context.exec().empty(output_shape, table.dtype(), MemoryCategory::activations);
  // [batch, T] for error messages that name the position of a bad token; any rank works.
  const std::int64_t positions = tokens.ndim() == 0 ? 1 : tokens.size(-1);
  const kernels::EmbeddingShape shape{positions == 0 ? 0 : tokens.numel() / positions, positions,
                                      num_embeddings_, dim_};
  kernels::embedding_forward(stream_of(context), table.dtype(), tokens.data<std::int32_t>(), table.raw_data(),
                             nullptr, output.raw_data(), shape);
  if (saves_for_backward(context)) saved_tokens_.save(context, tokens);
  return output;
}

Tensor Embedding::backward(const Tensor& grad_output, const RunContext& context) {
  const Tensor tokens = saved_tokens_.take(context);
  check_input(*this, "grad_output", grad_output, weight_->value.dtype(), dim_, context);
  ZT_CHECK(grad_output.numel() == tokens.numel() * dim_, "Embedding '", name(), "': grad_output ",
           grad_output.description(), " does not match the tokens ", tokens.description());
  const kernels::EmbeddingShape shape{tokens.numel(), 1, num_embeddings_, dim_};  // positions unused
  if (weight_->gradient_sink == nullptr || weight_->grad.defined()) {
    kernels::embedding_backward(stream_of(context), grad_output.dtype(), tokens.data<std::int32_t>(),
                                grad_output.raw_data(), grad_pointer(*this, *weight_, context), nullptr,
                                shape);
    return {};
  }
  detail::accumulate_gradient_rows(
      *this, *weight_, context, num_embeddings_, [&](std::int64_t first, std::int64_t count, void* rows) {
        kernels::embedding_backward_rows(stream_of(context), grad_output.dtype(), tokens.data<std::int32_t>(),
                                         grad_output.raw_data(), rows, shape, first, count);
      });
  return {};
}

// ---- PositionalEmbedding ----------------------------------------------------------------------

PositionalEmbedding::PositionalEmbedding(std::int64_t max_positions, std::int64_t dim, DType dtype,
                                         Device device)
    : Module("PositionalEmbedding"), max_positions_(max_positions), dim_(dim) {
  ZT_CHECK(max_positions > 0 && dim > 0, "PositionalEmbedding(", max_positions, ", ", dim,
           "): expected positive sizes");
  weight_ = &register_parameter(
      "weight", Tensor::zeros({max_positions, dim}, dtype, device, MemoryCategory::parameters));
}

Tensor PositionalEmbedding::forward(const Tensor& input, const RunContext& context) {
  const Tensor& weight = value_of(*this, *weight_, context);
  check_input(*this, "input", input, weight.dtype(), dim_, context);
  ZT_CHECK(input.ndim() == 3 && input.size(1) <= max_positions_, "PositionalEmbedding '", name(), "': input ",
           input.description(), ", expected [batch, T, ", dim_, "] with T <= ", max_positions_);
  const std::int64_t batch = input.size(0), row_elements = input.size(1) * dim_;
  Tensor output = activation_tensor(input.shape(), input, context);
  const Tensor positions = weight.flat_slice(0, row_elements);
  for (std::int64_t b = 0; b < batch; ++b) {
    kernels::add(stream_of(context), input.dtype(),
                 input.flat_slice(b * row_elements, row_elements).raw_data(), positions.raw_data(),
                 output.flat_slice(b * row_elements, row_elements).raw_data(), row_elements);
  }
  return output;
}

Tensor PositionalEmbedding::backward(const Tensor& grad_output, const RunContext& context) {
  check_input(*this, "grad_output", grad_output, weight_->value.dtype(), dim_, context);
  ZT_CHECK(grad_output.ndim() == 3 && grad_output.size(1) <= max_positions_, "PositionalEmbedding '", name(),
           "': grad_output ", grad_output.description(), ", expected [batch, T, ", dim_, "]");
  if (void* grad = grad_pointer(*this, *weight_, context); grad != nullptr) {
    const std::int64_t batch = grad_output.size(0), row_elements = grad_output.size(1) * dim_;
    // Batches one after another: a fixed summation order.
    for (std::int64_t b = 0; b < batch; ++b) {
      kernels::accumulate(stream_of(context), grad_output.dtype(), grad,
                          grad_output.flat_slice(b * row_elements, row_elements).raw_data(), row_elements);
    }
  }
  return grad_output;  // x + positions: the input gradient is the output gradient
}

// ---- LayerNorm --------------------------------------------------------------------------------

LayerNorm::LayerNorm(std::int64_t dim, DType dtype, double eps, Device device)
    : Module("LayerNorm"), dim_(dim), eps_(eps) {
  ZT_CHECK(dim > 0 && eps > 0, "LayerNorm(", dim, ", eps ", eps, "): expected a positive size and eps");
  weight_ = &register_parameter("weight", Tensor::empty({dim}, dtype, device, MemoryCategory::parameters));
  weight_->value.fill_(1.0);
  bias_ = &register_parameter("bias", Tensor::zeros({dim}, dtype, device, MemoryCategory::parameters));
}

Tensor LayerNorm::forward(const Tensor& input, const RunContext& context) {
  const Tensor& weight = value_of(*this, *weight_, context);
  check_input(*this, "input", input, weight.dtype(), dim_, context);
  const std::int64_t rows = input.numel() / dim_;
  Tensor output = activation_tensor(input.shape(), input, context);
  const DType stats = kernels::stat_dtype(input.dtype());
  Saved saved{input, context.exec().empty({rows}, stats, MemoryCategory::activations),
              context.exec().empty({rows}, stats, MemoryCategory::activations)};
  kernels::layernorm_forward(stream_of(context), input.dtype(), input.raw_data(), weight.raw_data(),
                             value_of(*this, *bias_, context).raw_data(), output.raw_data(),
                             saved.mean.raw_data(), saved.rstd.raw_data(), rows, dim_, eps_);
  if (saves_for_backward(context)) saved_.save(context, std::move(saved));
  return output;
}

Tensor LayerNorm::backward(const Tensor& grad_output, const RunContext& context) {
  const Saved saved = saved_.take(context);
  check_input(*this, "grad_output", grad_output, saved.input.dtype(), dim_, context);
  ZT_CHECK(grad_output.numel() == saved.input.numel(), "LayerNorm '", name(), "': grad_output ",
           grad_output.description(), " does not match the forward input ", saved.input.description());
  Tensor grad_input = activation_tensor(saved.input.shape(), saved.input, context);
  kernels::layernorm_backward(stream_of(context), grad_output.dtype(), grad_output.raw_data(),
                              saved.input.raw_data(), value_of(*this, *weight_, context).raw_data(),
                              saved.mean.raw_data(), saved.rstd.raw_data(), grad_input.raw_data(),
                              grad_pointer(*this, *weight_, context), grad_pointer(*this, *bias_, context),
                              saved.input.numel() / dim_, dim_);
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

Tensor Activation::forward(const Tensor& input, const RunContext& context) {
  check_input(*this, "input", input, input.dtype(), -1, context);
  Tensor output = activation_tensor(input.shape(), input, context);
  kernels::activation_forward(stream_of(context), input.dtype(), kernel_activation(kind_), input.raw_data(),
                              output.raw_data(), input.numel());
  if (saves_for_backward(context)) saved_input_.save(context, input);
  return output;
}

Tensor Activation::backward(const Tensor& grad_output, const RunContext& context) {
  const Tensor input = saved_input_.take(context);
  check_input(*this, "grad_output", grad_output, input.dtype(), -1, context);
  ZT_CHECK(grad_output.numel() == input.numel(), activation_name(kind_), " '", name(), "': grad_output ",
           grad_output.description(), " does not match the forward input ", input.description());
  Tensor grad_input = activation_tensor(input.shape(), input, context);
  kernels::activation_backward(stream_of(context), grad_output.dtype(), kernel_activation(kind_),
                               input.raw_data(), grad_output.raw_data(), grad_input.raw_data(),
                               grad_output.numel());
  return grad_input;
}

// ---- Dropout ----------------------------------------------------------------------------------

Dropout::Dropout(double p, std::uint64_t seed) : Module("Dropout"), p_(p), seed_(seed) {
  ZT_CHECK(p >= 0 && p < 1, "Dropout probability must lie in [0, 1), got ", p);
}

Tensor Dropout::forward(const Tensor& input, const RunContext& context) {
  Mask mask;
  mask.identity = !training() || p_ == 0;
  Tensor output = input;
  if (!mask.identity) {
    check_input(*this, "input", input, input.dtype(), -1, context);
    mask.stream = next_stream_++;
    output = activation_tensor(input.shape(), input, context);
    kernels::dropout_forward(stream_of(context), input.dtype(), input.raw_data(), output.raw_data(),
                             input.numel(), p_, seed_, mask.stream);
  }
  if (saves_for_backward(context)) saved_mask_.save(context, mask);
  return output;
}

Tensor Dropout::backward(const Tensor& grad_output, const RunContext& context) {
  const Mask mask = saved_mask_.take(context);
  if (mask.identity) return grad_output;
  check_input(*this, "grad_output", grad_output, grad_output.dtype(), -1, context);
  Tensor grad_input = activation_tensor(grad_output.shape(), grad_output, context);
  kernels::dropout_backward(stream_of(context), grad_output.dtype(), grad_output.raw_data(),
                            grad_input.raw_data(), grad_output.numel(), p_, seed_, mask.stream);
  return grad_input;
}

// ---- CausalSelfAttention ----------------------------------------------------------------------

CausalSelfAttention::CausalSelfAttention(std::int64_t d_model, std::int64_t n_head, DType dtype,
                                         double dropout, std::uint64_t dropout_seed, Device device)
    : Module("CausalSelfAttention"), d_model_(d_model), n_head_(n_head) {
  ZT_CHECK(n_head > 0 && d_model > 0 && d_model % n_head == 0, "CausalSelfAttention: d_model ", d_model,
           " must be a positive multiple of n_head ", n_head);
  qkv_ = &register_module("qkv", std::make_unique<Linear>(d_model, 3 * d_model, true, dtype, device));
  proj_ = &register_module("proj", std::make_unique<Linear>(d_model, d_model, true, dtype, device));
  dropout_ = &register_module("dropout", std::make_unique<Dropout>(dropout, dropout_seed));
}

Tensor CausalSelfAttention::forward(const Tensor& input, const RunContext& context) {
  check_input(*this, "input", input, input.dtype(), d_model_, context);
  ZT_CHECK(input.ndim() == 3, "CausalSelfAttention '", name(), "': input ", input.description(),
           ", expected [batch, T, ", d_model_, "]");
  const kernels::AttentionShape shape{input.size(0), input.size(1), n_head_, d_model_ / n_head_};
  // The rows' log-sum-exps, not the [B, H, T, T] probabilities: the backward recomputes those.
  Saved saved{qkv_->run_forward(input, context), activation_tensor(input.shape(), input, context),
              context.exec().empty({shape.batch, n_head_, shape.seq_len}, kernels::stat_dtype(input.dtype()),
                                   MemoryCategory::activations)};
  kernels::attention_forward(stream_of(context), input.dtype(), saved.qkv.raw_data(),
                             saved.attended.raw_data(), saved.row_logsumexp.raw_data(), shape);
  const Tensor attended = saved.attended;  // also proj's saved input: one tensor, held twice
  if (saves_for_backward(context)) saved_.save(context, std::move(saved));
  return dropout_->run_forward(proj_->run_forward(attended, context), context);
}

Tensor CausalSelfAttention::backward(const Tensor& grad_output, const RunContext& context) {
  const Saved saved = saved_.take(context);
  const Tensor grad_attended = proj_->run_backward(dropout_->run_backward(grad_output, context), context);
  const kernels::AttentionShape shape{saved.qkv.size(0), saved.qkv.size(1), n_head_, d_model_ / n_head_};
  Tensor grad_qkv = activation_tensor(saved.qkv.shape(), saved.qkv, context);
  kernels::attention_backward(stream_of(context), grad_output.dtype(), grad_attended.raw_data(),
                              saved.qkv.raw_data(), saved.attended.raw_data(), saved.row_logsumexp.raw_data(),
                              grad_qkv.raw_data(), shape);
  return qkv_->run_backward(grad_qkv, context);
}

// ---- MLPBlock ---------------------------------------------------------------------------------

MLPBlock::MLPBlock(std::int64_t d_model, DType dtype, double dropout, std::uint64_t dropout_seed,
                   Device device)
    : Module("MLPBlock") {
  fc_ = &register_module("fc", std::make_unique<Linear>(d_model, 4 * d_model, true, dtype, device));
  gelu_ = &register_module("gelu", std::make_unique<GELU>());
  proj_ = &register_module("proj", std::make_unique<Linear>(4 * d_model, d_model, true, dtype, device));
  dropout_ = &register_module("dropout", std::make_unique<Dropout>(dropout, dropout_seed));
}

Tensor MLPBlock::forward(const Tensor& input, const RunContext& context) {
  const Tensor hidden = gelu_->run_forward(fc_->run_forward(input, context), context);
  return dropout_->run_forward(proj_->run_forward(hidden, context), context);
}

Tensor MLPBlock::backward(const Tensor& grad_output, const RunContext& context) {
  const Tensor grad_hidden = proj_->run_backward(dropout_->run_backward(grad_output, context), context);
  return fc_->run_backward(gelu_->run_backward(grad_hidden, context), context);
}

// ---- TransformerBlock -------------------------------------------------------------------------

TransformerBlock::TransformerBlock(std::int64_t d_model, std::int64_t n_head, DType dtype, double dropout,
                                   std::uint64_t dropout_seed, Device device)
    : Module("TransformerBlock") {
  ln1_ = &register_module("ln1", std::make_unique<LayerNorm>(d_model, dtype, 1e-5, device));
  attn_ = &register_module(
      "attn", std::make_unique<CausalSelfAttention>(d_model, n_head, dtype, dropout, dropout_seed, device));
  ln2_ = &register_module("ln2", std::make_unique<LayerNorm>(d_model, dtype, 1e-5, device));
  mlp_ =
      &register_module("mlp", std::make_unique<MLPBlock>(d_model, dtype, dropout, dropout_seed + 1, device));
}

Tensor TransformerBlock::forward(const Tensor& input, const RunContext& context) {
  const Tensor attended = attn_->run_forward(ln1_->run_forward(input, context), context);
  Tensor residual = activation_tensor(input.shape(), input, context);
  kernels::add(stream_of(context), input.dtype(), input.raw_data(), attended.raw_data(), residual.raw_data(),
               input.numel());
  const Tensor transformed = mlp_->run_forward(ln2_->run_forward(residual, context), context);
  Tensor output = activation_tensor(input.shape(), input, context);
  kernels::add(stream_of(context), input.dtype(), residual.raw_data(), transformed.raw_data(),
               output.raw_data(), input.numel());
  return output;
}

Tensor TransformerBlock::backward(const Tensor& grad_output, const RunContext& context) {
  // Each residual branch adds its gradient to the one that skips it. LayerNorm returns a fresh
  // tensor, so accumulating into it is safe.
  Tensor grad_residual = ln2_->run_backward(mlp_->run_backward(grad_output, context), context);
  kernels::accumulate(stream_of(context), grad_output.dtype(), grad_residual.raw_data(),
                      grad_output.raw_data(), grad_output.numel());
  Tensor grad_input = ln1_->run_backward(attn_->run_backward(grad_residual, context), context);
  kernels::accumulate(stream_of(context), grad_output.dtype(), grad_input.raw_data(),
                      grad_residual.raw_data(), grad_output.numel());
  return grad_input;
}

// ---- LmHead -----------------------------------------------------------------------------------

LmHead::LmHead(Parameter& embedding_weight) : Module("LmHead"), weight_(&embedding_weight), tied_(true) {}

LmHead::LmHead(std::int64_t d_model, std::int64_t vocab_size, DType dtype, Device device)
    : Module("LmHead"), tied_(false) {
  weight_ = &register_parameter(
      "weight", Tensor::zeros({vocab_size, d_model}, dtype, device, MemoryCategory::parameters));
}

std::vector<Parameter*> LmHead::borrowed_parameters() {
  if (tied_) return {weight_};
  return {};
}

Tensor LmHead::forward(const Tensor& input, const RunContext& context) {
  const Tensor& weight = value_of(*this, *weight_, context);
  ZT_CHECK(weight.ndim() == 2, "LmHead '", name(), "': weight '", weight_->name, "' is ",
           weight.description(), ", expected [vocab, d_model]");
  const std::int64_t vocab = weight.size(0), d_model = weight.size(1);
  check_input(*this, "input", input, weight.dtype(), d_model, context);
  Shape output_shape = input.shape();
  output_shape.back() = vocab;
  Tensor logits = activation_tensor(output_shape, input, context);
  kernels::matmul_forward(stream_of(context), input.dtype(), input.raw_data(), weight.raw_data(), nullptr,
                          logits.raw_data(), {input.numel() / d_model, d_model, vocab});
  if (saves_for_backward(context)) saved_input_.save(context, input);
  return logits;
}

Tensor LmHead::backward(const Tensor& grad_output, const RunContext& context) {
  const Tensor input = saved_input_.take(context);
  const Tensor& weight = value_of(*this, *weight_, context);
  const std::int64_t vocab = weight.size(0), d_model = weight.size(1);
  check_input(*this, "grad_output", grad_output, weight.dtype(), vocab, context);
  Tensor grad_input = activation_tensor(input.shape(), input, context);
  const kernels::MatmulShape shape{input.numel() / d_model, d_model, vocab};
  kernels::matmul_backward(stream_of(context), grad_output.dtype(), grad_output.raw_data(), input.raw_data(),
                           weight.raw_data(), grad_input.raw_data(), nullptr, nullptr, shape);
  detail::accumulate_gradient_rows(
      *this, *weight_, context, vocab, [&](std::int64_t first, std::int64_t count, void* rows) {
        kernels::matmul_weight_grad_rows(stream_of(context), grad_output.dtype(), grad_output.raw_data(),
                                         input.raw_data(), rows, shape, first, count);
      });
  return grad_input;
}

}  // namespace zt::nn
