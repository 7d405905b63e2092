// Optimizer base (buffers, state, step count), Adam/AdamW, SGD and the factory.
#include "zerotrain/optimizer.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>
#include <utility>

#include "kernels/optimizer_kernels.hpp"
#include "zerotrain/error.hpp"

namespace zt {
namespace {

std::string lowercase(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

void check_grad_dtype(DType dtype, std::size_t buffer) {
  ZT_CHECK(dtype == DType::fp32 || dtype == DType::bf16 || dtype == DType::fp16, "gradient of buffer ",
           buffer, " has dtype ", dtype_name(dtype), "; expected fp32, bf16 or fp16");
}

}  // namespace

// ---- Optimizer -----------------------------------------------------------------------------------

Optimizer::Optimizer(std::vector<ParamBuffer> params, const OptimizerParams& hyperparameters, Device device)
    : params_(std::move(params)), params_hp_(hyperparameters), device_(device) {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    ZT_CHECK(params_[i].data != nullptr || params_[i].count == 0, "parameter buffer ", i, " is null with ",
             params_[i].count, " elements; expected a buffer of fp32 master weights");
  }
}

ParamBuffer Optimizer::params(std::size_t buffer) const {
  ZT_CHECK(buffer < params_.size(), "parameter buffer ", buffer, " requested; the optimizer has ",
           params_.size());
  return params_[buffer];
}

void Optimizer::add_state(std::string name) {
  StateSlot slot{std::move(name), {}};
  slot.buffers.reserve(params_.size());
  for (const ParamBuffer& p : params_) {
    Buffer buffer(device_, p.count * sizeof(float), MemoryCategory::optimizer_states);
    // torch: zeros_like(param). Synchronously: the steps may run on another stream of the device.
    zero_bytes(buffer.data(), device_, buffer.size());
    slot.buffers.push_back(std::move(buffer));
  }
  states_.push_back(std::move(slot));
}

std::size_t Optimizer::slot_index(std::string_view name) const {
  for (std::size_t i = 0; i < states_.size(); ++i) {
    if (states_[i].name == name) return i;
  }
  std::string known;
  for (const StateSlot& slot : states_) known += (known.empty() ? "" : ", ") + slot.name;
  ZT_THROW("optimizer '", this->name(), "' has no state named '", name,
           "'; it has: ", known.empty() ? std::string("none") : known);
}

std::vector<std::string_view> Optimizer::state_names() const {
  std::vector<std::string_view> names;
  for (const StateSlot& slot : states_) names.emplace_back(slot.name);
  return names;
}

std::span<float> Optimizer::state(std::string_view name, std::size_t buffer) {
  const std::size_t slot = slot_index(name);
  ZT_CHECK(buffer < params_.size(), "state '", name, "' of buffer ", buffer, " requested; the optimizer has ",
           params_.size(), " buffers",
           params_.empty() ? " (its state is stored by the caller, e.g. swapped to NVMe)" : "");
  return {states_[slot].buffers[buffer].as<float>(), params_[buffer].count};
}

std::span<const float> Optimizer::state(std::string_view name, std::size_t buffer) const {
  return const_cast<Optimizer*>(this)->state(name, buffer);
}

void Optimizer::set_step_count(std::int64_t steps) {
  ZT_CHECK(steps >= 0, "step count ", steps, " is negative; expected the number of updates applied (>= 0)");
  step_count_ = steps;
}

void Optimizer::set_hyperparameters(const OptimizerParams& hyperparameters) {
  validate(hyperparameters);
  params_hp_ = hyperparameters;
}

void Optimizer::check_step_arguments(float grad_scale, float lr) const {
  ZT_CHECK(std::isfinite(lr) && lr >= 0.0f, "learning rate ", lr,
           " passed to step; expected a finite value >= 0");
  ZT_CHECK(
      std::isfinite(grad_scale), "grad_scale ", grad_scale,
      " is not finite; expected 1/loss_scale times the clip coefficient (skip overflowed steps instead)");
}

void Optimizer::check_range_arguments(std::size_t index, std::size_t count, GradBuffer grad,
                                      HalfParamBuffer params_16bit) const {
  check_grad_dtype(grad.dtype, index);
  ZT_CHECK(grad.data != nullptr || count == 0, "gradient buffer ", index, " is null; expected ", count,
           " elements");
  if (params_16bit.data != nullptr) {
    ZT_CHECK(params_16bit.dtype == DType::bf16 || params_16bit.dtype == DType::fp16,
             "16-bit parameter buffer ", index, " has dtype ", dtype_name(params_16bit.dtype),
             "; expected bf16 or fp16");
  }
}

const Stream& Optimizer::stream_or_default(const Stream* stream) const {
  if (stream == nullptr) return default_stream(device_);
  ZT_CHECK(stream->device() == device_, "optimizer '", name(), "' on ", device_.str(), " got a stream of ",
           stream->device().str(), "; expected a stream of the optimizer's device");
  return *stream;
}

void Optimizer::step(std::span<const GradBuffer> grads, float grad_scale, float lr,
                     std::span<const HalfParamBuffer> params_16bit, const Stream* stream) {
  ZT_CHECK(grads.size() == params_.size(), "step got ", grads.size(),
           " gradient buffers; expected one per parameter buffer (", params_.size(), ")");
  ZT_CHECK(params_16bit.empty() || params_16bit.size() == params_.size(), "step got ", params_16bit.size(),
           " 16-bit parameter buffers; expected none or one per parameter buffer (", params_.size(), ")");
  check_step_arguments(grad_scale, lr);
  for (std::size_t i = 0; i < grads.size(); ++i) {
    check_range_arguments(i, params_[i].count, grads[i],
                          params_16bit.empty() ? HalfParamBuffer{} : params_16bit[i]);
  }
  const Stream& ordered_on = stream_or_default(stream);
  ++step_count_;
  std::vector<float*> state(states_.size());
  for (std::size_t i = 0; i < grads.size(); ++i) {
    for (std::size_t slot = 0; slot < states_.size(); ++slot)
      state[slot] = states_[slot].buffers[i].as<float>();
    update(params_[i], state, grads[i], grad_scale, lr,
           params_16bit.empty() ? HalfParamBuffer{} : params_16bit[i], ordered_on);
  }
}

void Optimizer::begin_step(float grad_scale, float lr) {
  check_step_arguments(grad_scale, lr);
  ++step_count_;
}

void Optimizer::update_range(ParamBuffer params, std::span<float* const> state, GradBuffer grad,
                             float grad_scale, float lr, HalfParamBuffer params_16bit, const Stream* stream) {
  ZT_CHECK(step_count_ > 0, "update_range before begin_step(); call begin_step() once per step first");
  ZT_CHECK(state.size() == states_.size(), "update_range got ", state.size(), " state arrays; optimizer '",
           name(), "' needs ", states_.size(), " (state_names() order)");
  ZT_CHECK(params.data != nullptr || params.count == 0, "update_range: the master weights are null for ",
           params.count, " elements");
  for (float* array : state) {
    ZT_CHECK(array != nullptr || params.count == 0, "update_range: a state array is null for ", params.count,
             " elements");
  }
  check_range_arguments(0, params.count, grad, params_16bit);
  update(params, state, grad, grad_scale, lr, params_16bit, stream_or_default(stream));
}

void Optimizer::step(GradBuffer grad, float grad_scale, float lr, HalfParamBuffer params_16bit,
                     const Stream* stream) {
  ZT_CHECK(params_.size() == 1, "single-buffer step on an optimizer over ", params_.size(),
           " buffers; expected exactly one (pass one gradient per buffer instead)");
  step(std::span<const GradBuffer>(&grad, 1), grad_scale, lr,
       std::span<const HalfParamBuffer>(&params_16bit, 1), stream);
}

// ---- Adam / AdamW --------------------------------------------------------------------------------

Adam::Adam(std::vector<ParamBuffer> params, const OptimizerParams& hyperparameters, Device device)
    : Optimizer(std::move(params), hyperparameters, device) {
  validate(hyperparameters);
  add_state("exp_avg");
  add_state("exp_avg_sq");
}

void Adam::validate(const OptimizerParams& hp) const {
  ZT_CHECK_AS(ConfigError, std::isfinite(hp.lr) && hp.lr >= 0.0f, "adam: lr = ", hp.lr, "; expected >= 0");
  ZT_CHECK_AS(ConfigError, hp.beta1 >= 0.0f && hp.beta1 < 1.0f, "adam: betas[0] = ", hp.beta1,
              "; expected 0 <= beta1 < 1");
  ZT_CHECK_AS(ConfigError, hp.beta2 >= 0.0f && hp.beta2 < 1.0f, "adam: betas[1] = ", hp.beta2,
              "; expected 0 <= beta2 < 1");
  ZT_CHECK_AS(ConfigError, std::isfinite(hp.eps) && hp.eps >= 0.0f, "adam: eps = ", hp.eps,
              "; expected >= 0");
  ZT_CHECK_AS(ConfigError, std::isfinite(hp.weight_decay) && hp.weight_decay >= 0.0f,
              "adam: weight_decay = ", hp.weight_decay, "; expected >= 0");
}

void Adam::update(ParamBuffer p, std::span<float* const> state, GradBuffer grad, float grad_scale, float lr,
                  HalfParamBuffer params_16bit, const Stream& stream) {
  const OptimizerParams& hp = hyperparameters();
  kernels::AdamStepArgs args;
  args.params = p.data;
  args.exp_avg = state[0];
  args.exp_avg_sq = state[1];
  args.grads = grad.data;
  args.grad_dtype = grad.dtype;
  args.params_16bit = params_16bit.data;
  args.params_16bit_dtype = params_16bit.dtype;
  args.count = p.count;
  args.grad_scale = grad_scale;
  args.lr = lr;
  args.beta1 = hp.beta1;
  args.beta2 = hp.beta2;
  args.eps = hp.eps;
  args.weight_decay = hp.weight_decay;
  args.adam_w_mode = hp.adam_w_mode;
  args.bias_correction = hp.bias_correction;
  args.step = step_count();
  kernels::adam_step(stream, args);
}

// ---- SGD -----------------------------------------------------------------------------------------

Sgd::Sgd(std::vector<ParamBuffer> params, const OptimizerParams& hyperparameters, Device device)
    : Optimizer(std::move(params), hyperparameters, device) {
  has_momentum_buffer_ = hyperparameters.momentum != 0.0f;
  validate(hyperparameters);
  if (has_momentum_buffer_) add_state("momentum_buffer");
}

void Sgd::validate(const OptimizerParams& hp) const {
  ZT_CHECK_AS(ConfigError, std::isfinite(hp.lr) && hp.lr >= 0.0f, "sgd: lr = ", hp.lr, "; expected >= 0");
  ZT_CHECK_AS(ConfigError, std::isfinite(hp.momentum) && hp.momentum >= 0.0f, "sgd: momentum = ", hp.momentum,
              "; expected >= 0");
  ZT_CHECK_AS(ConfigError, std::isfinite(hp.dampening), "sgd: dampening = ", hp.dampening,
              "; expected a number");
  ZT_CHECK_AS(ConfigError, std::isfinite(hp.weight_decay) && hp.weight_decay >= 0.0f,
              "sgd: weight_decay = ", hp.weight_decay, "; expected >= 0");
  ZT_CHECK_AS(ConfigError, !hp.nesterov || (hp.momentum > 0.0f && hp.dampening == 0.0f),
              "sgd: nesterov needs momentum > 0 and dampening 0 (torch's rule); got momentum ", hp.momentum,
              ", dampening ", hp.dampening);
  // The momentum buffer exists only if momentum was on from the start (torch allocates it lazily,
  // but turning momentum on midway would make "first step" ambiguous after a checkpoint).
  ZT_CHECK_AS(ConfigError, (hp.momentum != 0.0f) == has_momentum_buffer_, "sgd: momentum changed from ",
              has_momentum_buffer_ ? "non-zero" : "zero", " to ", hp.momentum,
              " after construction; expected it to stay ", has_momentum_buffer_ ? "non-zero" : "zero");
}

void Sgd::update(ParamBuffer p, std::span<float* const> state, GradBuffer grad, float grad_scale, float lr,
                 HalfParamBuffer params_16bit, const Stream& stream) {
  const OptimizerParams& hp = hyperparameters();
  kernels::SgdStepArgs args;
  args.params = p.data;
  args.momentum_buffer = has_momentum_buffer_ ? state[0] : nullptr;
  args.grads = grad.data;
  args.grad_dtype = grad.dtype;
  args.params_16bit = params_16bit.data;
  args.params_16bit_dtype = params_16bit.dtype;
  args.count = p.count;
  args.grad_scale = grad_scale;
  args.lr = lr;
  args.momentum = has_momentum_buffer_ ? hp.momentum : 0.0f;
  args.dampening = hp.dampening;
  args.weight_decay = hp.weight_decay;
  args.nesterov = hp.nesterov;
  args.first_step = step_count() == 1;  // torch: the buffer does not exist before the first update
  kernels::sgd_step(stream, args);
}

// ---- factory -------------------------------------------------------------------------------------

std::unique_ptr<Optimizer> make_optimizer(std::string_view type, std::vector<ParamBuffer> params,
                                          const OptimizerParams& hyperparameters, Device device) {
  const std::string name = lowercase(type);
  if (name == "adam") return std::make_unique<Adam>(std::move(params), hyperparameters, device);
  if (name == "adamw") {
    OptimizerParams decoupled = hyperparameters;
    decoupled.adam_w_mode = true;  // DeepSpeed: "adamw" is decoupled whatever adam_w_mode says
    return std::make_unique<Adam>(std::move(params), decoupled, device);
  }
  if (name == "sgd") return std::make_unique<Sgd>(std::move(params), hyperparameters, device);
  std::string supported;
  for (std::string_view known : kOptimizerTypes)
    supported += (supported.empty() ? "" : ", ") + std::string(known);
  ZT_THROW_AS(ConfigError, "optimizer type '", type, "' is not supported; expected one of: ", supported,
              " (case-insensitive)");
}

}  // namespace zt
