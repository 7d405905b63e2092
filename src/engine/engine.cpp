// zt::Engine: the training loop's state machine (micro-steps, accumulation boundary, update) over
// the engine's seams: the partition plan, the ZeRO strategy, where the optimizer states live, the
// parallel context and the checkpointer (docs/architecture.md, "The engine's seams").
#include "zerotrain/engine.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "base/resident_memory.hpp"
#include "base/seconds_since.hpp"
#include "base/text.hpp"
#include "kernels/nn_kernels.hpp"
#include "kernels/optimizer_kernels.hpp"
#include "src/engine/checkpointer.hpp"
#include "src/engine/engine_access.hpp"
#include "src/engine/optimizer_states.hpp"
#include "src/engine/parallel_context.hpp"
#include "src/engine/partition_plan.hpp"
#include "src/engine/pipeline_executor.hpp"
#include "src/engine/sharded_parameters.hpp"
#include "src/engine/string_broadcast.hpp"
#include "src/engine/zero_strategy.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/external_model.hpp"
#include "zerotrain/pipeline.hpp"
#include "zerotrain/runtime.hpp"
#include "zerotrain/swap.hpp"

namespace zt {
namespace {

/// The model in eval mode (no dropout) for a scope, back in training mode however the scope ends.
class EvalModeScope {
 public:
  explicit EvalModeScope(nn::Module& model) : model_(model) { model_.eval(); }
  ~EvalModeScope() { model_.train(); }
  EvalModeScope(const EvalModeScope&) = delete;
  EvalModeScope& operator=(const EvalModeScope&) = delete;

 private:
  nn::Module& model_;
};

LossScalerParams loss_scaler_params_of(const Config& config) {
  LossScalerParams params;
  if (config.fp16.enabled) {
    params.loss_scale = config.fp16.loss_scale;
    params.initial_scale_power = config.fp16.initial_scale_power;
    params.loss_scale_window = config.fp16.loss_scale_window;
    params.hysteresis = config.fp16.hysteresis;
    params.consecutive_hysteresis = config.fp16.consecutive_hysteresis;
    params.min_loss_scale = config.fp16.min_loss_scale;
    // DeepSpeed runs stage 0 through FP16_Optimizer and stages 1-3 through DynamicLossScaler.
    params.rule = config.zero_optimization.stage == 0 ? LossScaleRule::fp16_optimizer
                                                      : LossScaleRule::dynamic_loss_scaler;
  }
  params.check_grad_overflow = config.bf16.check_grad_overflow;
  return params;
}

/// Reads one fp64 device scalar (a loss) on the host. The read synchronizes the compute stream,
/// so it is also where an out-of-range token or target that a CUDA kernel met since the last read is
/// raised (kernels::check_index_errors), naming it, instead of training on with a NaN loss; the host
/// kernels have thrown already.
void read_device_scalar(const ExecutionContext& execution, double* host_destination, const void* source) {
  execution.to_host(host_destination, source, sizeof(double));
  kernels::check_index_errors(execution.compute());
}

}  // namespace

void check_engine_supports(const Config& config) {
  const auto& zero = config.zero_optimization;
  const engine_detail::ZeroPartitioning partitioning = engine_detail::ZeroPartitioning::of_stage(zero.stage);
  const OffloadParamConfig& offload_param = zero.offload_param;
  if (offload_param.device != OffloadDevice::none) {
    ZT_CHECK_AS(ConfigError, partitioning.parameters,
                "zero_optimization.offload_param needs ZeRO stage 3, but ", "zero_optimization.stage is ",
                zero.stage);
    ZT_CHECK_AS(ConfigError, offload_param.buffer_count >= 1,
                "zero_optimization.offload_param.buffer_count is ", offload_param.buffer_count,
                "; expected >= 1 (5 by default: pieces read from NVMe at once)");
    ZT_CHECK_AS(ConfigError, offload_param.buffer_size >= 1,
                "zero_optimization.offload_param.buffer_size is ", offload_param.buffer_size,
                "; expected >= 1 (elements per buffer, 1e8 by default)");
    ZT_CHECK_AS(ConfigError, offload_param.max_in_cpu >= 0, "zero_optimization.offload_param.max_in_cpu is ",
                offload_param.max_in_cpu, "; expected >= 0 (parameter elements kept in host memory)");
    ZT_CHECK_AS(
        ConfigError, offload_param.device != OffloadDevice::nvme || !config.aio.use_gds,
        "aio.use_gds: GPUDirect Storage is not supported; set it false (swaps go through host buffers)");
  }
  const OffloadOptimizerConfig& offload = zero.offload_optimizer;
  if (offload.device != OffloadDevice::none) {
    ZT_CHECK_AS(ConfigError, partitioning.optimizer_states,
                "zero_optimization.offload_optimizer needs ZeRO stage 1, 2 or 3, but ",
                "zero_optimization.stage is ", zero.stage);
    ZT_CHECK_AS(ConfigError, offload.ratio >= 1.0, "zero_optimization.offload_optimizer.ratio is ",
                offload.ratio,
                ": partial optimizer offload is not supported; remove the key (1.0: everything offloaded)");
    ZT_CHECK_AS(ConfigError, !offload.super_offload,
                "zero_optimization.offload_optimizer.super_offload is not supported; remove the key");
    ZT_CHECK_AS(ConfigError, offload.buffer_count >= 1,
                "zero_optimization.offload_optimizer.buffer_count is ", offload.buffer_count,
                "; expected >= 1 (4 by default; 3 or more overlap reads, updates and writes)");
    ZT_CHECK_AS(
        ConfigError, offload.device != OffloadDevice::nvme || !config.aio.use_gds,
        "aio.use_gds: GPUDirect Storage is not supported; set it false (swaps go through host buffers)");
  }
  // A bad nvme_path fails before the model is built; the swap engine names anything else wrong
  // with it (permissions, space, O_DIRECT) when it creates its file.
  if (zero.offload_optimizer.device == OffloadDevice::nvme && zero.offload_optimizer.nvme_path)
    check_swap_directory(*zero.offload_optimizer.nvme_path, "zero_optimization.offload_optimizer.nvme_path");
  if (offload_param.device == OffloadDevice::nvme && offload_param.nvme_path)
    check_swap_directory(*offload_param.nvme_path, "zero_optimization.offload_param.nvme_path");
  if (config.fp16.fp16_master_weights_and_grads || config.bf16.bf16_master_weights_and_grads ||
      config.bf16.bf16_optimizer_states) {
    ZT_THROW_AS(
        ConfigError,
        "fp16.fp16_master_weights_and_grads / bf16.bf16_master_weights_and_grads / "
        "bf16.bf16_optimizer_states: 16-bit master weights are not supported; zerotrain keeps fp32 master "
        "weights. Remove these keys.");
  }
  partitioning.check_pipeline(config.pipeline.stage_count());
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

namespace {

/// Whether a parameter is frozen: the caller's predicate, or any of the config's "freeze" patterns.
std::function<bool(const std::string&)> freeze_rule(const Config& config,
                                                    std::function<bool(const std::string&)> predicate) {
  return [patterns = config.freeze, predicate = std::move(predicate)](const std::string& name) {
    if (predicate && predicate(name)) return true;
    return std::any_of(patterns.begin(), patterns.end(),
                       [&](const std::string& pattern) { return freeze_pattern_matches(pattern, name); });
  };
}

std::vector<nn::Parameter*> parameters_where(const std::vector<nn::Parameter*>& all,
                                             const std::function<bool(const std::string&)>& frozen,
                                             bool want_frozen) {
  std::vector<nn::Parameter*> selected;
  for (nn::Parameter* parameter : all) {
    if (frozen(parameter->name) == want_frozen) selected.push_back(parameter);
  }
  // Before the plan is made of them: a plan of no parameters would be a less helpful error.
  ZT_CHECK_AS(ConfigError, want_frozen || !selected.empty() || all.empty(),
              "freeze: every one of the model's ", all.size(), " parameters is frozen; nothing would train");
  return selected;
}

}  // namespace

DType compute_dtype_of(const Config& config) {
  return config.compute_dtype();
}

class Engine::Impl {
 public:
  Impl(Runtime& runtime, nn::Module& model, Config config, EngineOptions options);
  ~Impl();

  Tensor forward(const Tensor& inputs);
  void backward(const Loss& loss);
  void backward(const Tensor& grad_output, std::optional<double> loss);
  const StepReport& train_batch(const std::function<Batch(std::int64_t)>& micro_batch);
  double forward(const Batch& batch);
  void backward();
  bool step();
  double eval(const Batch& batch);
  std::vector<double> eval_rows(const Batch& batch);
  std::string save_checkpoint(const std::string& dir, const SaveOptions& options);
  LoadResult load_checkpoint(const std::string& dir, const LoadOptions& options);

  bool is_gradient_accumulation_boundary() const {
    return progress_.micro_steps % batch().gradient_accumulation_steps == 0;
  }
  double lr() const { return scheduler_ ? scheduler_->lr() : config_.optimizer->lr; }
  const BatchSizes& batch() const { return config_.batch(); }
  std::vector<float> master_parameters();
  std::vector<float> gather_master_parameters();

  Runtime& runtime_;
  nn::Module& model_;
  Config config_;
  ExecutionContext execution_;  // the device the model's states live on, its streams
  engine_detail::ParallelContext parallel_;
  ExternalModel* external_;  // the caller's buffers (bring your own model), or null
  DType compute_dtype_;
  LossScaler loss_scaler_;
  std::function<bool(const std::string&)> is_frozen_;
  std::vector<nn::Parameter*> parameters_;  // the trainable ones: the plan's
  std::vector<nn::Parameter*> frozen_;      // outside the plan: no gradient, optimizer state or reduction
  engine_detail::PartitionPlan plan_;
  std::vector<engine_detail::ModuleUse> uses_;
  std::vector<std::pair<nn::Module*, nn::HookHandle>> hooks_;
  nn::PipelineStage* stage_model_;  // the model is one stage of a pipeline of several (or null)
  /// A parameter held by several pipeline stages (a tied layer): its gradient is summed over the
  /// group of their ranks before the update; the lowest stage counts it in the norm and saves it.
  struct TiedParameter {
    std::size_t index = 0;  // in the plan
    engine_detail::ParallelContext::Group group;
    bool owner = false;  // this stage is the lowest that holds it
  };
  std::vector<TiedParameter> tied_;
  std::vector<char> counts_in_norm_;  // per plan index: not a tied copy of a lower stage's parameter
  std::unique_ptr<engine_detail::PipelineExecutor> pipeline_executor_;
  std::deque<std::pair<std::int64_t, Loss>> pipeline_losses_;  // last stage: by micro-batch, for backward
  std::unique_ptr<engine_detail::ZeroStrategy> strategy_;
  std::unique_ptr<engine_detail::OptimizerStates> states_;
  std::unique_ptr<engine_detail::Checkpointer> checkpointer_;
  std::unique_ptr<LRScheduler> scheduler_;
  /// A forward whose backward has not run yet: its slot of saved activations and its output.
  struct MicroBatchInFlight {
    std::uint32_t slot = 0;
    Tensor output;
  };
  std::deque<MicroBatchInFlight> in_flight_;  // oldest first: backward() takes them in order
  std::uint32_t next_slot_ = 0;
  std::optional<Loss> pending_loss_;  // forward(Batch)'s built-in loss, for backward()
  Buffer loss_sum_;                   // fp64 on the device: the step's built-in losses, summed
  Buffer grad_check_;  // kernels::GradCheckScalars on the device: the step's norm and overflow partials
  engine_detail::TrainingProgress progress_;
  std::int64_t backwards_this_step_ = 0;  // backward passes since the last update
  double accumulated_loss_ = 0.0;
  std::int64_t accumulated_micro_batches_ = 0;
  std::uint64_t wire_bytes_at_step_start_ = 0;
  double comm_seconds_at_step_start_ = 0.0;
  double step_wait_seconds_ = 0.0;  // the step's own blocking collectives since construction
  double wait_seconds_at_step_start_ = 0.0;
  OffloadTiming parameter_swap_at_step_start_;
  bool step_started_ = false;
  StepReport last_step_;

 private:
  std::vector<engine_detail::ModuleUse> find_module_uses();
  void install_hooks();
  void mark_step_start();
  double total_wait_seconds() const { return strategy_->wait_seconds() + step_wait_seconds_; }
  /// What the model's communication sent so far: gradients and parameters over the data group,
  /// activations and gradients between pipeline stages, tied gradients.
  TrafficCounter model_traffic() const;
  /// Update shard elements [begin, end) of owned range `index` and write the new parameters where
  /// they live in the compute dtype.
  void update_part(std::size_t index, std::int64_t begin, std::int64_t end, float* master,
                   std::span<float* const> state, float grad_scale, float lr);
  engine_detail::TrainingState training_state();
  /// The backward of the oldest forward in flight from the gradient of its output (scaled).
  void backward_pass(const Tensor& grad_output);
  double backward_scale() const;
  /// Softmax cross-entropy for int32 targets, mean squared error otherwise, on the engine's device.
  Loss builtin_loss(const Tensor& output, const Tensor& targets) const;
  /// The newest forward will get no backward: its slot's activations are released.
  void abandon_newest_forward();
  /// Find the parameters this stage shares with other stages, make their groups, and give every
  /// copy the lowest stage's values (collective over all ranks).
  void find_tied_parameters();
  void reduce_tied_gradients();
  const StepReport& train_pipelined(const std::function<Batch(std::int64_t)>& micro_batch);
  double eval_pipelined(const Batch& batch);
  /// The built-in loss of each row (dimension 0) of an output against its targets, on the host.
  std::vector<double> row_losses(const Tensor& output, const Tensor& targets) const;
  std::vector<double> eval_rows_pipelined(const Batch& batch);
  void check_not_pipelined(const char* call) const;
  /// The frozen parameters: refuse what cannot be frozen, drop their gradients, move them to the device.
  void set_up_frozen_parameters();
};

Engine::Impl::Impl(Runtime& runtime, nn::Module& model, Config config, EngineOptions options)
    : runtime_(runtime),
      model_(model),
      config_(std::move(config)),
      execution_(options.device),
      parallel_(runtime, options.grid, options.data_parallel, execution_,
                options.grid == nullptr && options.data_parallel == nullptr
                    ? static_cast<int>(config_.pipeline.stage_count())
                    : 1),
      external_(dynamic_cast<ExternalModel*>(&model)),
      compute_dtype_(compute_dtype_of(config_)),
      loss_scaler_(compute_dtype_, loss_scaler_params_of(config_)),
      is_frozen_(freeze_rule(config_, options.freeze)),
      parameters_(parameters_where(model.parameters(), is_frozen_, false)),
      frozen_(parameters_where(model.parameters(), is_frozen_, true)),
      plan_(engine_detail::planned_parameters(parameters_),
            engine_detail::plan_settings(config_, parallel_.data().size(), parallel_.data().rank(),
                                         parallel_.tensor().size(), parallel_.tensor().rank(),
                                         !execution_.device().is_host())) {
  stage_model_ = dynamic_cast<nn::PipelineStage*>(&model);
  // A pipeline of one stage is the whole model: it trains as any other.
  if (stage_model_ != nullptr && stage_model_->stages() == 1) stage_model_ = nullptr;
  const int stages = parallel_.pipeline().size();
  ZT_CHECK_AS(ConfigError, stages == 1 || stage_model_ != nullptr, "the process grid has ", stages,
              " pipeline stages but the model is a ", model.type_name(),
              ", not a zt::nn::PipelineStage: build this rank's stage (zt::build_model(config, stage) or "
              "zt::nn::PipelineStage over layer specs)");
  if (stage_model_ != nullptr) {
    ZT_CHECK_AS(ConfigError,
                stage_model_->stages() == stages && stage_model_->stage() == parallel_.pipeline().rank(),
                "the model is stage ", stage_model_->stage(), " of ", stage_model_->stages(),
                " but this rank is stage ", parallel_.pipeline().rank(), " of ", stages,
                " in the process grid (world rank ", runtime.world_rank(), ")");
    ZT_CHECK_AS(ConfigError, external_ == nullptr, "a zt::ExternalModel cannot be a pipeline stage");
  }
  ZT_CHECK_AS(ConfigError, config_.pipeline.stage_count() == 1 || config_.pipeline.stage_count() == stages,
              "pipeline.stages is ", config_.pipeline.stage_count(), " but the process grid has ", stages,
              " pipeline stages");
  if (stages > 1 && config_.pipeline.stage_count() == 1) config_.pipeline.stages = stages;

  config_.resolve_batch(parallel_.data().size());
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
  for (const nn::Parameter* parameter : parameters_) {
    ZT_CHECK_AS(
        ConfigError, parameter->value.dtype() == compute_dtype_, "parameter '", parameter->name, "' is ",
        dtype_name(parameter->value.dtype()), " but the config trains in ", dtype_name(compute_dtype_),
        " (bf16.enabled / fp16.enabled): build the model in the compute dtype (zt::build_model does)");
    ZT_CHECK(parameter->value.device().is_host(), "parameter '", parameter->name, "' is on ",
             parameter->value.device().str(), "; build the model on the host, the engine moves it");
  }

  set_up_frozen_parameters();
  if (external_ == nullptr) uses_ = find_module_uses();
  strategy_ = engine_detail::make_zero_strategy({.plan = plan_,
                                                 .execution = execution_,
                                                 .parallel = parallel_,
                                                 .config = config_,
                                                 .parameters = parameters_,
                                                 .uses = uses_,
                                                 .external = external_});
  if (external_ == nullptr) install_hooks();
  counts_in_norm_.assign(plan_.size(), 1);
  if (stage_model_ != nullptr) {
    find_tied_parameters();
    pipeline_executor_ = std::make_unique<engine_detail::PipelineExecutor>(
        *parallel_.pipeline().device, *parallel_.pipeline().host, execution_, stage_model_->stage(),
        stage_model_->stages());
  }
  states_ = engine_detail::make_optimizer_states(plan_, *strategy_, config_, execution_);
  // With offload_param "nvme" the parameter store holds the pieces now; the optimizer's master was
  // initialized from the shard in memory above.
  if (auto* sharded = dynamic_cast<engine_detail::ShardedParameters*>(strategy_.get()))
    sharded->drop_initial_shard();
  checkpointer_ = std::make_unique<engine_detail::Checkpointer>(plan_, parallel_, *strategy_, *states_,
                                                                model_, counts_in_norm_, frozen_, execution_);
  grad_check_ = execution_.allocate(sizeof(kernels::GradCheckScalars), MemoryCategory::other);
  loss_sum_ = execution_.allocate(sizeof(double), MemoryCategory::other);
  execution_.zero(loss_sum_.data(), loss_sum_.size());
  if (config_.scheduler) {
    scheduler_ = make_lr_scheduler(config_.scheduler->params, config_.optimizer->lr);
    if (config_.scheduler->last_batch_iteration >= 0)
      scheduler_->step(config_.scheduler->last_batch_iteration);
  }
  // The model's own parameter storage (now in the engine's buffers) and the construction temporaries
  // are freed for good: give their pages back, or the malloc tuning keeps them resident for the
  // whole run (measured: 1.25-1.84x the accounted peak; docs/metrics.md, "Resident memory").
  base::release_freed_heap();
}

Engine::Impl::~Impl() {
  for (const auto& [module, handle] : hooks_) module->remove_hook(handle);
}

std::vector<engine_detail::ModuleUse> Engine::Impl::find_module_uses() {
  std::unordered_map<const nn::Parameter*, std::size_t> index_of;
  for (std::size_t i = 0; i < parameters_.size(); ++i) index_of[parameters_[i]] = i;
  std::vector<engine_detail::ModuleUse> uses;
  for (nn::Module* module : model_.modules()) {
    std::vector<std::size_t> used;
    auto add = [&](const nn::Parameter* parameter) {
      if (std::find(frozen_.begin(), frozen_.end(), parameter) != frozen_.end()) return;  // no hooks needed
      const auto found = index_of.find(parameter);
      ZT_CHECK(found != index_of.end(), "module '", module->name(), "' (", module->type_name(),
               ") uses a parameter that is not among the model's parameters");
      if (std::find(used.begin(), used.end(), found->second) == used.end()) used.push_back(found->second);
    };
    for (const nn::Parameter* parameter : module->direct_parameters()) add(parameter);
    for (const nn::Parameter* parameter : module->borrowed_parameters()) add(parameter);
    if (used.empty()) continue;
    uses.push_back({.index = uses.size(), .module = module, .parameters = std::move(used)});
  }
  return uses;
}

void Engine::Impl::set_up_frozen_parameters() {
  if (frozen_.empty() && config_.freeze.empty()) return;
  const std::vector<nn::Parameter*> all = model_.parameters();
  for (std::size_t k = 0; k < config_.freeze.size(); ++k) {
    const std::string& pattern = config_.freeze[k];
    const bool matches = std::any_of(all.begin(), all.end(), [&](const nn::Parameter* parameter) {
      return freeze_pattern_matches(pattern, parameter->name);
    });
    if (!matches) {
      std::string names;
      for (std::size_t i = 0; i < all.size() && i < 12; ++i) names += (i == 0 ? "" : ", ") + all[i]->name;
      ZT_THROW_AS(ConfigError, "freeze[", k, "] \"", pattern, "\" matches no parameter of the model (",
                  all.size(), " parameters: ", names, all.size() > 12 ? ", ..." : "",
                  "); globs match whole names (\"h.0.*\"), \"re:\" patterns are regular expressions");
    }
  }
  ZT_CHECK_AS(ConfigError, external_ == nullptr,
              "freeze with a zt::ExternalModel: the application's own model computes its gradients; freeze "
              "its parameters there (frozen parameters of external models are not available yet)");
  ZT_CHECK_AS(ConfigError, parallel_.pipeline().size() == 1, "freeze with ", parallel_.pipeline().size(),
              " pipeline stages: frozen parameters of pipelined models are not available yet");
  for (nn::Parameter* parameter : frozen_) {
    ZT_CHECK_AS(ConfigError, parameter->role == nn::ParallelRole::replicated, "freeze: '", parameter->name,
                "' is sharded across the tensor group; frozen tensor-parallel slices are not available yet");
    parameter->grad = Tensor();  // no gradient: the layers skip it (nn_checks.hpp, grad_pointer)
    if (parameter->value.device() != execution_.device()) {
      Tensor moved =
          execution_.empty(parameter->value.shape(), parameter->value.dtype(), MemoryCategory::parameters);
      execution_.from_host(moved.raw_data(), parameter->value.raw_data(), parameter->value.nbytes());
      execution_.synchronize();
      parameter->value = std::move(moved);
    }
  }
}

void Engine::Impl::install_hooks() {
  for (const engine_detail::ModuleUse& use : uses_) {
    nn::Module& module = *use.module;
    engine_detail::ZeroStrategy& strategy = *strategy_;
    hooks_.emplace_back(&module, module.add_forward_pre_hook([&strategy, &use](nn::Module&, const Tensor&) {
      strategy.before_forward(use);
    }));
    hooks_.emplace_back(
        &module, module.add_forward_post_hook([&strategy, &use](nn::Module&, const Tensor&, const Tensor&) {
          strategy.after_forward(use);
        }));
    hooks_.emplace_back(&module, module.add_backward_pre_hook([&strategy, &use](nn::Module&, const Tensor&) {
      strategy.before_backward(use);
    }));
    hooks_.emplace_back(&module, module.add_backward_post_hook([&strategy, &use](nn::Module&, const Tensor&) {
      strategy.after_backward(use);
    }));
  }
}

void Engine::Impl::mark_step_start() {
  if (step_started_) return;
  step_started_ = true;
  const TrafficCounter total = model_traffic();
  wire_bytes_at_step_start_ = total.wire_bytes;
  comm_seconds_at_step_start_ = total.seconds;
  wait_seconds_at_step_start_ = total_wait_seconds();
  parameter_swap_at_step_start_ = strategy_->parameter_swap_counters();
}

void Engine::Impl::check_not_pipelined(const char* call) const {
  ZT_CHECK_AS(ConfigError, stage_model_ == nullptr, "Engine::", call, " on a pipeline stage (stage ",
              stage_model_ != nullptr ? stage_model_->stage() : 0, " of ",
              stage_model_ != nullptr ? stage_model_->stages() : 1,
              "): the pipeline schedule decides when each stage runs its micro-batches; call train_batch() "
              "for a training step and eval() for a loss");
}

Tensor Engine::Impl::forward(const Tensor& inputs) {
  check_not_pipelined("forward");
  ZT_CHECK(inputs.defined(), "Engine::forward: the micro-batch's inputs are undefined");
  const std::size_t limit = strategy_->forwards_in_flight_limit();
  ZT_CHECK(limit == 0 || in_flight_.size() < limit, "Engine::forward: ", in_flight_.size(),
           " forward(s) wait for their backward and ZeRO stage ", plan_.settings().stage, " takes ", limit,
           " at a time (its parameter gathering follows one micro-batch's forward and backward); call "
           "backward() first");
  const std::int64_t accumulation = batch().gradient_accumulation_steps;
  ZT_CHECK(backwards_this_step_ + static_cast<std::int64_t>(in_flight_.size()) < accumulation,
           "Engine::forward: the optimizer step has gradient_accumulation_steps = ", accumulation,
           " micro-batches and all of them are in flight or done (", in_flight_.size(),
           " waiting for backward, ", backwards_this_step_, " done); call backward() and step() first");
  mark_step_start();
  model_.train();
  strategy_->begin_forward(true);
  const std::uint32_t slot = next_slot_++;
  Tensor output =
      model_.run_forward(execution_.on_device(inputs), {.execution = &execution_, .micro_batch = slot});
  in_flight_.push_back({slot, output});
  return output;
}

void Engine::Impl::backward_pass(const Tensor& grad_output) {
  const std::int64_t accumulation = batch().gradient_accumulation_steps;
  const MicroBatchInFlight oldest = in_flight_.front();
  strategy_->begin_backward(
      {.first_of_step = backwards_this_step_ == 0, .boundary = backwards_this_step_ + 1 == accumulation});
  model_.run_backward(grad_output, {.execution = &execution_, .micro_batch = oldest.slot});
  strategy_->end_backward();
  in_flight_.pop_front();
  ++backwards_this_step_;
}

double Engine::Impl::backward_scale() const {
  // d(scale * loss / gas): the loss scale guards 16-bit gradients against underflow, and 1/gas
  // makes accumulated gradients the mean over the global batch's micro-batches.
  return loss_scaler_.loss_scale() / static_cast<double>(batch().gradient_accumulation_steps);
}

void Engine::Impl::backward(const Loss& loss) {
  check_not_pipelined("backward");
  ZT_CHECK(!in_flight_.empty(), "Engine::backward called without a forward() before it");
  ZT_CHECK(loss.value.defined() && loss.value.numel() == 1 && loss.value.dtype() == DType::fp64 &&
               loss.value.device() == execution_.device() && loss.gradient,
           "Engine::backward: the loss needs a value (an fp64 scalar on ", execution_.device().str(),
           ") and a gradient function; got value ", loss.value.description());
  const Tensor& output = in_flight_.front().output;
  ZT_CHECK(loss.output.defined() && loss.output.raw_data() == output.raw_data(),
           "Engine::backward: the loss was not computed from the output of the oldest forward still waiting "
           "for its backward (",
           output.description(), "); backward() takes forwards in the order they ran");
  const Tensor grad_output = loss.gradient(backward_scale());
  // The value stays on the device: added to the step's sum there, read once at the step.
  kernels::accumulate(execution_.compute(), DType::fp64, loss_sum_.data(), loss.value.raw_data(), 1);
  ++accumulated_micro_batches_;
  backward_pass(grad_output);
}

void Engine::Impl::backward(const Tensor& grad_output, std::optional<double> loss) {
  check_not_pipelined("backward");
  ZT_CHECK(!in_flight_.empty(), "Engine::backward called without a forward() before it");
  const Tensor& output = in_flight_.front().output;
  ZT_CHECK(
      grad_output.defined() && grad_output.dtype() == output.dtype() && grad_output.shape() == output.shape(),
      "Engine::backward: grad_output ", grad_output.description(),
      " must have the dtype and shape of the oldest "
      "forward's output, ",
      output.description());
  // A scaled copy: the caller's tensor stays as it was.
  Tensor scaled = execution_.empty(output.shape(), output.dtype(), MemoryCategory::activations);
  scaled.copy_from(grad_output, &execution_.compute());
  kernels::scale(execution_.compute(), scaled.dtype(), scaled.raw_data(), scaled.numel(), backward_scale());
  if (loss) {
    accumulated_loss_ += *loss;
    ++accumulated_micro_batches_;
  }
  backward_pass(scaled);
}

double Engine::Impl::forward(const Batch& batch) {
  check_not_pipelined("forward");
  ZT_CHECK(batch.inputs.defined() && batch.targets.defined(),
           "Engine::forward: the batch needs inputs and targets");
  ZT_CHECK(!pending_loss_ && in_flight_.empty(),
           "Engine::forward called twice without backward(); call backward() (or eval() for a "
           "forward without gradients)");
  const Tensor output = forward(batch.inputs);
  try {
    pending_loss_ = builtin_loss(output, batch.targets);
  } catch (...) {
    abandon_newest_forward();  // bad targets: the forward is not left waiting for a backward
    throw;
  }
  double value = 0;
  read_device_scalar(execution_, &value, pending_loss_->value.raw_data());
  return value;
}

void Engine::Impl::backward() {
  ZT_CHECK(pending_loss_.has_value(), "Engine::backward called without a forward() before it");
  const Loss loss = std::move(*pending_loss_);
  pending_loss_.reset();
  backward(loss);
}

void Engine::Impl::abandon_newest_forward() {
  model_.release_activations(in_flight_.back().slot);
  in_flight_.pop_back();
}

Loss Engine::Impl::builtin_loss(const Tensor& output, const Tensor& targets) const {
  const Tensor on_device = execution_.on_device(targets);
  return targets.dtype() == DType::int32 ? cross_entropy_loss(output, on_device, execution_)
                                         : mse_loss(output, on_device, execution_);
}

const StepReport& Engine::Impl::train_batch(const std::function<Batch(std::int64_t)>& micro_batch) {
  ZT_CHECK(
      in_flight_.empty() && !pending_loss_ && backwards_this_step_ == 0 &&
          is_gradient_accumulation_boundary(),
      "Engine::train_batch in the middle of an optimizer step; finish it with backward() and step() first");
  if (stage_model_ != nullptr) return train_pipelined(micro_batch);
  const std::int64_t accumulation = batch().gradient_accumulation_steps;
  for (std::int64_t micro = 0; micro < accumulation; ++micro) {
    const Batch next = micro_batch(micro);
    ZT_CHECK(next.inputs.defined() && next.targets.defined(), "Engine::train_batch: micro-batch ", micro,
             " needs inputs and targets");
    const Tensor output = forward(next.inputs);
    std::optional<Loss> loss;
    try {
      loss = builtin_loss(output, next.targets);
    } catch (...) {
      abandon_newest_forward();
      throw;
    }
    backward(*loss);
    step();
  }
  return last_step_;
}

TrafficCounter Engine::Impl::model_traffic() const {
  TrafficCounter total = parallel_.data().host->traffic().total();
  auto add = [&total](const TrafficCounter& more) {
    total.calls += more.calls;
    total.bytes += more.bytes;
    total.wire_bytes += more.wire_bytes;
    total.seconds += more.seconds;
  };
  // On a device the data group's reductions and gathers go through its device communicator (NCCL,
  // the emulated device's); the host one keeps the host-side scalars.
  if (parallel_.data().device != parallel_.data().host) add(parallel_.data().device->traffic().total());
  // What this stage sent to its neighbours (a receive counts at the sender).
  if (parallel_.pipeline().size() > 1) add(parallel_.pipeline().device->traffic()[CommOp::send]);
  for (const TiedParameter& tied : tied_) add(tied.group.device->traffic().total());
  return total;
}

void Engine::Impl::find_tied_parameters() {
  // Every stage's parameter names and shapes, on every rank.
  std::string mine;
  for (const FlatParameter& slot : plan_.layout())
    mine += slot.name + '\t' + base::shape_text(slot.shape) + '\n';
  const std::vector<std::string> per_stage =
      engine_detail::all_gather_strings(*parallel_.pipeline().host, mine);
  std::map<std::string, std::pair<std::string, std::vector<int>>> holders;  // name: shape, stages
  for (int stage = 0; stage < static_cast<int>(per_stage.size()); ++stage) {
    std::istringstream lines(per_stage[static_cast<std::size_t>(stage)]);
    std::string line;
    while (std::getline(lines, line)) {
      const std::size_t tab = line.find('\t');
      const std::string name = line.substr(0, tab), shape = line.substr(tab + 1);
      auto [entry, added] = holders.try_emplace(name, shape, std::vector<int>{});
      ZT_CHECK_AS(ConfigError, entry->second.first == shape, "parameter '", name, "' is ", shape,
                  " on stage ", entry->second.second.front(), " but ", shape, " on stage ", stage,
                  ": stages that share a parameter (a tied layer) must hold it in the same shape");
      entry->second.second.push_back(stage);
    }
  }
  // One group per set of stages that share parameters, in the same order on every rank: the ranks
  // of those stages with this rank's tensor index (every data index: each contributes its part).
  std::map<std::vector<int>, engine_detail::ParallelContext::Group> groups;
  for (const auto& [name, held] : holders) {
    if (held.second.size() > 1) groups.try_emplace(held.second);
  }
  std::int64_t sets[2] = {static_cast<std::int64_t>(groups.size()),
                          -static_cast<std::int64_t>(groups.size())};
  parallel_.everyone().all_reduce(sets, sets, 2, DType::int64, ReduceOp::max);
  ZT_CHECK_AS(
      ConfigError, sets[0] == -sets[1], "ranks see ", -sets[1], " to ", sets[0],
      " sets of pipeline stages sharing parameters: every data-parallel rank of a stage must build the "
      "same layers");
  const int stage = stage_model_->stage();
  for (auto& [stages, group] : groups) {
    std::string name = "tied";
    for (int s : stages) name.append(".").append(std::to_string(s));
    const bool member = std::find(stages.begin(), stages.end(), stage) != stages.end();
    group = parallel_.split(member ? parallel_.tensor().rank() : -1, name);
  }
  for (std::size_t i = 0; i < plan_.size(); ++i) {
    const std::vector<int>& stages = holders.at(plan_.layout()[i].name).second;
    if (stages.size() < 2) continue;
    TiedParameter tied{.index = i, .group = groups.at(stages), .owner = stages.front() == stage};
    counts_in_norm_[i] = tied.owner ? 1 : 0;
    // The lowest stage's values (its first data rank is the group's rank 0) for every copy.
    nn::Parameter& parameter = *parameters_[i];
    tied.group.device->broadcast(parameter.value.raw_data(),
                                 static_cast<std::size_t>(parameter.value.numel()), parameter.value.dtype(),
                                 0);
    tied_.push_back(std::move(tied));
  }
}

void Engine::Impl::reduce_tied_gradients() {
  // After the data-parallel reduction each rank holds its owned range of the reduced gradient.
  // Each data rank puts its disjoint part (the checkpoint range) into a zeroed full-size buffer;
  // the sum over the tied group is then the sum over the stages' copies, of which each rank takes
  // its owned range back.
  const std::size_t element = dtype_size(compute_dtype_);
  for (const TiedParameter& tied : tied_) {
    const FlatParameter& slot = plan_.layout()[tied.index];
    const engine_detail::OwnedRange& owned = plan_.owned()[tied.index];
    const std::int64_t owned_first = owned.flat_begin - slot.offset;
    const std::int64_t owned_count = std::clamp<std::int64_t>(slot.numel - owned_first, 0, owned.count);
    const auto [first, count] = plan_.checkpoint_range(tied.index);
    Buffer full =
        execution_.allocate(static_cast<std::size_t>(slot.numel) * element, MemoryCategory::gradients);
    execution_.zero(full.data(), full.size());
    std::byte* gradient = strategy_->gradient(tied.index);
    execution_.copy(full.as<std::byte>() + static_cast<std::size_t>(first) * element,
                    gradient + static_cast<std::size_t>(first - owned_first) * element,
                    static_cast<std::size_t>(count) * element);
    const auto started = base::Clock::now();
    tied.group.device->all_reduce(full.data(), full.data(), static_cast<std::size_t>(slot.numel),
                                  compute_dtype_, ReduceOp::sum);
    step_wait_seconds_ += base::seconds_since(started);
    execution_.copy(gradient, full.as<std::byte>() + static_cast<std::size_t>(owned_first) * element,
                    static_cast<std::size_t>(owned_count) * element);
  }
}

const StepReport& Engine::Impl::train_pipelined(const std::function<Batch(std::int64_t)>& micro_batch) {
  const std::int64_t accumulation = batch().gradient_accumulation_steps;
  const bool first = stage_model_->is_first();
  const bool last = stage_model_->is_last();
  const engine_detail::PipeSchedule schedule = engine_detail::make_pipe_schedule(
      config_.pipeline.schedule == PipelineSchedule::gpipe ? engine_detail::PipeScheduleKind::gpipe
                                                           : engine_detail::PipeScheduleKind::one_f_one_b,
      stage_model_->stages(), stage_model_->stage(), static_cast<int>(accumulation));
  mark_step_start();
  model_.train();
  engine_detail::PipelineStageWork work;
  work.load = [&](std::int64_t micro) {
    Batch next = micro_batch(micro);
    ZT_CHECK(!first || next.inputs.defined(), "Engine::train_batch: micro-batch ", micro,
             " has no inputs (the first pipeline stage feeds them to the model)");
    ZT_CHECK(!last || next.targets.defined(), "Engine::train_batch: micro-batch ", micro,
             " has no targets (the last pipeline stage computes the loss)");
    return next;
  };
  work.forward = [&](const Tensor& input, std::int64_t micro, const Batch& loaded) {
    strategy_->begin_forward(true);
    Tensor output =
        model_.run_forward(execution_.on_device(input),
                           {.execution = &execution_, .micro_batch = static_cast<std::uint32_t>(micro)});
    if (last) pipeline_losses_.emplace_back(micro, builtin_loss(output, loaded.targets));
    return output;
  };
  work.backward = [&](const Tensor& grad_output, std::int64_t micro) {
    Tensor gradient = grad_output;
    if (last) {
      ZT_CHECK(!pipeline_losses_.empty() && pipeline_losses_.front().first == micro,
               "pipeline: the backward of micro-batch ", micro, " on the last stage without its loss");
      const Loss loss = std::move(pipeline_losses_.front().second);
      pipeline_losses_.pop_front();
      gradient = loss.gradient(backward_scale());
      kernels::accumulate(execution_.compute(), DType::fp64, loss_sum_.data(), loss.value.raw_data(), 1);
      ++accumulated_micro_batches_;
    }
    strategy_->begin_backward(
        {.first_of_step = backwards_this_step_ == 0, .boundary = backwards_this_step_ + 1 == accumulation});
    Tensor grad_input = model_.run_backward(
        gradient, {.execution = &execution_, .micro_batch = static_cast<std::uint32_t>(micro)});
    strategy_->end_backward();
    ++backwards_this_step_;
    return grad_input;
  };
  work.reduce_tied_gradients = [&] { reduce_tied_gradients(); };
  work.reduce_gradients = [] {};  // the ZeRO strategy reduced them in the backward passes
  work.optimizer_step = [&] {
    progress_.micro_steps += accumulation - 1;  // step() counts the last micro-batch
    step();
  };
  try {
    const PipelineTiming timing = pipeline_executor_->run(schedule, work);
    last_step_.pipeline = timing;
  } catch (...) {
    model_.release_activations();
    pipeline_losses_.clear();
    throw;
  }
  return last_step_;
}

double Engine::Impl::eval_pipelined(const Batch& batch) {
  const engine_detail::PipeSchedule schedule = engine_detail::make_pipe_schedule(
      engine_detail::PipeScheduleKind::inference, stage_model_->stages(), stage_model_->stage(), 1);
  const bool last = stage_model_->is_last();
  double value = 0;
  engine_detail::PipelineStageWork work;
  work.load = [&](std::int64_t) { return batch; };
  work.forward = [&](const Tensor& input, std::int64_t, const Batch& loaded) {
    strategy_->begin_forward(false);
    Tensor output = model_.run_forward(execution_.on_device(input),
                                       {.execution = &execution_, .save_for_backward = false});
    if (last) {
      const Loss loss = builtin_loss(output, loaded.targets);
      read_device_scalar(execution_, &value, loss.value.raw_data());
    }
    return output;
  };
  const EvalModeScope eval_mode(model_);
  pipeline_executor_->run(schedule, work);
  parallel_.pipeline().host->all_reduce(&value, &value, 1, DType::fp64,
                                        ReduceOp::sum);  // from the last stage
  return value;
}

std::vector<double> Engine::Impl::row_losses(const Tensor& output, const Tensor& targets) const {
  const Tensor on_device = execution_.on_device(targets);
  const std::int64_t rows = output.ndim() > 0 ? output.size(0) : 0;
  ZT_CHECK(rows > 0 && on_device.ndim() > 0 && on_device.size(0) == rows, "Engine::eval_rows: output ",
           output.description(), " and targets ", on_device.description(),
           " need the same rows (dimension 0)");
  const Shape output_row(output.shape().begin() + 1, output.shape().end());
  const Shape target_row(on_device.shape().begin() + 1, on_device.shape().end());
  const std::int64_t output_elements = output.numel() / rows;
  const std::int64_t target_elements = on_device.numel() / rows;
  std::vector<double> values(static_cast<std::size_t>(rows));
  for (std::int64_t row = 0; row < rows; ++row) {
    const Tensor row_output = output.flat_slice(row * output_elements, output_elements).reshape(output_row);
    const Tensor row_targets =
        on_device.flat_slice(row * target_elements, target_elements).reshape(target_row);
    const Loss loss = on_device.dtype() == DType::int32
                          ? cross_entropy_loss(row_output, row_targets, execution_)
                          : mse_loss(row_output, row_targets, execution_);
    read_device_scalar(execution_, &values[static_cast<std::size_t>(row)], loss.value.raw_data());
  }
  return values;
}

std::vector<double> Engine::Impl::eval_rows_pipelined(const Batch& batch) {
  const engine_detail::PipeSchedule schedule = engine_detail::make_pipe_schedule(
      engine_detail::PipeScheduleKind::inference, stage_model_->stages(), stage_model_->stage(), 1);
  const bool last = stage_model_->is_last();
  std::vector<double> values(static_cast<std::size_t>(batch.inputs.size(0)), 0.0);
  engine_detail::PipelineStageWork work;
  work.load = [&](std::int64_t) { return batch; };
  work.forward = [&](const Tensor& input, std::int64_t, const Batch& loaded) {
    strategy_->begin_forward(false);
    Tensor output = model_.run_forward(execution_.on_device(input),
                                       {.execution = &execution_, .save_for_backward = false});
    if (last) values = row_losses(output, loaded.targets);
    return output;
  };
  const EvalModeScope eval_mode(model_);
  pipeline_executor_->run(schedule, work);
  // Only the last stage holds the values: the sum adds zeros to them, exact in any order.
  parallel_.pipeline().host->all_reduce(values.data(), values.data(), values.size(), DType::fp64,
                                        ReduceOp::sum);
  return values;
}

void Engine::Impl::update_part(std::size_t index, std::int64_t begin, std::int64_t end, float* master,
                               std::span<float* const> state, float grad_scale, float lr) {
  const engine_detail::OwnedRange& range = plan_.owned()[index];
  const std::size_t element = dtype_size(compute_dtype_);
  const std::size_t in_range = static_cast<std::size_t>(begin - range.shard_begin);
  const std::size_t count = static_cast<std::size_t>(end - begin);
  const GradBuffer gradient{strategy_->gradient(index) + in_range * element, compute_dtype_};
  // Where the new parameters go in the compute dtype: with a separate fp32 master the fused update
  // writes the 16-bit copy (or, in fp32 with the parameters on NVMe, the master is copied out);
  // otherwise the master is the parameter itself.
  std::byte* target =
      plan_.separate_master() ? strategy_->update_target(index) + in_range * element : nullptr;
  HalfParamBuffer half;
  if (compute_dtype_ != DType::fp32) half = {target, compute_dtype_};
  states_->optimizer().update_range({master, count}, state, gradient, grad_scale, lr, half);
  if (target != nullptr && compute_dtype_ == DType::fp32)
    execution_.copy(target, master, count * sizeof(float));
  if (end == range.shard_begin + range.count) strategy_->commit(index);  // the range is complete
}

bool Engine::Impl::step() {
  ZT_CHECK(!pending_loss_, "Engine::step called after forward() without backward()");
  const std::int64_t accumulation = batch().gradient_accumulation_steps;
  const bool boundary = (progress_.micro_steps + 1) % accumulation == 0;
  ZT_CHECK(!boundary || external_ != nullptr || (backwards_this_step_ == accumulation && in_flight_.empty()),
           "Engine::step at the accumulation boundary after ", backwards_this_step_, " backward pass(es) of ",
           accumulation, " (", in_flight_.size(),
           " forward(s) still waiting): every micro-batch of the step needs its forward and backward first");
  mark_step_start();
  ++progress_.micro_steps;
  if (!boundary) return false;
  backwards_this_step_ = 0;

  if (external_ != nullptr) strategy_->take_external_gradients();

  // Overflow check and norm over this rank's (reduced) gradients, unscaled, summed on the device; a
  // parameter replicated across the tensor group counts once.
  const double scale_used = loss_scaler_.loss_scale();
  auto* partial = static_cast<kernels::GradCheckScalars*>(grad_check_.data());
  execution_.zero(grad_check_.data(), grad_check_.size());
  for (std::size_t i = 0; i < plan_.size(); ++i) {
    if (plan_.layout()[i].role == nn::ParallelRole::replicated && parallel_.tensor().rank() != 0) continue;
    if (!counts_in_norm_[i]) continue;  // a tied copy: the lowest stage that holds it counts it
    kernels::grad_sum_squares(execution_.compute(), strategy_->gradient(i), compute_dtype_,
                              static_cast<std::size_t>(plan_.owned()[i].count), 1.0 / scale_used, partial);
  }
  // Each rank saw its pieces (when the optimizer states are partitioned) and its slice of the
  // tensor-parallel parameters: the global norm and the overflow flag are sums over those groups.
  engine_detail::GroupSpan span = engine_detail::GroupSpan::tensor | engine_detail::GroupSpan::pipeline;
  if (plan_.partition_count() > 1) span = span | engine_detail::GroupSpan::data;
  if (plan_.partition_count() > 1 || parallel_.tensor().size() > 1 || parallel_.pipeline().size() > 1) {
    const auto started = base::Clock::now();
    parallel_.sum(partial, 2, DType::fp64, span);
    step_wait_seconds_ += base::seconds_since(started);
  }
  // The one read of the step that steers control flow: skip or update, and the clip coefficient.
  kernels::GradCheckScalars summed;
  execution_.to_host(&summed, partial, sizeof summed);
  const kernels::GradCheck check{summed.sum_sq, summed.found_inf > 0};
  const bool overflow = loss_scaler_.checks_overflow() && check.found_inf;
  const bool skip = loss_scaler_.update(overflow);
  const kernels::GradClip clip = kernels::clip_from_sum_squares(check.sum_sq, config_.gradient_clipping);

  StepReport report;
  report.lr = lr();
  report.loss_scale = scale_used;
  report.skipped = skip;
  report.grad_norm = check.found_inf ? std::numeric_limits<double>::quiet_NaN() : clip.norm;
  if (!skip) {
    Optimizer& optimizer = states_->optimizer();
    if (scheduler_) {
      if (const auto betas = scheduler_->betas(); betas && config_.optimizer->type != OptimizerType::sgd) {
        OptimizerParams hyperparameters = optimizer.hyperparameters();
        hyperparameters.beta1 = static_cast<float>(betas->beta1);
        hyperparameters.beta2 = static_cast<float>(betas->beta2);
        optimizer.set_hyperparameters(hyperparameters);
      }
    }
    const double coefficient = config_.gradient_clipping > 0 ? clip.coefficient : 1.0;
    const float grad_scale = kernels::combined_grad_scale(scale_used, coefficient);
    const auto learning_rate = static_cast<float>(report.lr);
    report.offload =
        states_->update(grad_scale, learning_rate,
                        [&](std::size_t index, std::int64_t begin, std::int64_t end, float* master,
                            std::span<float* const> state) {
                          update_part(index, begin, end, master, state, grad_scale, learning_rate);
                        });
    strategy_->after_update();
    if (scheduler_) scheduler_->step();
  } else {
    ++progress_.skipped_steps;
  }
  strategy_->clear_gradients();
  if (external_ != nullptr) {
    for (nn::Parameter* parameter : parameters_) execution_.zero(parameter->grad);
    const auto [loss_sum, loss_count] = external_->take_losses();
    accumulated_loss_ += loss_sum;
    accumulated_micro_batches_ += loss_count;
  }
  const TrafficCounter traffic = model_traffic();
  report.comm_bytes = traffic.wire_bytes - wire_bytes_at_step_start_;  // this step's model traffic
  report.comm.busy_seconds = traffic.seconds - comm_seconds_at_step_start_;
  report.comm.wait_seconds = total_wait_seconds() - wait_seconds_at_step_start_;
  const OffloadTiming swap_now = strategy_->parameter_swap_counters();
  report.offload.parameter_bytes_read =
      swap_now.parameter_bytes_read - parameter_swap_at_step_start_.parameter_bytes_read;
  report.offload.parameter_bytes_written =
      swap_now.parameter_bytes_written - parameter_swap_at_step_start_.parameter_bytes_written;
  report.offload.parameter_wait_seconds =
      swap_now.parameter_wait_seconds - parameter_swap_at_step_start_.parameter_wait_seconds;
  step_started_ = false;

  // The reported loss is the mean over micro-batches and data-parallel ranks (identical on every
  // rank); the built-in losses' sum comes from the device, in one read.
  double device_loss_sum = 0;
  read_device_scalar(execution_, &device_loss_sum, loss_sum_.data());
  execution_.zero(loss_sum_.data(), loss_sum_.size());
  double loss_sum[2] = {accumulated_loss_ + device_loss_sum, static_cast<double>(accumulated_micro_batches_)};
  parallel_.data().host->all_reduce(loss_sum, loss_sum, 2, DType::fp64, ReduceOp::sum);
  // Only the last pipeline stage computes losses.
  if (parallel_.pipeline().size() > 1)
    parallel_.pipeline().host->all_reduce(loss_sum, loss_sum, 2, DType::fp64, ReduceOp::sum);
  report.loss = loss_sum[1] > 0 ? loss_sum[0] / loss_sum[1] : 0.0;
  accumulated_loss_ = 0.0;
  accumulated_micro_batches_ = 0;

  ++progress_.global_steps;
  progress_.global_samples += batch().train_batch_size;
  report.step = progress_.global_steps;
  last_step_ = report;
  return true;
}

double Engine::Impl::eval(const Batch& batch) {
  ZT_CHECK(batch.inputs.defined() && batch.targets.defined(),
           "Engine::eval: the batch needs inputs and targets");
  ZT_CHECK(in_flight_.empty() && !pending_loss_,
           "Engine::eval while a forward waits for its backward; call backward() first");
  if (stage_model_ != nullptr) return eval_pipelined(batch);
  const Loss loss = [&] {
    const EvalModeScope eval_mode(model_);
    strategy_->begin_forward(false);
    const Tensor output = model_.run_forward(execution_.on_device(batch.inputs),
                                             {.execution = &execution_, .save_for_backward = false});
    return builtin_loss(output, batch.targets);
  }();
  double value = 0;
  read_device_scalar(execution_, &value, loss.value.raw_data());
  return value;
}

std::vector<double> Engine::Impl::eval_rows(const Batch& batch) {
  ZT_CHECK(batch.inputs.defined() && batch.targets.defined() && batch.inputs.ndim() > 0,
           "Engine::eval_rows: the batch needs inputs and targets");
  ZT_CHECK(in_flight_.empty() && !pending_loss_,
           "Engine::eval_rows while a forward waits for its backward; call backward() first");
  if (stage_model_ != nullptr) return eval_rows_pipelined(batch);
  const EvalModeScope eval_mode(model_);
  strategy_->begin_forward(false);
  const Tensor output = model_.run_forward(execution_.on_device(batch.inputs),
                                           {.execution = &execution_, .save_for_backward = false});
  return row_losses(output, batch.targets);
}

engine_detail::TrainingState Engine::Impl::training_state() {
  return {.progress = progress_,
          .loss_scaler = loss_scaler_,
          .scheduler = scheduler_.get(),
          .config = config_,
          .gradient_accumulation_steps = batch().gradient_accumulation_steps,
          .train_batch_size = batch().train_batch_size};
}

std::string Engine::Impl::save_checkpoint(const std::string& dir, const SaveOptions& options) {
  const std::int64_t accumulation = batch().gradient_accumulation_steps;
  ZT_CHECK(
      in_flight_.empty() && !pending_loss_ && progress_.micro_steps % accumulation == 0,
      "save_checkpoint at micro-step ", progress_.micro_steps % accumulation, " of ", accumulation,
      ": save at an accumulation boundary (after the step() that updates), where no gradient is pending");
  return checkpointer_->save(dir, options, training_state());
}

LoadResult Engine::Impl::load_checkpoint(const std::string& dir, const LoadOptions& options) {
  LoadResult result = checkpointer_->load(dir, options, training_state());
  accumulated_loss_ = 0.0;
  accumulated_micro_batches_ = 0;
  execution_.zero(loss_sum_.data(), loss_sum_.size());
  backwards_this_step_ = 0;
  step_started_ = false;
  return result;
}

std::vector<float> Engine::Impl::master_parameters() {
  std::vector<float> shard(static_cast<std::size_t>(plan_.shard_size()), 0.0f);
  for (std::size_t i = 0; i < plan_.size(); ++i)
    states_->read_master(i, shard.data() + plan_.owned()[i].shard_begin);
  states_->flush();
  return shard;
}

std::vector<float> Engine::Impl::gather_master_parameters() {
  const std::vector<float> mine = master_parameters();
  // Without partitioning the shard is the flat layout; with it (even on one rank) the shard packs
  // the pieces without the flat layout's alignment.
  if (!plan_.partitioning().optimizer_states) return mine;
  const int ranks = plan_.partition_count();
  std::vector<float> all(mine.size() * static_cast<std::size_t>(ranks));
  parallel_.data().host->all_gather(mine.data(), all.data(), mine.size(), DType::fp32);
  std::vector<float> flat(static_cast<std::size_t>(plan_.flat_size()), 0.0f);
  for (const FlatParameter& slot : plan_.layout()) {
    for (int q = 0; q < ranks; ++q) {
      const std::int64_t begin = q * slot.piece_numel;
      const std::int64_t real = std::clamp<std::int64_t>(slot.numel - begin, 0, slot.piece_numel);
      std::copy_n(all.data() + q * plan_.shard_size() + slot.shard_offset, real,
                  flat.data() + slot.offset + begin);
    }
  }
  return flat;
}

// ---- Engine: the public surface ----------------------------------------------------------------

Engine::Engine(Runtime& runtime, nn::Module& model, Config config, EngineOptions options)
    : impl_(std::make_unique<Impl>(runtime, model, std::move(config), options)) {}
Engine::~Engine() = default;

Tensor Engine::forward(const Tensor& inputs) {
  return impl_->forward(inputs);
}
void Engine::backward(const Loss& loss) {
  impl_->backward(loss);
}
void Engine::backward(const Tensor& grad_output, std::optional<double> loss) {
  impl_->backward(grad_output, loss);
}
const StepReport& Engine::train_batch(const std::function<Batch(std::int64_t)>& micro_batch) {
  return impl_->train_batch(micro_batch);
}
double Engine::forward(const Batch& batch) {
  return impl_->forward(batch);
}
void Engine::backward() {
  impl_->backward();
}
bool Engine::step() {
  return impl_->step();
}
double Engine::eval(const Batch& batch) {
  return impl_->eval(batch);
}
std::vector<double> Engine::eval_rows(const Batch& batch) {
  return impl_->eval_rows(batch);
}
std::string Engine::save_checkpoint(const std::string& dir, const SaveOptions& options) {
  return impl_->save_checkpoint(dir, options);
}
LoadResult Engine::load_checkpoint(const std::string& dir, const LoadOptions& options) {
  return impl_->load_checkpoint(dir, options);
}
std::size_t Engine::load_weights(const std::string& path) {
  return impl_->checkpointer_->load_weights(path);
}
std::vector<std::string> Engine::frozen_parameters() const {
  std::vector<std::string> names;
  for (const nn::Parameter* parameter : impl_->frozen_) names.push_back(parameter->name);
  return names;
}
std::int64_t Engine::frozen_parameter_count() const {
  std::int64_t count = 0;
  for (const nn::Parameter* parameter : impl_->frozen_) count += parameter->value.numel();
  return count;
}
bool Engine::is_gradient_accumulation_boundary() const {
  return impl_->is_gradient_accumulation_boundary();
}
std::int64_t Engine::global_steps() const {
  return impl_->progress_.global_steps;
}
std::int64_t Engine::global_samples() const {
  return impl_->progress_.global_samples;
}
std::int64_t Engine::micro_steps() const {
  return impl_->progress_.micro_steps;
}
std::int64_t Engine::skipped_steps() const {
  return impl_->progress_.skipped_steps;
}
double Engine::lr() const {
  return impl_->lr();
}
double Engine::loss_scale() const {
  return impl_->loss_scaler_.loss_scale();
}
const StepReport& Engine::last_step() const {
  return impl_->last_step_;
}
const Config& Engine::config() const {
  return impl_->config_;
}
const BatchSizes& Engine::batch() const {
  return impl_->batch();
}
DType Engine::compute_dtype() const {
  return impl_->compute_dtype_;
}
Device Engine::device() const {
  return impl_->execution_.device();
}
const ExecutionContext& Engine::execution() const {
  return impl_->execution_;
}
nn::Module& Engine::model() {
  return impl_->model_;
}
Optimizer& Engine::optimizer() {
  return impl_->states_->optimizer();
}
LRScheduler* Engine::lr_scheduler() {
  return impl_->scheduler_.get();
}
Communicator& Engine::data_parallel() {
  return *impl_->parallel_.data().host;
}
int Engine::data_parallel_rank() const {
  return impl_->parallel_.data().rank();
}
int Engine::data_parallel_size() const {
  return impl_->parallel_.data().size();
}
std::int64_t Engine::parameter_count() const {
  return impl_->plan_.parameter_count();
}
int Engine::zero_stage() const {
  return impl_->plan_.settings().stage;
}
OptimizerStatesPlacement Engine::optimizer_states_placement() const {
  return impl_->states_->placement();
}
ParametersPlacement Engine::parameters_placement() const {
  return impl_->strategy_->parameters_placement();
}

namespace {
std::string memory_name(Device memory) {
  return memory.is_host() ? std::string("host memory") : memory.str() + " memory";
}
}  // namespace

std::string ParametersPlacement::describe() const {
  const char* pinned = host_pinned ? ", page-locked" : "";
  if (swap_file.empty()) {
    return device == OffloadDevice::cpu ? detail::concat("host memory (offload_param: cpu", pinned, ")")
                                        : memory_name(memory);
  }
  if (nvme_elements == 0) {
    return detail::concat("host memory", host_pinned ? " (page-locked)" : "", ": all ", host_elements,
                          " elements fit in offload_param.max_in_cpu, none go to the nvme swap file ",
                          swap_file, " (lower max_in_cpu, e.g. to 0, to move parameters to NVMe)");
  }
  return detail::concat("nvme swap file ", swap_file, " (", swap_backend, ", ", swap_bytes,
                        " bytes): ", nvme_elements, " elements on NVMe, ", host_elements,
                        " in host memory (offload_param.max_in_cpu", pinned, "), read through ", buffer_count,
                        " buffer(s) of ", buffer_bytes, " bytes in all",
                        buffer_bytes > swap_bytes
                            ? " (more than the pieces on NVMe: each buffer holds the largest piece; lower "
                              "buffer_count, or keep the largest parameters in host memory with max_in_cpu)"
                            : "");
}

std::string OptimizerStatesPlacement::describe() const {
  if (swap_file.empty()) {
    return device == OffloadDevice::cpu ? "host memory (offload_optimizer: cpu)" : memory_name(memory);
  }
  return detail::concat(
      "nvme swap file ", swap_file, " (", swap_backend, ", ", swap_bytes, " bytes",
      master_in_swap ? ", fp32 master included" : "", "), ", sub_groups, " sub-group(s) of up to ",
      sub_group_elements, " elements through ", buffer_bytes, " bytes of host buffers",
      staging_bytes > 0 ? detail::concat(" and ", staging_bytes, " bytes of device staging") : std::string());
}

// ---- the engine's internal views -------------------------------------------------------------

namespace engine_detail {

EngineInspection EngineAccess::inspect(Engine& engine) {
  return EngineInspection(*engine.impl_);
}

const PartitionPlan& EngineInspection::plan() const {
  return impl_.plan_;
}
std::vector<float> EngineInspection::master_parameters() {
  return impl_.master_parameters();
}
std::vector<float> EngineInspection::gather_master_parameters() {
  return impl_.gather_master_parameters();
}
std::int64_t EngineInspection::peak_gathered_parameters() const {
  return impl_.strategy_->peak_gathered_parameters();
}
CommBackend EngineInspection::data_group_backend() const {
  return impl_.parallel_.data().device->backend();
}

}  // namespace engine_detail

std::unique_ptr<Engine> initialize(Runtime& runtime, nn::Module& model, Config config,
                                   EngineOptions options) {
  return std::make_unique<Engine>(runtime, model, std::move(config), options);
}

}  // namespace zt
