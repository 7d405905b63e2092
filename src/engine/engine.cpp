// zt::Engine: the training loop's state machine (micro-steps, accumulation boundary, update).
#include "zerotrain/engine.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>
#include <unordered_map>

#include "kernels/nn_kernels.hpp"
#include "kernels/optimizer_kernels.hpp"
#include "src/engine/gradient_reducer.hpp"
#include "src/engine/parameter_gatherer.hpp"
#include "src/engine/parameter_store.hpp"
#include "src/engine/swapped_optimizer_states.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/external_model.hpp"
#include "zerotrain/runtime.hpp"
#include "zerotrain/swap.hpp"

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

/// The parts of `ranges` (shard ranges in shard order) that overlap [first, first + count), as
/// (range, begin, end) in shard elements; `cursor` remembers where to start for the next, later
/// window.
template <typename Range, typename Visit>
void for_each_overlap(const std::vector<Range>& ranges, std::size_t& cursor, std::int64_t first,
                      std::int64_t count, Visit&& visit) {
  while (cursor < ranges.size() && ranges[cursor].shard_begin + ranges[cursor].count <= first) ++cursor;
  for (std::size_t i = cursor; i < ranges.size() && ranges[i].shard_begin < first + count; ++i) {
    const std::int64_t begin = std::max(first, ranges[i].shard_begin);
    const std::int64_t end = std::min(first + count, ranges[i].shard_begin + ranges[i].count);
    if (end > begin) visit(ranges[i], begin, end);
  }
}

}  // namespace

void check_engine_supports(const Config& config) {
  const auto& zero = config.zero_optimization;
  const OffloadParamConfig& offload_param = zero.offload_param;
  if (offload_param.device != OffloadDevice::none) {
    ZT_CHECK_AS(ConfigError, zero.stage == 3, "zero_optimization.offload_param needs ZeRO stage 3, but ",
                "zero_optimization.stage is ", zero.stage);
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
    ZT_CHECK_AS(ConfigError, zero.stage >= 1,
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

/// A module whose forward and backward read parameters (its own and borrowed ones), with the hooks
/// the engine put on it.
struct Engine::ModuleUse {
  std::size_t index = 0;  // in module_uses_
  nn::Module* module = nullptr;
  std::vector<std::size_t> parameters;  // indices into layout_
  std::vector<nn::HookHandle> hooks;
};

Engine::Engine(Runtime& runtime, nn::Module& model, Config config, EngineOptions options)
    : runtime_(runtime),
      model_(model),
      config_(std::move(config)),
      grid_(options.data_parallel ? nullptr : std::make_unique<ProcessGrid>(runtime, GridShape{0, 1, 1})),
      data_(options.data_parallel ? options.data_parallel : &grid_->data()),
      external_(dynamic_cast<ExternalModel*>(&model)),
      compute_dtype_(compute_dtype_of(config_)),
      stage_(config_.zero_optimization.stage),
      loss_scaler_(compute_dtype_, loss_scaler_params_of(config_)) {
  config_.resolve_batch(data_->size());
  use_cores_of_this_node(runtime_);
  check_engine_supports(config_);
  ZT_CHECK_AS(ConfigError, config_.optimizer.has_value(),
              "the config has no \"optimizer\" section; zerotrain needs one, e.g. "
              "{\"type\": \"AdamW\", \"params\": {\"lr\": 6e-4}} (types: adam, adamw, sgd)");
  ZT_CHECK_AS(
      ConfigError, external_ == nullptr || stage_ <= 2, "zero_optimization.stage is ", stage_,
      ": a zt::ExternalModel (parameters in the caller's buffers) trains with ZeRO stages 0-2; stage 3 "
      "gathers parameters around each module's forward, which needs zerotrain's own modules");
  if (runtime_.world_rank() == 0) {
    loss_scaler_.set_log_sink(
        [](std::string_view line) { std::fprintf(stderr, "%.*s\n", int(line.size()), line.data()); });
  } else {
    loss_scaler_.set_log_sink([](std::string_view) {});
  }

  parameters_list_ = model_.parameters();
  build_layout();
  build_buffers();

  const auto& zero = config_.zero_optimization;
  engine_detail::GradientReducerOptions reduction;
  reduction.destination = stage_ == 0   ? engine_detail::GradientDestination::flat_whole
                          : stage_ == 1 ? engine_detail::GradientDestination::flat_own_piece
                                        : engine_detail::GradientDestination::shard;
  reduction.gradient_dtype = compute_dtype_;
  reduction.wire_dtype = config_.communication_data_type.value_or(compute_dtype_);
  reduction.op = config_.gradient_allreduce_op == GradientReduceOp::sum ? ReduceOp::sum : ReduceOp::avg;
  reduction.bucket_elements = zero.reduce_bucket_size;
  reduction.overlap = zero.overlap_comm;
  reducer_ = std::make_unique<engine_detail::GradientReducer>(*data_, layout_, reduction, gradients_.data());

  if (external_ == nullptr) install_hooks();
  build_optimizer();
  // With offload_param "nvme" the parameter store holds the pieces now; the optimizer's master was
  // initialized from this buffer above.
  if (parameters_on_nvme_) parameters_ = Buffer();
  if (config_.scheduler) {
    scheduler_ = make_lr_scheduler(config_.scheduler->params, config_.optimizer->lr);
    if (config_.scheduler->last_batch_iteration >= 0)
      scheduler_->step(config_.scheduler->last_batch_iteration);
  }
}

Engine::~Engine() {
  for (const auto& use : module_uses_) {
    for (const nn::HookHandle handle : use->hooks) use->module->remove_hook(handle);
  }
}

void Engine::build_layout() {
  ZT_CHECK(!parameters_list_.empty(), "the model has no parameters to train");
  // Stages 1-3 split every parameter evenly over the data-parallel ranks; stage 0 does not split.
  const int parts = stage_ >= 1 ? data_->size() : 1;
  const int rank = stage_ >= 1 ? data_->rank() : 0;
  std::int64_t offset = 0;
  std::int64_t shard = 0;
  for (const nn::Parameter* parameter : parameters_list_) {
    ZT_CHECK(parameter->value.defined(), "parameter '", parameter->name, "' has no value");
    ZT_CHECK_AS(
        ConfigError, parameter->value.dtype() == compute_dtype_, "parameter '", parameter->name, "' is ",
        dtype_name(parameter->value.dtype()), " but the config trains in ", dtype_name(compute_dtype_),
        " (bf16.enabled / fp16.enabled): build the model in the compute dtype (zt::build_model does)");
    ZT_CHECK(parameter->value.device().is_host(), "parameter '", parameter->name, "' is on ",
             parameter->value.device().str(), "; the engine trains on the host in this build");
    FlatParameter slot;
    slot.name = parameter->name;
    slot.shape = parameter->value.shape();
    slot.numel = parameter->value.numel();
    slot.piece_numel = (slot.numel + parts - 1) / parts;
    slot.padded_numel = slot.piece_numel * parts;
    slot.offset = offset;
    slot.shard_offset = stage_ == 0 ? offset : shard;
    OwnedRange owned;
    owned.flat_begin = offset + rank * slot.piece_numel;
    owned.shard_begin = stage_ == 0 ? offset : shard;
    owned.count = stage_ == 0 ? slot.numel : slot.piece_numel;
    layout_.push_back(slot);
    owned_.push_back(owned);
    parameter_count_ += slot.numel;
    offset += round_up(slot.padded_numel, kFlatAlignment);
    shard += slot.piece_numel;
  }
  flat_size_ = offset;
  shard_size_ = stage_ == 0 ? flat_size_ : shard;
}

void Engine::build_buffers() {
  const std::size_t element = dtype_size(compute_dtype_);
  const int rank = stage_ >= 1 ? data_->rank() : 0;
  // Stages 0-2 keep every parameter in one flat buffer; stage 3 keeps this rank's pieces only.
  const std::int64_t parameter_elements = stage_ <= 2 ? flat_size_ : shard_size_;
  parameters_ = Buffer(Device::host(), static_cast<std::size_t>(parameter_elements) * element,
                       MemoryCategory::parameters);
  std::memset(parameters_.data(), 0, parameters_.size());  // padding stays zero: no update moves it
  // Stages 0-1 accumulate whole gradients in a flat buffer; stages 2-3 keep the reduced shard only.
  const std::int64_t gradient_elements = stage_ <= 1 ? flat_size_ : shard_size_;
  gradients_ = Buffer(Device::host(), static_cast<std::size_t>(gradient_elements) * element,
                      MemoryCategory::gradients);
  std::memset(gradients_.data(), 0, gradients_.size());

  for (std::size_t i = 0; i < parameters_list_.size(); ++i) {
    nn::Parameter& parameter = *parameters_list_[i];
    const FlatParameter& slot = layout_[i];
    if (stage_ <= 2) {
      Tensor flat_value =
          Tensor::view_of(parameters_.as<std::byte>() + static_cast<std::size_t>(slot.offset) * element,
                          slot.shape, compute_dtype_);
      flat_value.copy_from(parameter.value);
      if (external_ == nullptr) parameter.value = flat_value;  // the model's own storage is released
    } else {
      const std::int64_t begin = rank * slot.piece_numel;
      const std::int64_t real = std::clamp<std::int64_t>(slot.numel - begin, 0, slot.piece_numel);
      if (real > 0) {
        std::memcpy(parameters_.as<std::byte>() + static_cast<std::size_t>(slot.shard_offset) * element,
                    static_cast<const std::byte*>(parameter.value.raw_data()) +
                        static_cast<std::size_t>(begin) * element,
                    static_cast<std::size_t>(real) * element);
      }
    }
    if (external_ != nullptr) continue;  // the caller's gradient buffers stay the caller's
    if (stage_ <= 1) {
      parameter.grad =
          Tensor::view_of(gradients_.as<std::byte>() + static_cast<std::size_t>(slot.offset) * element,
                          slot.shape, compute_dtype_);
    } else {
      parameter.grad = Tensor();  // allocated for each module's backward, freed once reduced
    }
  }
  parameters_on_nvme_ = stage_ == 3 && config_.zero_optimization.offload_param.device == OffloadDevice::nvme;
  master_in_swap_ =
      keeps_separate_master() && config_.zero_optimization.offload_optimizer.device == OffloadDevice::nvme;
  if (keeps_separate_master() && !master_in_swap_) {
    // fp32 master weights belong with the optimizer states (the 12 bytes of K in ZeRO's 16Ψ); at
    // stages 1-3 each rank keeps the master of its pieces only. With the parameters on NVMe, fp32
    // training needs one too: the optimizer cannot update the swap file in place.
    master_ = Buffer(Device::host(), static_cast<std::size_t>(shard_size_) * sizeof(float),
                     MemoryCategory::optimizer_states);
    std::memset(master_.data(), 0, master_.size());
    for (const OwnedRange& range : owned_) {
      kernels::convert(default_stream(Device::host()), parameter_of(range), compute_dtype_, master_of(range),
                       DType::fp32, range.count);
    }
  }
  if (stage_ == 3) build_parameter_store();
}

void Engine::build_parameter_store() {
  if (!parameters_on_nvme_) {
    parameter_store_ =
        std::make_unique<engine_detail::ParameterStore>(layout_, compute_dtype_, parameters_.as<std::byte>());
    return;
  }
  const OffloadParamConfig& offload = config_.zero_optimization.offload_param;
  ZT_CHECK_AS(ConfigError, offload.nvme_path.has_value(),
              "zero_optimization.offload_param.nvme_path: required when device is \"nvme\"");
  engine_detail::ParameterStoreOptions options;
  options.dtype = compute_dtype_;
  options.swap = SwapOptions::from_aio(config_.aio, *offload.nvme_path);
  options.swap->rank = runtime_.world_rank();
  options.swap->pin_memory = offload.pin_memory;
  options.max_in_cpu = offload.max_in_cpu;
  options.buffer_elements = offload.buffer_size;
  options.buffer_count = static_cast<std::size_t>(offload.buffer_count);
  parameter_store_ =
      std::make_unique<engine_detail::ParameterStore>(layout_, options, parameters_.as<const std::byte>());
}

void Engine::install_hooks() {
  std::unordered_map<const nn::Parameter*, std::size_t> index_of;
  for (std::size_t i = 0; i < parameters_list_.size(); ++i) index_of[parameters_list_[i]] = i;
  uses_per_parameter_.assign(parameters_list_.size(), 0);
  for (nn::Module* module : model_.modules()) {
    std::vector<std::size_t> used;
    auto add = [&](const nn::Parameter* parameter) {
      const auto found = index_of.find(parameter);
      ZT_CHECK(found != index_of.end(), "module '", module->name(), "' (", module->type_name(),
               ") uses a parameter that is not among the model's parameters");
      if (std::find(used.begin(), used.end(), found->second) == used.end()) used.push_back(found->second);
    };
    for (const nn::Parameter* parameter : module->direct_parameters()) add(parameter);
    for (const nn::Parameter* parameter : module->borrowed_parameters()) add(parameter);
    if (used.empty()) continue;
    auto use = std::make_unique<ModuleUse>();
    use->index = module_uses_.size();
    use->module = module;
    use->parameters = std::move(used);
    for (std::size_t index : use->parameters) ++uses_per_parameter_[index];
    ModuleUse& hooked = *use;
    if (stage_ == 3) {
      use->hooks.push_back(module->add_forward_pre_hook([this, &hooked](nn::Module&, const Tensor&) {
        gatherer_->before(hooked.index, engine_detail::Phase::forward);
      }));
      use->hooks.push_back(
          module->add_forward_post_hook([this, &hooked](nn::Module&, const Tensor&, const Tensor&) {
            gatherer_->after(hooked.index, engine_detail::Phase::forward);
          }));
    }
    use->hooks.push_back(module->add_backward_pre_hook(
        [this, &hooked](nn::Module&, const Tensor&) { on_backward_pre(hooked); }));
    use->hooks.push_back(module->add_backward_post_hook(
        [this, &hooked](nn::Module&, const Tensor&) { on_backward_post(hooked); }));
    module_uses_.push_back(std::move(use));
  }
  pending_uses_ = uses_per_parameter_;
  reduced_this_pass_.assign(parameters_list_.size(), 0);
  if (stage_ == 3) {
    std::vector<std::vector<std::size_t>> uses;
    for (const auto& use : module_uses_) uses.push_back(use->parameters);
    const auto& zero = config_.zero_optimization;
    engine_detail::ParameterGathererOptions gathering;
    gathering.dtype = compute_dtype_;
    gathering.prefetch_elements = zero.stage3_prefetch_bucket_size;
    gathering.persistence_threshold = zero.stage3_param_persistence_threshold;
    gathering.max_live = zero.stage3_max_live_parameters;
    gathering.max_reuse_distance = zero.stage3_max_reuse_distance;
    gathering.allgather_bucket_elements = zero.allgather_bucket_size;
    gatherer_ = std::make_unique<engine_detail::ParameterGatherer>(
        *data_, layout_, parameters_list_, std::move(uses), *parameter_store_, gathering);
  }
}

void Engine::build_optimizer() {
  const OptimizerParams hyperparameters = optimizer_params_of(*config_.optimizer);
  if (config_.zero_optimization.offload_optimizer.device == OffloadDevice::nvme) {
    // The optimizer keeps no state of its own: it updates the sub-groups swapped into the
    // pipeline's buffers (update_range), with its step count and hyperparameters.
    optimizer_ = make_optimizer(to_string(config_.optimizer->type), {}, hyperparameters);
    if (master_in_swap_ || !optimizer_->state_names().empty()) {
      build_swapped_states();
      return;
    }
    // fp32 plain SGD has nothing to offload: the in-memory optimizer below is the same thing.
  }
  std::vector<ParamBuffer> buffers;
  buffers.reserve(owned_.size());
  for (const OwnedRange& range : owned_)
    buffers.push_back({master_of(range), static_cast<std::size_t>(range.count)});
  optimizer_ = make_optimizer(to_string(config_.optimizer->type), std::move(buffers), hyperparameters);
}

void Engine::build_swapped_states() {
  const auto& zero = config_.zero_optimization;
  const OffloadOptimizerConfig& offload = zero.offload_optimizer;
  engine_detail::SwappedStatesOptions options;
  options.swap = SwapOptions::from_aio(config_.aio, *offload.nvme_path);
  options.swap.rank = runtime_.world_rank();
  options.swap.pin_memory = offload.pin_memory;
  options.shard_elements = shard_size_;
  options.arrays = (master_in_swap_ ? 1 : 0) + optimizer_->state_names().size();
  options.sub_group_elements = zero.sub_group_size;
  options.buffer_count = static_cast<std::size_t>(offload.buffer_count);
  swapped_ = std::make_unique<engine_detail::SwappedOptimizerStates>(options);

  // Initial contents, as the in-memory optimizer's: the master converted from the parameters (the
  // padding of the last piece stays zero), moments zero.
  const std::size_t element = dtype_size(compute_dtype_);
  std::size_t cursor = 0;
  swapped_->for_each_sub_group([&](std::int64_t first, std::int64_t count, std::span<float* const> arrays) {
    for (float* array : arrays) std::fill_n(array, count, 0.0f);
    if (!master_in_swap_) return;
    for_each_overlap(
        owned_, cursor, first, count, [&](const OwnedRange& range, std::int64_t begin, std::int64_t end) {
          kernels::convert(default_stream(Device::host()),
                           static_cast<const std::byte*>(parameter_of(range)) +
                               static_cast<std::size_t>(begin - range.shard_begin) * element,
                           compute_dtype_, arrays[0] + (begin - first), DType::fp32, end - begin);
        });
  });
}

OffloadTiming Engine::step_swapped_optimizer(float grad_scale, float lr) {
  optimizer_->begin_step(grad_scale, lr);
  std::vector<float*> state(optimizer_->state_names().size());
  std::size_t cursor = 0;  // owned_ is in shard order, and so are the sub-groups
  const SwapPipeline::Stats stats = swapped_->for_each_sub_group(
      [&](std::int64_t first, std::int64_t count, std::span<float* const> arrays) {
        // The parameter pieces this sub-group covers, in part or whole; the update is elementwise,
        // so pieces split at sub-group boundaries update exactly as whole ones.
        for_each_overlap(
            owned_, cursor, first, count, [&](const OwnedRange& range, std::int64_t begin, std::int64_t end) {
              const std::int64_t in_group = begin - first;
              const std::size_t in_range = static_cast<std::size_t>(begin - range.shard_begin);
              for (std::size_t k = 0; k < state.size(); ++k)
                state[k] = arrays[swapped_array_of_state(k)] + in_group;
              float* master = master_in_swap_ ? arrays[0] + in_group : master_of(range) + in_range;
              update_part(static_cast<std::size_t>(&range - owned_.data()), begin, end, master, state,
                          grad_scale, lr);
            });
      });
  return {stats.wall_seconds, stats.work_seconds, stats.stalled_seconds};
}

void Engine::step_with_swapped_parameters(float grad_scale, float lr) {
  // The in-memory optimizer's states, driven range by range: its step() would write the 16-bit
  // copy into a shard that is not in memory.
  optimizer_->begin_step(grad_scale, lr);
  const std::vector<std::string_view> names = optimizer_->state_names();
  std::vector<float*> state(names.size());
  for (std::size_t i = 0; i < owned_.size(); ++i) {
    for (std::size_t k = 0; k < names.size(); ++k) state[k] = optimizer_->state(names[k], i).data();
    update_part(i, owned_[i].shard_begin, owned_[i].shard_begin + owned_[i].count, master_of(owned_[i]),
                state, grad_scale, lr);
  }
}

void Engine::update_part(std::size_t index, std::int64_t begin, std::int64_t end, float* master,
                         std::span<float* const> state, float grad_scale, float lr) {
  const OwnedRange& range = owned_[index];
  const std::size_t element = dtype_size(compute_dtype_);
  const std::size_t in_range = static_cast<std::size_t>(begin - range.shard_begin);
  const std::size_t count = static_cast<std::size_t>(end - begin);
  const GradBuffer gradient{static_cast<const std::byte*>(gradient_of(range)) + in_range * element,
                            compute_dtype_};
  // Where the new parameters go in the compute dtype: the fused update writes 16-bit copies; in
  // fp32 the master is the parameter itself, unless the parameters are on NVMe.
  std::byte* parameters = nullptr;
  if (parameters_on_nvme_) {
    parameters = parameter_store_->update_target(index) + in_range * element;
  } else if (compute_dtype_ != DType::fp32) {
    parameters = static_cast<std::byte*>(parameter_of(range)) + in_range * element;
  }
  HalfParamBuffer half;
  if (compute_dtype_ != DType::fp32) half = {parameters, compute_dtype_};
  optimizer_->update_range({master, count}, state, gradient, grad_scale, lr, half);
  if (parameters_on_nvme_) {
    if (compute_dtype_ == DType::fp32) std::memcpy(parameters, master, count * sizeof(float));
    if (end == range.shard_begin + range.count) parameter_store_->commit(index);  // the piece is complete
  }
}

OptimizerStatesPlacement Engine::optimizer_states_placement() const {
  OptimizerStatesPlacement placement;
  placement.device = config_.zero_optimization.offload_optimizer.device;
  if (swapped_) {
    placement.master_in_swap = master_in_swap_;
    placement.swap_file = swapped_->swap().file_path().string();
    placement.swap_backend = std::string(to_string(swapped_->swap().backend()));
    placement.swap_bytes = swapped_->swap_bytes();
    placement.buffer_bytes = swapped_->buffer_bytes();
    placement.sub_groups = static_cast<std::int64_t>(swapped_->sub_group_count());
    placement.sub_group_elements =
        std::min<std::int64_t>(config_.zero_optimization.sub_group_size, shard_size_);
  }
  return placement;
}

ParametersPlacement Engine::parameters_placement() const {
  ParametersPlacement placement;
  if (stage_ != 3) {
    placement.host_elements = stage_ <= 2 ? flat_size_ : shard_size_;
    return placement;
  }
  placement.device = config_.zero_optimization.offload_param.device;
  placement.host_elements = parameter_store_->host_elements();
  placement.nvme_elements = parameter_store_->nvme_elements();
  if (const SwapEngine* swap = parameter_store_->swap()) {
    placement.swap_file = swap->file_path().string();
    placement.swap_backend = std::string(to_string(swap->backend()));
    placement.swap_bytes = swap->reserved_bytes();
    placement.buffer_bytes = parameter_store_->buffer_bytes();
    placement.buffer_count = static_cast<std::int64_t>(parameter_store_->buffer_count());
  }
  return placement;
}

std::string ParametersPlacement::describe() const {
  if (swap_file.empty()) {
    return device == OffloadDevice::cpu ? "host memory (offload_param: cpu)" : "host memory";
  }
  if (nvme_elements == 0) {
    return detail::concat("host memory: all ", host_elements,
                          " elements fit in offload_param.max_in_cpu, none go to the nvme swap file ",
                          swap_file, " (lower max_in_cpu, e.g. to 0, to move parameters to NVMe)");
  }
  return detail::concat("nvme swap file ", swap_file, " (", swap_backend, ", ", swap_bytes,
                        " bytes): ", nvme_elements, " elements on NVMe, ", host_elements,
                        " in host memory (offload_param.max_in_cpu), read through ", buffer_count,
                        " buffer(s) of ", buffer_bytes, " bytes in all",
                        buffer_bytes > swap_bytes
                            ? " (more than the pieces on NVMe: each buffer holds the largest piece; lower "
                              "buffer_count, or keep the largest parameters in host memory with max_in_cpu)"
                            : "");
}

std::string OptimizerStatesPlacement::describe() const {
  if (swap_file.empty()) {
    return device == OffloadDevice::cpu ? "host memory (offload_optimizer: cpu)" : "host memory";
  }
  return detail::concat("nvme swap file ", swap_file, " (", swap_backend, ", ", swap_bytes, " bytes",
                        master_in_swap ? ", fp32 master included" : "", "), ", sub_groups,
                        " sub-group(s) of up to ", sub_group_elements, " elements through ", buffer_bytes,
                        " bytes of host buffers");
}

void* Engine::gradient_of(const OwnedRange& range) {
  const std::int64_t begin = stage_ <= 1 ? range.flat_begin : range.shard_begin;
  return gradients_.as<std::byte>() + static_cast<std::size_t>(begin) * dtype_size(compute_dtype_);
}

void* Engine::parameter_of(const OwnedRange& range) {
  ZT_CHECK(!parameters_.empty(),
           "internal: with offload_param nvme the parameters are in the parameter store");
  const std::int64_t begin = stage_ <= 2 ? range.flat_begin : range.shard_begin;
  return parameters_.as<std::byte>() + static_cast<std::size_t>(begin) * dtype_size(compute_dtype_);
}

float* Engine::master_of(const OwnedRange& range) {
  if (!keeps_separate_master()) return static_cast<float*>(parameter_of(range));
  ZT_CHECK(!master_in_swap_, "internal: the fp32 master is in the swap file; read it through swapped_");
  return master_.as<float>() + range.shard_begin;
}

const float* Engine::master_of(const OwnedRange& range) const {
  return const_cast<Engine*>(this)->master_of(range);
}

void Engine::on_backward_pre(const ModuleUse& use) {
  if (gatherer_) gatherer_->before(use.index, engine_detail::Phase::backward);
  if (stage_ >= 2) {
    for (std::size_t index : use.parameters) {
      nn::Parameter& parameter = *parameters_list_[index];
      if (!parameter.grad.defined()) {
        parameter.grad =
            Tensor::zeros(layout_[index].shape, compute_dtype_, Device::host(), MemoryCategory::gradients);
      }
    }
  }
  if (reducing_this_pass_) reducer_->poll();
}

void Engine::on_backward_post(const ModuleUse& use) {
  if (reducing_this_pass_) {
    // A parameter's gradient is final when every module that uses it has run its backward (a tied
    // embedding gets its last contribution from the token embedding, long after the lm_head).
    for (std::size_t index : use.parameters) {
      if (--pending_uses_[index] > 0 || reduced_this_pass_[index]) continue;
      nn::Parameter& parameter = *parameters_list_[index];
      reducer_->add(index, parameter.grad.raw_data(), compute_dtype_);
      reduced_this_pass_[index] = 1;
      if (stage_ >= 2) parameter.grad = Tensor();
    }
    reducer_->poll();
  }
  if (gatherer_) {
    gatherer_->after(use.index, engine_detail::Phase::backward);
    gatherer_->poll();
  }
}

void Engine::reduce_pass_leftovers() {
  // Parameters no module's backward reached in this pass (unused ones): their gradient is zero.
  for (std::size_t i = parameters_list_.size(); i-- > 0;) {
    if (reduced_this_pass_[i]) continue;
    nn::Parameter& parameter = *parameters_list_[i];
    if (!parameter.grad.defined()) {
      parameter.grad =
          Tensor::zeros(layout_[i].shape, compute_dtype_, Device::host(), MemoryCategory::gradients);
    }
    reducer_->add(i, parameter.grad.raw_data(), compute_dtype_);
    reduced_this_pass_[i] = 1;
    if (stage_ >= 2) parameter.grad = Tensor();
  }
}

void Engine::reduce_external_gradients() {
  // The caller's gradients are complete at the boundary; reduce them straight from its buffers.
  const std::size_t element = dtype_size(compute_dtype_);
  if (stage_ <= 1 && data_->size() == 1) {
    for (std::size_t i = 0; i < parameters_list_.size(); ++i) {
      const FlatParameter& slot = layout_[i];
      Tensor::view_of(gradients_.as<std::byte>() + static_cast<std::size_t>(slot.offset) * element,
                      slot.shape, compute_dtype_)
          .copy_from(parameters_list_[i]->grad);
    }
    return;
  }
  reducer_->begin(false);
  for (std::size_t i = parameters_list_.size(); i-- > 0;) {
    const Tensor& gradient = parameters_list_[i]->grad;
    reducer_->add(i, gradient.raw_data(), gradient.dtype());
  }
  reducer_->finish();
}

void Engine::all_gather_updated_parameters() {
  // Stages 1-2: every rank updated its pieces; gather the others' in buckets of allgather_bucket_size
  // elements, packed rank-major (this rank's pieces of a bucket's parameters together).
  Communicator& data = *data_;
  const int ranks = data.size();
  const int rank = data.rank();
  const std::size_t element = dtype_size(compute_dtype_);
  std::int64_t largest = 0;
  for (const FlatParameter& slot : layout_) largest = std::max(largest, slot.piece_numel);
  const std::int64_t region = std::max(
      std::min((config_.zero_optimization.allgather_bucket_size + ranks - 1) / ranks, shard_size_), largest);
  if (allgather_staging_.numel() < region * ranks) {
    allgather_staging_ =
        Tensor::empty({region * ranks}, compute_dtype_, Device::host(), MemoryCategory::comm_buffers);
  }
  auto* staging = static_cast<std::byte*>(allgather_staging_.raw_data());
  auto* flat = parameters_.as<std::byte>();
  auto bytes = [element](std::int64_t elements) { return static_cast<std::size_t>(elements) * element; };
  std::size_t first = 0;
  while (first < layout_.size()) {
    std::size_t last = first;
    std::int64_t count = 0;
    while (last < layout_.size() && (last == first || count + layout_[last].piece_numel <= region)) {
      count += layout_[last++].piece_numel;
    }
    std::int64_t offset = 0;
    for (std::size_t i = first; i < last; ++i) {
      std::memcpy(staging + bytes(rank * count + offset), flat + bytes(owned_[i].flat_begin),
                  bytes(layout_[i].piece_numel));
      offset += layout_[i].piece_numel;
    }
    data.all_gather(staging + bytes(rank * count), staging, static_cast<std::size_t>(count), compute_dtype_);
    offset = 0;
    for (std::size_t i = first; i < last; ++i) {
      for (int q = 0; q < ranks; ++q) {
        std::memcpy(flat + bytes(layout_[i].offset + q * layout_[i].piece_numel),
                    staging + bytes(q * count + offset), bytes(layout_[i].piece_numel));
      }
      offset += layout_[i].piece_numel;
    }
    first = last;
  }
}

void Engine::copy_parameters_out() {
  const std::size_t element = dtype_size(compute_dtype_);
  for (std::size_t i = 0; i < parameters_list_.size(); ++i) {
    const FlatParameter& slot = layout_[i];
    parameters_list_[i]->value.copy_from(
        Tensor::view_of(parameters_.as<std::byte>() + static_cast<std::size_t>(slot.offset) * element,
                        slot.shape, compute_dtype_));
  }
}

std::vector<float> Engine::master_parameters() const {
  std::vector<float> shard(static_cast<std::size_t>(shard_size_), 0.0f);
  if (master_in_swap_) {
    swapped_->read(0, 0, shard_size_, shard.data());
    swapped_->flush();
    return shard;
  }
  for (const OwnedRange& range : owned_) {
    std::copy_n(master_of(range), range.count, shard.data() + range.shard_begin);
  }
  return shard;
}

std::vector<float> Engine::gather_master_parameters() {
  if (stage_ == 0) return master_parameters();
  const std::vector<float> mine = master_parameters();
  const int ranks = data_->size();
  std::vector<float> all(mine.size() * static_cast<std::size_t>(ranks));
  data_->all_gather(mine.data(), all.data(), mine.size(), DType::fp32);
  std::vector<float> flat(static_cast<std::size_t>(flat_size_), 0.0f);
  for (const FlatParameter& slot : layout_) {
    for (int q = 0; q < ranks; ++q) {
      const std::int64_t begin = q * slot.piece_numel;
      const std::int64_t real = std::clamp<std::int64_t>(slot.numel - begin, 0, slot.piece_numel);
      std::copy_n(all.data() + q * shard_size_ + slot.shard_offset, real, flat.data() + slot.offset + begin);
    }
  }
  return flat;
}

std::int64_t Engine::peak_gathered_parameters() const {
  return gatherer_ ? gatherer_->peak_live_elements() : 0;
}

double Engine::total_wait_seconds() const {
  return reducer_->wait_seconds() + (gatherer_ ? gatherer_->wait_seconds() : 0.0) + step_wait_seconds_;
}

void Engine::mark_step_start() {
  if (step_started_) return;
  step_started_ = true;
  const TrafficCounter total = data_->traffic().total();
  wire_bytes_at_step_start_ = total.wire_bytes;
  comm_seconds_at_step_start_ = total.seconds;
  wait_seconds_at_step_start_ = total_wait_seconds();
  parameter_swap_at_step_start_ = parameter_swap_counters();
}

OffloadTiming Engine::parameter_swap_counters() const {
  OffloadTiming counters;
  if (!parameters_on_nvme_) return counters;
  const engine_detail::ParameterStoreStats& stats = parameter_store_->stats();
  counters.parameter_bytes_read = stats.bytes_read;
  counters.parameter_bytes_written = stats.bytes_written;
  counters.parameter_wait_seconds = stats.read_wait_seconds + stats.write_wait_seconds;
  return counters;
}

double Engine::forward(const Batch& batch) {
  ZT_CHECK(batch.inputs.defined() && batch.targets.defined(),
           "Engine::forward: the batch needs inputs and targets");
  ZT_CHECK(!forward_pending_,
           "Engine::forward called twice without backward(); call backward() (or eval() for a "
           "forward without gradients)");
  mark_step_start();
  model_.train();
  if (gatherer_) gatherer_->begin_pass(true);
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
  const std::int64_t accumulation = batch().gradient_accumulation_steps;
  const bool first_of_step = micro_steps_ % accumulation == 0;
  const bool boundary = (micro_steps_ + 1) % accumulation == 0;
  // Stages 0-1 communicate once per step, during the boundary micro-batch's backward; stages 2-3
  // reduce every micro-batch's gradients into the shard (no full gradient is kept between them).
  reducing_this_pass_ = stage_ >= 2 || (boundary && data_->size() > 1);
  if (reducing_this_pass_) {
    reducer_->begin(stage_ >= 2 && !first_of_step);
    pending_uses_ = uses_per_parameter_;
    std::fill(reduced_this_pass_.begin(), reduced_this_pass_.end(), 0);
  }
  model_.run_backward(grad_output);
  if (reducing_this_pass_) {
    reduce_pass_leftovers();
    reducer_->finish();
    reducing_this_pass_ = false;
  }
  if (gatherer_) gatherer_->end_of_backward();
  forward_pending_ = false;
}

bool Engine::is_gradient_accumulation_boundary() const {
  return micro_steps_ % batch().gradient_accumulation_steps == 0;
}

double Engine::lr() const {
  return scheduler_ ? scheduler_->lr() : config_.optimizer->lr;
}

bool Engine::step() {
  ZT_CHECK(!forward_pending_, "Engine::step called after forward() without backward()");
  mark_step_start();
  ++micro_steps_;
  if (!is_gradient_accumulation_boundary()) return false;

  Communicator& data = *data_;
  using Clock = std::chrono::steady_clock;
  auto timed = [this](auto&& collective) {
    const auto started = Clock::now();
    collective();
    step_wait_seconds_ += std::chrono::duration<double>(Clock::now() - started).count();
  };
  if (external_ != nullptr) reduce_external_gradients();

  // Overflow check and norm over this rank's (reduced) gradients, unscaled.
  const double scale_used = loss_scaler_.loss_scale();
  kernels::GradCheck check;
  for (OwnedRange& range : owned_) {
    check =
        check + kernels::grad_sum_squares(default_stream(Device::host()), gradient_of(range), compute_dtype_,
                                          static_cast<std::size_t>(range.count), 1.0 / scale_used);
  }
  if (stage_ >= 1 && data.size() > 1) {
    // Each rank saw its pieces: the global norm and the overflow flag are sums over ranks.
    double partial[2] = {check.sum_sq, check.found_inf ? 1.0 : 0.0};
    timed([&] { data.all_reduce(partial, partial, 2, DType::fp64, ReduceOp::sum); });
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
    if (swapped_) {
      report.offload = step_swapped_optimizer(grad_scale, static_cast<float>(report.lr));
    } else if (parameters_on_nvme_) {
      step_with_swapped_parameters(grad_scale, static_cast<float>(report.lr));
    } else {
      std::vector<GradBuffer> gradients;
      std::vector<HalfParamBuffer> halves;
      gradients.reserve(owned_.size());
      for (OwnedRange& range : owned_) {
        gradients.push_back({gradient_of(range), compute_dtype_});
        if (compute_dtype_ != DType::fp32) halves.push_back({parameter_of(range), compute_dtype_});
      }
      optimizer_->step(gradients, grad_scale, static_cast<float>(report.lr), halves);
    }
    if (parameters_on_nvme_) parameter_store_->finish_updates();
    if ((stage_ == 1 || stage_ == 2) && data.size() > 1) timed([&] { all_gather_updated_parameters(); });
    if (gatherer_) gatherer_->refresh_persistent();
    if (scheduler_) scheduler_->step();
    if (external_ != nullptr) copy_parameters_out();
  } else {
    ++skipped_steps_;
  }
  // Stages 2-3 overwrite the gradient shard in the next step's first backward.
  if (stage_ <= 1) std::memset(gradients_.data(), 0, gradients_.size());
  if (external_ != nullptr) {
    for (nn::Parameter* parameter : parameters_list_) parameter->grad.zero_();
    const auto [loss_sum, loss_count] = external_->take_losses();
    accumulated_loss_ += loss_sum;
    accumulated_micro_batches_ += loss_count;
  }
  const TrafficCounter traffic = data.traffic().total();
  report.comm_bytes = traffic.wire_bytes - wire_bytes_at_step_start_;  // this step's model traffic
  report.comm.busy_seconds = traffic.seconds - comm_seconds_at_step_start_;
  report.comm.wait_seconds = total_wait_seconds() - wait_seconds_at_step_start_;
  const OffloadTiming swap_now = parameter_swap_counters();
  report.offload.parameter_bytes_read =
      swap_now.parameter_bytes_read - parameter_swap_at_step_start_.parameter_bytes_read;
  report.offload.parameter_bytes_written =
      swap_now.parameter_bytes_written - parameter_swap_at_step_start_.parameter_bytes_written;
  report.offload.parameter_wait_seconds =
      swap_now.parameter_wait_seconds - parameter_swap_at_step_start_.parameter_wait_seconds;
  step_started_ = false;

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
  if (gatherer_) gatherer_->begin_pass(false);
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
