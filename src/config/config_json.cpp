// The effective configuration as JSON (every default filled in) and a short summary for logs.
#include <cstdio>
#include <sstream>

#include <nlohmann/json.hpp>

#include "zerotrain/config.hpp"
#include "zerotrain/watchdog.hpp"

namespace zt {

std::string_view to_string(GradientReduceOp value) {
  return value == GradientReduceOp::sum ? "sum" : "mean";
}

std::string_view to_string(OptimizerType value) {
  switch (value) {
    case OptimizerType::adam:
      return "Adam";
    case OptimizerType::adamw:
      return "AdamW";
    case OptimizerType::sgd:
      return "SGD";
  }
  return "?";
}

std::string_view to_string(SchedulerType value) {
  switch (value) {
    case SchedulerType::warmup_lr:
      return "WarmupLR";
    case SchedulerType::warmup_decay_lr:
      return "WarmupDecayLR";
    case SchedulerType::warmup_cosine_lr:
      return "WarmupCosineLR";
    case SchedulerType::one_cycle:
      return "OneCycle";
    case SchedulerType::lr_range_test:
      return "LRRangeTest";
  }
  return "?";
}

std::string_view to_string(WarmupType value) {
  return value == WarmupType::linear ? "linear" : "log";
}

std::string_view to_string(OffloadDevice value) {
  switch (value) {
    case OffloadDevice::none:
      return "none";
    case OffloadDevice::cpu:
      return "cpu";
    case OffloadDevice::nvme:
      return "nvme";
  }
  return "?";
}

std::string_view to_string(ModelType value) {
  return value == ModelType::mlp ? "mlp" : "gpt";
}

std::string_view to_string(MlpActivation value) {
  switch (value) {
    case MlpActivation::relu:
      return "relu";
    case MlpActivation::gelu:
      return "gelu";
    case MlpActivation::tanh:
      return "tanh";
  }
  return "?";
}

std::string_view to_string(DataFormat value) {
  switch (value) {
    case DataFormat::automatic:
      return "auto";
    case DataFormat::tokens:
      return "tokens";
    case DataFormat::text:
      return "text";
    case DataFormat::builtin:
      return "builtin";
    case DataFormat::synthetic:
      return "synthetic";
  }
  return "?";
}

std::string_view to_string(DeviceChoice value) {
  switch (value) {
    case DeviceChoice::automatic:
      return "auto";
    case DeviceChoice::cuda:
      return "cuda";
    case DeviceChoice::host:
      return "host";
  }
  return "?";
}

namespace {

// Insertion-ordered so that the output reads in the order of docs/config.md.
using ojson = nlohmann::ordered_json;

template <typename T>
ojson optional_value(const std::optional<T>& value) {
  return value ? ojson(*value) : ojson(nullptr);
}

ojson optional_dtype(const std::optional<DType>& value) {
  return value ? ojson(std::string(dtype_name(*value))) : ojson(nullptr);
}

std::string octal(std::uint32_t bits) {
  char text[8];
  std::snprintf(text, sizeof text, "%04o", static_cast<unsigned>(bits & 07777u));
  return text;
}

ojson optimizer_json(const OptimizerConfig& o) {
  ojson params;
  params["lr"] = o.lr;
  params["weight_decay"] = o.weight_decay;
  if (o.type == OptimizerType::sgd) {
    params["momentum"] = o.momentum;
    params["dampening"] = o.dampening;
    params["nesterov"] = o.nesterov;
  } else {
    params["betas"] = {o.betas[0], o.betas[1]};
    params["eps"] = o.eps;
    params["bias_correction"] = o.bias_correction;
    params["adam_w_mode"] = o.adam_w_mode;
  }
  return {{"type", to_string(o.type)}, {"params", params}};
}

struct SchedulerParamsJson {
  ojson operator()(const WarmupLRParams& w) const {
    return {{"warmup_min_lr", w.warmup_min_lr},
            {"warmup_max_lr", optional_value(w.warmup_max_lr)},
            {"warmup_num_steps", w.warmup_num_steps},
            {"warmup_type", to_string(w.warmup_type)}};
  }
  ojson operator()(const WarmupDecayLRParams& w) const {
    return {{"total_num_steps", optional_value(w.total_num_steps)},
            {"warmup_min_lr", w.warmup_min_lr},
            {"warmup_max_lr", w.warmup_max_lr},
            {"warmup_num_steps", w.warmup_num_steps},
            {"warmup_type", to_string(w.warmup_type)}};
  }
  ojson operator()(const WarmupCosineLRParams& w) const {
    return {{"total_num_steps", optional_value(w.total_num_steps)},
            {"warmup_min_ratio", w.warmup_min_ratio},
            {"warmup_num_steps", w.warmup_num_steps},
            {"cos_min_ratio", w.cos_min_ratio},
            {"warmup_type", to_string(w.warmup_type)}};
  }
  ojson operator()(const OneCycleParams& o) const {
    return {{"cycle_min_lr", optional_value(o.cycle_min_lr)},
            {"cycle_max_lr", optional_value(o.cycle_max_lr)},
            {"decay_lr_rate", o.decay_lr_rate},
            {"cycle_first_step_size", o.cycle_first_step_size},
            {"cycle_second_step_size", optional_value(o.cycle_second_step_size)},
            {"cycle_first_stair_count", o.cycle_first_stair_count},
            {"cycle_second_stair_count", optional_value(o.cycle_second_stair_count)},
            {"decay_step_size", o.decay_step_size},
            {"cycle_momentum", o.cycle_momentum},
            {"cycle_min_mom", o.cycle_min_mom},
            {"cycle_max_mom", o.cycle_max_mom},
            {"decay_mom_rate", o.decay_mom_rate}};
  }
  ojson operator()(const LRRangeTestParams& l) const {
    return {{"lr_range_test_min_lr", l.lr_range_test_min_lr},
            {"lr_range_test_step_size", l.lr_range_test_step_size},
            {"lr_range_test_step_rate", l.lr_range_test_step_rate},
            {"lr_range_test_staircase", l.lr_range_test_staircase}};
  }
};

ojson scheduler_json(const SchedulerConfig& s) {
  ojson params = std::visit(SchedulerParamsJson{}, s.params);
  params["last_batch_iteration"] = s.last_batch_iteration;
  return {{"type", to_string(s.type)}, {"params", params}};
}

ojson offload_optimizer_json(const OffloadOptimizerConfig& o) {
  return {{"device", to_string(o.device)},
          {"nvme_path", optional_value(o.nvme_path)},
          {"pin_memory", o.pin_memory},
          {"buffer_count", o.buffer_count},
          {"ratio", o.ratio},
          {"super_offload", o.super_offload}};
}

ojson offload_param_json(const OffloadParamConfig& o) {
  return {{"device", to_string(o.device)}, {"nvme_path", optional_value(o.nvme_path)},
          {"pin_memory", o.pin_memory},    {"buffer_count", o.buffer_count},
          {"buffer_size", o.buffer_size},  {"max_in_cpu", o.max_in_cpu}};
}

ojson zero_json(const ZeroConfig& z) {
  ojson j;
  j["stage"] = z.stage;
  j["overlap_comm"] = z.overlap_comm;
  j["reduce_bucket_size"] = z.reduce_bucket_size;
  j["allgather_bucket_size"] = z.allgather_bucket_size;
  j["sub_group_size"] = z.sub_group_size;
  j["stage3_prefetch_bucket_size"] = z.stage3_prefetch_bucket_size;
  j["stage3_param_persistence_threshold"] = z.stage3_param_persistence_threshold;
  j["stage3_max_live_parameters"] = z.stage3_max_live_parameters;
  j["stage3_max_reuse_distance"] = z.stage3_max_reuse_distance;
  j["offload_optimizer"] = offload_optimizer_json(z.offload_optimizer);
  j["offload_param"] = offload_param_json(z.offload_param);
  return j;
}

struct ModelJson {
  ojson operator()(const GptModelConfig& g) const {
    return {{"type", "gpt"},
            {"n_layer", g.n_layer},
            {"n_head", g.n_head},
            {"d_model", g.d_model},
            {"seq_len", g.seq_len},
            {"vocab_size", g.vocab_size},
            {"tie_embeddings", g.tie_embeddings},
            {"dropout", g.dropout}};
  }
  ojson operator()(const MlpModelConfig& m) const {
    return {{"type", "mlp"}, {"sizes", m.sizes}, {"activation", to_string(m.activation)}};
  }
};

}  // namespace

std::string Config::to_json_string(int indent) const {
  ojson j;
  const bool resolved = resolved_batch_.has_value();
  j["train_batch_size"] =
      resolved ? ojson(resolved_batch_->train_batch_size) : optional_value(train_batch_size);
  j["train_micro_batch_size_per_gpu"] = resolved ? ojson(resolved_batch_->train_micro_batch_size_per_gpu)
                                                 : optional_value(train_micro_batch_size_per_gpu);
  j["gradient_accumulation_steps"] = resolved ? ojson(resolved_batch_->gradient_accumulation_steps)
                                              : optional_value(gradient_accumulation_steps);
  j["gradient_clipping"] = gradient_clipping;
  j["steps_per_print"] = optional_value(steps_per_print);
  j["device"] = to_string(device);
  j["gradient_allreduce_op"] = to_string(gradient_allreduce_op);
  j["communication_data_type"] = optional_dtype(communication_data_type);
  j["managed_gradient_accumulation"] = managed_gradient_accumulation;
  j["seed"] = seed;
  j["optimizer"] = optimizer ? optimizer_json(*optimizer) : ojson(nullptr);
  j["scheduler"] = scheduler ? scheduler_json(*scheduler) : ojson(nullptr);
  j["fp16"] = {{"enabled", fp16.enabled},
               {"loss_scale", fp16.loss_scale},
               {"initial_scale_power", fp16.initial_scale_power},
               {"loss_scale_window", fp16.loss_scale_window},
               {"hysteresis", fp16.hysteresis},
               {"consecutive_hysteresis", fp16.consecutive_hysteresis},
               {"min_loss_scale", fp16.min_loss_scale},
               {"fp16_master_weights_and_grads", fp16.fp16_master_weights_and_grads}};
  j["bf16"] = {{"enabled", bf16.enabled},
               {"check_grad_overflow", bf16.check_grad_overflow},
               {"bf16_master_weights_and_grads", bf16.bf16_master_weights_and_grads},
               {"bf16_optimizer_states", bf16.bf16_optimizer_states}};
  j["zero_optimization"] = zero_json(zero_optimization);
  j["aio"] = {{"block_size", aio.block_size},
              {"queue_depth", aio.queue_depth},
              {"intra_op_parallelism", aio.intra_op_parallelism},
              {"single_submit", aio.single_submit},
              {"overlap_events", aio.overlap_events},
              {"use_gds", aio.use_gds}};
  for (const auto& [key, monitor] :
       {std::pair{"tensorboard", &tensorboard}, std::pair{"csv_monitor", &csv_monitor}}) {
    j[key] = {{"enabled", monitor->enabled},
              {"output_path", monitor->output_path},
              {"job_name", monitor->job_name}};
  }
  j["alerts"] = {{"memory_limit", optional_value(alerts.memory_limit)},
                 {"memory_fraction", alerts.memory_fraction}};
  j["checkpoint"] = {{"save_dir", optional_value(checkpoint.save_dir)},
                     {"save_interval", checkpoint.save_interval},
                     {"keep_last", checkpoint.keep_last},
                     {"file_mode", octal(checkpoint.file_mode)},
                     {"dir_mode", octal(checkpoint.dir_mode)}};
  j["pipeline"] = {{"stages", pipeline.stages ? ojson(*pipeline.stages) : ojson("auto")},
                   {"partition", pipeline.partition},
                   {"schedule", pipeline.schedule == PipelineSchedule::gpipe ? "gpipe" : "1f1b"},
                   {"activation_checkpoint_interval", pipeline.activation_checkpoint_interval}};
  const ActivationCheckpointingConfig& checkpointing = activation_checkpointing;
  j["activation_checkpointing"] = {
      {"partition_activations", checkpointing.partition_activations},
      {"cpu_checkpointing", checkpointing.cpu_checkpointing},
      {"number_checkpoints", optional_value(checkpointing.number_checkpoints)},
      {"contiguous_memory_optimization", checkpointing.contiguous_memory_optimization},
      {"synchronize_checkpoint_boundary", checkpointing.synchronize_checkpoint_boundary},
      {"profile", checkpointing.profile}};
  j["model"] = model ? std::visit(ModelJson{}, *model) : ojson(nullptr);
  if (data) {
    j["data"] = {{"path", optional_value(data->path)},
                 {"seed", optional_value(data->seed)},
                 {"format", to_string(data->format)}};
  } else {
    j["data"] = nullptr;
  }
  if (eval) {
    j["eval"] = {
        {"data", optional_value(eval->data)}, {"interval", eval->interval}, {"batches", eval->batches}};
  } else {
    j["eval"] = nullptr;
  }
  j["comm"] = {{"timeout_s", comm.timeout_s.value_or(kDefaultCollectiveTimeoutSeconds)}, {"backend", "auto"}};
  j["init"] = {{"from", optional_value(init.from)}};
  j["freeze"] = freeze;
  return j.dump(indent);
}

namespace {

/// 500000000 -> "5e8"-style short form for sizes in the summary.
std::string compact(std::int64_t value) {
  std::ostringstream out;
  if (value >= 1'000'000 && value % 1'000'000 == 0) {
    out << value / 1'000'000 << "M";
  } else {
    out << value;
  }
  return out.str();
}

}  // namespace

std::string Config::summary() const {
  std::ostringstream out;
  out << "config " << source_ << "\n";
  out << "  batch: ";
  if (resolved_batch_) {
    const BatchSizes& b = *resolved_batch_;
    out << b.train_batch_size << " = micro " << b.train_micro_batch_size_per_gpu << " x accumulation "
        << b.gradient_accumulation_steps << " x data-parallel " << b.data_parallel_size;
  } else {
    auto show = [](const std::optional<std::int64_t>& v) {
      return v ? std::to_string(*v) : std::string("-");
    };
    out << "unresolved (train_batch_size " << show(train_batch_size) << ", micro "
        << show(train_micro_batch_size_per_gpu) << ", accumulation " << show(gradient_accumulation_steps)
        << ")";
  }
  out << "\n  precision: ";
  if (fp16.enabled) {
    out << "fp16, ";
    if (fp16.dynamic_loss_scale()) {
      out << "dynamic loss scale 2^" << fp16.initial_scale_power << " (window " << fp16.loss_scale_window
          << ", hysteresis " << fp16.hysteresis << ", min " << fp16.min_loss_scale << ")";
    } else {
      out << "static loss scale " << fp16.loss_scale;
    }
  } else if (bf16.enabled) {
    out << "bf16" << (bf16.check_grad_overflow ? ", skip steps with inf/nan gradients" : "");
  } else {
    out << "fp32";
  }
  if (communication_data_type) out << ", reduce in " << dtype_name(*communication_data_type);
  const ZeroConfig& z = zero_optimization;
  out << "\n  zero: stage " << z.stage << ", overlap_comm " << (z.overlap_comm ? "on" : "off")
      << ", buckets reduce " << compact(z.reduce_bucket_size) << " / allgather "
      << compact(z.allgather_bucket_size) << " elements";
  if (z.offload_optimizer.device != OffloadDevice::none) {
    out << ", optimizer offload " << to_string(z.offload_optimizer.device);
  }
  if (z.offload_param.device != OffloadDevice::none)
    out << ", parameter offload " << to_string(z.offload_param.device);
  out << "\n  optimizer: ";
  if (optimizer) {
    const OptimizerConfig& o = *optimizer;
    out << to_string(o.type) << " lr " << o.lr << " weight_decay " << o.weight_decay;
    if (o.type == OptimizerType::sgd) {
      out << " momentum " << o.momentum << (o.nesterov ? " nesterov" : "");
    } else {
      out << " betas (" << o.betas[0] << ", " << o.betas[1] << ") eps " << o.eps
          << (o.decoupled_weight_decay() ? " (decoupled weight decay)" : "");
    }
  } else {
    out << "supplied by the application";
  }
  out << "; gradient_clipping " << gradient_clipping << ", reduce op " << to_string(gradient_allreduce_op);
  if (scheduler) out << "\n  scheduler: " << to_string(scheduler->type);
  if (model) {
    out << "\n  model: ";
    if (const auto* g = std::get_if<GptModelConfig>(&*model)) {
      out << "gpt n_layer " << g->n_layer << " n_head " << g->n_head << " d_model " << g->d_model
          << " seq_len " << g->seq_len << " vocab_size " << g->vocab_size;
    } else {
      const auto& m = std::get<MlpModelConfig>(*model);
      out << "mlp sizes [";
      for (std::size_t i = 0; i < m.sizes.size(); ++i) out << (i ? ", " : "") << m.sizes[i];
      out << "] " << to_string(m.activation);
    }
    const std::int64_t layers =
        std::holds_alternative<GptModelConfig>(*model)
            ? std::get<GptModelConfig>(*model).n_layer
            : static_cast<std::int64_t>(std::get<MlpModelConfig>(*model).sizes.size()) - 1;
    if (const std::int64_t interval = activation_checkpoint_interval_for(layers); interval > 0) {
      out << "; activation checkpoints of " << interval << " layer" << (interval == 1 ? "" : "s")
          << (activation_checkpointing.cpu_checkpointing ? ", inputs kept on the host" : "");
    }
  }
  if (checkpoint.save_dir)
    out << "\n  checkpoints: " << *checkpoint.save_dir << " every " << checkpoint.save_interval << " steps";
  if (!warnings_.empty()) out << "\n  warnings: " << warnings_.size();
  out << "\n";
  return out.str();
}

}  // namespace zt
