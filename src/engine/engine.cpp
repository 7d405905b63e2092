// zt::Engine: the training loop's state machine (micro-steps, accumulation boundary, update).
#include "zerotrain/engine.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>

#include "kernels/optimizer_kernels.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/external_model.hpp"
#include "zerotrain/runtime.hpp"

namespace zt {
namespace {

/// Parameter starts are aligned to this many elements (64 bytes of fp32) so that kernels on a
/// parameter and partitions of the flat buffer start on a SIMD / cache-line boundary.
constexpr std::int64_t kFlatAlignment = 16;

std::int64_t round_up(std::int64_t value, std::int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

OptimizerParams optimizer_params_of(const OptimizerConfig& config) {
  OptimizerParams params;
  params.lr = static_cast<float>(config.lr);
  params.beta1 = static_cast<float>(config.betas[0]);
  params.beta2 = static_cast<float>(config.betas[1]);
  params.eps = static_cast<float>(config.eps);
  params.weight_decay = static_cast<float>(config.weight_decay);
  params.adam_w_mode = config.decoupled_weight_decay();
  params.bias_correction = config.bias_correction;
  params.momentum = static_cast<float>(config.momentum);
  params.dampening = static_cast<float>(config.dampening);
  params.nesterov = config.nesterov;
  return params;
}

LossScalerParams loss_scaler_params_of(const Config& config) {
  LossScalerParams params;
  if (config.fp16.enabled) {
    params.loss_scale = config.fp16.loss_scale;
    params.initial_scale_power = config.fp16.initial_scale_power;
    params.loss_scale_window = config.fp16.loss_scale_window;
    params.hysteresis = config.fp16.hysteresis;
    params.consecutive_hysteresis = config.fp16.consecutive_hysteresis;
    params.min_loss_scale = config.fp16.min_loss_scale;
  }
  params.check_grad_overflow = config.bf16.check_grad_overflow;
  return params;
}

}  // namespace

void check_engine_supports(const Config& config) {
  const auto& zero = config.zero_optimization;
  if (zero.stage > 1) {
    ZT_THROW_AS(ConfigError, "zero_optimization.stage is ", zero.stage,
                ": this build's engine runs stage 0 (gradients all-reduced) and stage 1 (optimizer states "
                "partitioned); ZeRO stages 2 and 3 are not available yet. Set \"stage\": 0 or 1.");
  }
  if (zero.offload_optimizer.device != OffloadDevice::none ||
      zero.offload_param.device != OffloadDevice::none) {
    ZT_THROW_AS(
        ConfigError,
        "zero_optimization.offload_optimizer / offload_param: offload is not available yet in this build; "
        "set \"device\": \"none\" or remove the section");
  }
  if (config.fp16.fp16_master_weights_and_grads || config.bf16.bf16_master_weights_and_grads ||
      config.bf16.bf16_optimizer_states) {
    ZT_THROW_AS(
        ConfigError,
        "fp16.fp16_master_weights_and_grads / bf16.bf16_master_weights_and_grads / "
        "bf16.bf16_optimizer_states: 16-bit master weights are not supported; zerotrain keeps fp32 master "
        "weights. Remove these keys.");
  }
  if (config.pipeline.stages.value_or(1) > 1) {
    ZT_THROW_AS(ConfigError, "pipeline.stages is ", *config.pipeline.stages,
                ": pipeline parallelism is not available yet in this build");
  }
  if (!config.managed_gradient_accumulation) {
    ZT_THROW_AS(
        ConfigError,
        "managed_gradient_accumulation is false: caller-owned accumulation boundaries are not supported yet");
  }
}

namespace {

/// Without OMP_NUM_THREADS, share the node's cores among its ranks: more threads than cores make
/// OpenMP (and OpenBLAS) threads spin against each other.
void use_cores_of_this_node(const Runtime& runtime) {
  if (std::getenv("OMP_NUM_THREADS") != nullptr) return;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  kernels::set_host_threads(std::max(1, static_cast<int>(cores) / std::max(1, runtime.local_size())));
}

}  // namespace

DType compute_dtype_of(const Config& config) {
  if (config.bf16.enabled) return DType::bf16;
  if (config.fp16.enabled) return DType::fp16;
  return DType::fp32;
}

Engine::Engine(Runtime& runtime, nn::Module& model, Config config, EngineOptions options)
    : runtime_(runtime),
      model_(model),
      config_(std::move(config)),
      grid_(options.data_parallel ? nullptr : std::make_unique<ProcessGrid>(runtime, GridShape{0, 1, 1})),
      data_(options.data_parallel ? options.data_parallel : &grid_->data()),
      external_(dynamic_cast<ExternalModel*>(&model)),
      compute_dtype_(compute_dtype_of(config_)),
      loss_scaler_(compute_dtype_, loss_scaler_params_of(config_)) {
  config_.resolve_batch(data_->size());
  use_cores_of_this_node(runtime_);
  check_engine_supports(config_);
  ZT_CHECK_AS(ConfigError, config_.optimizer.has_value(),
              "the config has no \"optimizer\" section; zerotrain needs one, e.g. "
              "{\"type\": \"AdamW\", \"params\": {\"lr\": 6e-4}} (types: adam, adamw, sgd)");
  if (runtime_.world_rank() == 0) {
    loss_scaler_.set_log_sink(
        [](std::string_view line) { std::fprintf(stderr, "%.*s\n", int(line.size()), line.data()); });
  } else {
    loss_scaler_.set_log_sink([](std::string_view) {});
  }

  build_flat_buffers();

  const OptimizerParams hyperparameters = optimizer_params_of(*config_.optimizer);
  optimizer_ =
      make_optimizer(to_string(config_.optimizer->type),
                     {ParamBuffer{master_shard(), static_cast<std::size_t>(shard_size_)}}, hyperparameters);
  if (config_.scheduler) {
    scheduler_ = make_lr_scheduler(config_.scheduler->params, config_.optimizer->lr);
    if (config_.scheduler->last_batch_iteration >= 0)
      scheduler_->step(config_.scheduler->last_batch_iteration);
  }
}

Engine::~Engine() = default;

void Engine::build_flat_buffers() {
  const std::vector<nn::Parameter*> parameters = model_.parameters();
  ZT_CHECK(!parameters.empty(), "the model has no parameters to train");
  std::int64_t offset = 0;
  for (const nn::Parameter* parameter : parameters) {
    ZT_CHECK(parameter->value.defined(), "parameter '", parameter->name, "' has no value");
    ZT_CHECK_AS(
        ConfigError, parameter->value.dtype() == compute_dtype_, "parameter '", parameter->name, "' is ",
        dtype_name(parameter->value.dtype()), " but the config trains in ", dtype_name(compute_dtype_),
        " (bf16.enabled / fp16.enabled): build the model in the compute dtype (zt::build_model does)");
    ZT_CHECK(parameter->value.device().is_host(), "parameter '", parameter->name, "' is on ",
             parameter->value.device().str(), "; the engine trains on the host in this build");
    layout_.push_back({parameter->name, parameter->value.shape(), offset, parameter->value.numel()});
    parameter_count_ += parameter->value.numel();
    offset += round_up(parameter->value.numel(), kFlatAlignment);
  }
  // Pad to a multiple of (ranks x alignment) so that every rank's shard has the same size and starts
  // aligned; the padding holds zeros that no optimizer step moves.
  const int ranks = data_->size();
  flat_size_ = round_up(offset, ranks * kFlatAlignment);
  const bool partitioned = config_.zero_optimization.stage >= 1;
  shard_size_ = partitioned ? flat_size_ / ranks : flat_size_;
  shard_offset_ = partitioned ? shard_size_ * data_->rank() : 0;

  const std::size_t element = dtype_size(compute_dtype_);
  const auto bytes = static_cast<std::size_t>(flat_size_) * element;
  parameters_ = Buffer(Device::host(), bytes, MemoryCategory::parameters);
  gradients_ = Buffer(Device::host(), bytes, MemoryCategory::gradients);
  std::memset(parameters_.data(), 0, bytes);  // padding stays zero: the optimizer never moves it
  std::memset(gradients_.data(), 0, bytes);
  auto* parameter_bytes = parameters_.as<std::byte>();
  auto* gradient_bytes = gradients_.as<std::byte>();
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    nn::Parameter& parameter = *parameters[i];
    const FlatParameter& slot = layout_[i];
    const auto byte_offset = static_cast<std::size_t>(slot.offset) * element;
    Tensor flat_value = Tensor::view_of(parameter_bytes + byte_offset, slot.shape, compute_dtype_);
    flat_value.copy_from(parameter.value);
    if (external_ != nullptr) continue;  // the caller's buffers stay where they are (copied at boundaries)
    parameter.value = flat_value;        // the model's own storage is released here
    parameter.grad = Tensor::view_of(gradient_bytes + byte_offset, slot.shape, compute_dtype_);
  }
  if (compute_dtype_ != DType::fp32) {
    // fp32 master weights belong with the optimizer states (the 12 bytes of K in ZeRO's 16Ψ); with
    // ZeRO-1 each rank keeps the master of its shard only.
    master_ = Buffer(Device::host(), static_cast<std::size_t>(shard_size_) * sizeof(float),
                     MemoryCategory::optimizer_states);
    Tensor::view_of(master_.data(), {shard_size_}, DType::fp32)
        .copy_from(Tensor::view_of(parameter_bytes + static_cast<std::size_t>(shard_offset_) * element,
                                   {shard_size_}, compute_dtype_));
  }
}

float* Engine::master_shard() {
  return compute_dtype_ == DType::fp32 ? parameters_.as<float>() + shard_offset_ : master_.as<float>();
}

void Engine::copy_external_gradients_in() {
  const std::vector<nn::Parameter*> parameters = model_.parameters();
  const std::size_t element = dtype_size(compute_dtype_);
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    const FlatParameter& slot = layout_[i];
    Tensor::view_of(gradients_.as<std::byte>() + static_cast<std::size_t>(slot.offset) * element, slot.shape,
                    compute_dtype_)
        .copy_from(parameters[i]->grad);
  }
}

void Engine::copy_parameters_out() {
  const std::vector<nn::Parameter*> parameters = model_.parameters();
  const std::size_t element = dtype_size(compute_dtype_);
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    const FlatParameter& slot = layout_[i];
    parameters[i]->value.copy_from(
        Tensor::view_of(parameters_.as<std::byte>() + static_cast<std::size_t>(slot.offset) * element,
                        slot.shape, compute_dtype_));
  }
}

std::span<const float> Engine::master_parameters() const {
  const float* data =
      compute_dtype_ == DType::fp32 ? parameters_.as<float>() + shard_offset_ : master_.as<float>();
  return {data, static_cast<std::size_t>(shard_size_)};
}

std::vector<float> Engine::gather_master_parameters() {
  std::vector<float> all(static_cast<std::size_t>(flat_size_));
  if (shard_size_ == flat_size_) {
    std::copy_n(master_parameters().data(), all.size(), all.data());
  } else {
    data_->all_gather(master_parameters().data(), all.data(), static_cast<std::size_t>(shard_size_),
                      DType::fp32);
  }
  return all;
}

double Engine::forward(const Batch& batch) {
  ZT_CHECK(batch.inputs.defined() && batch.targets.defined(),
           "Engine::forward: the batch needs inputs and targets");
  ZT_CHECK(!forward_pending_,
           "Engine::forward called twice without backward(); call backward() (or eval() for a "
           "forward without gradients)");
  model_.train();
  const Tensor output = model_.run_forward(batch.inputs);
  last_forward_was_cross_entropy_ = batch.targets.dtype() == DType::int32;
  const double loss = last_forward_was_cross_entropy_ ? cross_entropy_.forward(output, batch.targets)
                                                      : mse_.forward(output, batch.targets);
  forward_pending_ = true;
  accumulated_loss_ += loss;
  ++accumulated_micro_batches_;
  return loss;
}

void Engine::backward() {
  ZT_CHECK(forward_pending_, "Engine::backward called without a forward() before it");
  // d(scale * loss / gas): the loss scale guards 16-bit gradients against underflow, and 1/gas
  // makes accumulated gradients the mean over the global batch's micro-batches.
  const double scale = loss_scaler_.loss_scale() / static_cast<double>(batch().gradient_accumulation_steps);
  const Tensor grad_output =
      last_forward_was_cross_entropy_ ? cross_entropy_.backward(scale) : mse_.backward(scale);
  model_.run_backward(grad_output);
  forward_pending_ = false;
}

bool Engine::is_gradient_accumulation_boundary() const {
  return micro_steps_ % batch().gradient_accumulation_steps == 0;
}

double Engine::lr() const {
  return scheduler_ ? scheduler_->lr() : config_.optimizer->lr;
}

void Engine::reduce_gradients() {
  // Stage 0: all-reduce, every rank gets the whole gradient. Stage 1: reduce-scatter, each rank gets
  // the reduced gradient of its shard (at the start of the gradient buffer), which is all its
  // optimizer step reads. Both move 2 (N-1)/N of the buffer per step with the all-gather after.
  Communicator& data = *data_;
  if (data.size() == 1) return;
  const ReduceOp op = config_.gradient_allreduce_op == GradientReduceOp::sum ? ReduceOp::sum : ReduceOp::avg;
  const DType wire = config_.communication_data_type.value_or(compute_dtype_);
  const bool partitioned = shard_size_ != flat_size_;
  auto reduce = [&](void* buffer, DType type) {
    if (partitioned) {
      data.reduce_scatter(buffer, buffer, static_cast<std::size_t>(shard_size_), type, op);
    } else {
      data.all_reduce(buffer, buffer, static_cast<std::size_t>(flat_size_), type, op);
    }
  };
  if (wire == compute_dtype_) {
    reduce(gradients_.data(), compute_dtype_);
    return;
  }
  // communication_data_type differs from the gradients: convert, reduce, convert back.
  Buffer staging(Device::host(), static_cast<std::size_t>(flat_size_) * dtype_size(wire),
                 MemoryCategory::comm_buffers);
  Tensor::view_of(staging.data(), {flat_size_}, wire)
      .copy_from(Tensor::view_of(gradients_.data(), {flat_size_}, compute_dtype_));
  reduce(staging.data(), wire);
  const std::int64_t reduced = partitioned ? shard_size_ : flat_size_;
  Tensor::view_of(gradients_.data(), {reduced}, compute_dtype_)
      .copy_from(Tensor::view_of(staging.data(), {reduced}, wire));
}

bool Engine::step() {
  ZT_CHECK(!forward_pending_, "Engine::step called after forward() without backward()");
  ++micro_steps_;
  if (!is_gradient_accumulation_boundary()) return false;

  Communicator& data = *data_;
  const std::uint64_t bytes_before = data.traffic().total().wire_bytes;
  if (external_ != nullptr) copy_external_gradients_in();
  reduce_gradients();

  // Overflow check and norm over the whole (already reduced) gradient, unscaled.
  const double scale_used = loss_scaler_.loss_scale();
  kernels::GradCheck check =
      kernels::grad_sum_squares(Device::host(), gradients_.data(), compute_dtype_,
                                static_cast<std::size_t>(shard_size_), 1.0 / scale_used);
  if (shard_size_ != flat_size_) {
    // Each rank saw its shard: the global norm and the overflow flag are sums over ranks.
    double partial[2] = {check.sum_sq, check.found_inf ? 1.0 : 0.0};
    data.all_reduce(partial, partial, 2, DType::fp64, ReduceOp::sum);
    check = {partial[0], partial[1] > 0};
  }
  const bool overflow = loss_scaler_.checks_overflow() && check.found_inf;
  const bool skip = loss_scaler_.update(overflow);
  const kernels::GradClip clip = kernels::clip_from_sum_squares(check.sum_sq, config_.gradient_clipping);

  StepReport report;
  report.lr = lr();
  report.loss_scale = scale_used;
  report.skipped = skip;
  report.grad_norm = check.found_inf ? std::numeric_limits<double>::quiet_NaN() : clip.norm;
  if (!skip) {
    if (scheduler_) {
      if (const auto betas = scheduler_->betas(); betas && config_.optimizer->type != OptimizerType::sgd) {
        OptimizerParams hyperparameters = optimizer_->hyperparameters();
        hyperparameters.beta1 = static_cast<float>(betas->beta1);
        hyperparameters.beta2 = static_cast<float>(betas->beta2);
        optimizer_->set_hyperparameters(hyperparameters);
      }
    }
    const double coefficient = config_.gradient_clipping > 0 ? clip.coefficient : 1.0;
    const float grad_scale = kernels::combined_grad_scale(scale_used, coefficient);
    // This rank's shard of the parameters (all of them at stage 0); its reduced gradient sits at the
    // start of the gradient buffer.
    std::byte* my_parameters =
        parameters_.as<std::byte>() + static_cast<std::size_t>(shard_offset_) * dtype_size(compute_dtype_);
    HalfParamBuffer half{};
    if (compute_dtype_ != DType::fp32) half = {my_parameters, compute_dtype_};
    optimizer_->step(GradBuffer{gradients_.data(), compute_dtype_}, grad_scale, static_cast<float>(report.lr),
                     half);
    if (shard_size_ != flat_size_) {
      // ZeRO-1: every rank updated its shard of the parameters; gather the others'.
      data.all_gather(my_parameters, parameters_.data(), static_cast<std::size_t>(shard_size_),
                      compute_dtype_);
    }
    if (scheduler_) scheduler_->step();
    if (external_ != nullptr) copy_parameters_out();
  } else {
    ++skipped_steps_;
  }
  std::memset(gradients_.data(), 0, gradients_.size());
  if (external_ != nullptr) {
    for (nn::Parameter* parameter : model_.parameters()) parameter->grad.zero_();
    const auto [loss_sum, loss_count] = external_->take_losses();
    accumulated_loss_ += loss_sum;
    accumulated_micro_batches_ += loss_count;
  }
  report.comm_bytes = data.traffic().total().wire_bytes - bytes_before;  // gradient traffic only

  // The reported loss is the mean over micro-batches and ranks (identical on every rank).
  double loss_sum[2] = {accumulated_loss_, static_cast<double>(accumulated_micro_batches_)};
  data.all_reduce(loss_sum, loss_sum, 2, DType::fp64, ReduceOp::sum);
  report.loss = loss_sum[1] > 0 ? loss_sum[0] / loss_sum[1] : 0.0;
  accumulated_loss_ = 0.0;
  accumulated_micro_batches_ = 0;

  ++global_steps_;
  global_samples_ += batch().train_batch_size;
  report.step = global_steps_;
  last_step_ = report;
  return true;
}

double Engine::eval(const Batch& batch) {
  ZT_CHECK(batch.inputs.defined() && batch.targets.defined(),
           "Engine::eval: the batch needs inputs and targets");
  ZT_CHECK(!forward_pending_, "Engine::eval during a forward/backward pair; call backward() first");
  model_.eval();
  const Tensor output = model_.run_forward(batch.inputs);
  const double loss = batch.targets.dtype() == DType::int32
                          ? nn::SoftmaxCrossEntropy().forward(output, batch.targets)
                          : nn::MseLoss().forward(output, batch.targets);
  model_.train();
  return loss;
}

std::unique_ptr<Engine> initialize(Runtime& runtime, nn::Module& model, Config config,
                                   EngineOptions options) {
  return std::make_unique<Engine>(runtime, model, std::move(config), options);
}

}  // namespace zt
