// Model-state memory per rank for `zerotrain estimate`: the engine's partition plan, next to the ZeRO
// formulas.
#include "zerotrain/estimate.hpp"
#include "src/engine/estimate_table.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <variant>

#include "src/engine/model_layers.hpp"
#include "src/engine/partition_plan.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/nn.hpp"

namespace zt {

std::int64_t model_parameter_count(const Config& config) {
  std::int64_t count = 0;
  for (const engine_detail::PlannedParameter& parameter : engine_detail::planned_parameters_of_config(config))
    count += shape_numel(parameter.shape);
  return count;
}

std::int64_t model_largest_parameter(const Config& config) {
  if (!config.model.has_value()) return 0;
  std::int64_t largest = 0;
  for (const engine_detail::PlannedParameter& parameter : engine_detail::planned_parameters_of_config(config))
    largest = std::max(largest, shape_numel(parameter.shape));
  return largest;
}

MemoryEstimate estimate_model_state_memory(const Config& config, int world_size,
                                           std::int64_t parameters_count, int pipeline_stage,
                                           DeviceType activations_device) {
  ZT_CHECK_AS(ConfigError, world_size >= 1, "--world-size must be at least 1, got ", world_size);
  const int stages = static_cast<int>(config.pipeline.stage_count());
  ZT_CHECK_AS(ConfigError, world_size % stages == 0, "--world-size ", world_size,
              " with pipeline.stages = ", stages,
              ": the ranks must split into stages of equal data-parallel size (ranks = stages x data)");
  ZT_CHECK_AS(ConfigError, pipeline_stage >= 0 && pipeline_stage < stages, "pipeline stage ", pipeline_stage,
              " of a config with pipeline.stages = ", stages, ": expected 0 <= stage < ", stages);
  const int data_parallel = world_size / stages;
  // The batch rule as `train` applies it at this data-parallel size: a config that train would
  // refuse is refused here too, with the same message.
  Config resolved_batch = config;
  resolved_batch.resolve_batch(data_parallel);

  // The engine's own partition plan on rank 0 of the stage's data group (every rank's shard has
  // the same size): the estimate is the allocation, padding included. With --params N and no
  // model: one tensor of N. With pipeline stages: the stage's parameters, a tied copy included.
  std::vector<engine_detail::PlannedParameter> planned;
  if (parameters_count > 0) {
    ZT_CHECK_AS(ConfigError, stages == 1, "--params with pipeline.stages = ", stages,
                ": the split into stages needs the config's \"model\" section (its layers); drop --params");
    planned.push_back({"parameters", {parameters_count}});
  } else if (stages > 1) {
    engine_detail::ZeroPartitioning::of_stage(config.zero_optimization.stage).check_pipeline(stages);
    planned = engine_detail::planned_parameters_of_stage(config, pipeline_stage);
  } else {
    planned = engine_detail::planned_parameters_of_config(config);
  }
  // "freeze": frozen parameters leave the plan (no gradient, no optimizer state), held whole.
  std::int64_t frozen_count = 0;
  if (!config.freeze.empty()) {
    ZT_CHECK_AS(ConfigError, stages == 1, "freeze with ", stages,
                " pipeline stages: frozen parameters of pipelined models are not available yet");
    std::vector<engine_detail::PlannedParameter> trainable;
    for (engine_detail::PlannedParameter& parameter : planned) {
      const bool frozen = std::any_of(
          config.freeze.begin(), config.freeze.end(),
          [&](const std::string& pattern) { return freeze_pattern_matches(pattern, parameter.name); });
      if (frozen) {
        frozen_count += shape_numel(parameter.shape);
      } else {
        trainable.push_back(std::move(parameter));
      }
    }
    ZT_CHECK_AS(ConfigError, !trainable.empty(),
                "freeze: every parameter of the model is frozen; nothing would train");
    planned = std::move(trainable);
  }
  std::int64_t largest_parameter = 0;
  if (parameters_count == 0) {
    for (const engine_detail::PlannedParameter& parameter : planned)
      largest_parameter = std::max(largest_parameter, shape_numel(parameter.shape));
  }
  const engine_detail::PartitionPlan plan(std::move(planned),
                                          engine_detail::plan_settings(config, data_parallel, 0));
  const engine_detail::ModelStateBytes resident = plan.model_state_bytes();

  MemoryEstimate estimate;
  estimate.parameters_count = plan.parameter_count();
  estimate.world_size = data_parallel;
  estimate.pipeline_stage = pipeline_stage;
  estimate.pipeline_stages = stages;
  if (stages > 1) {
    estimate.stage_layers = engine_detail::describe_stage_layers(
        engine_detail::layers_of_config(config), engine_detail::stage_boundaries_of_config(config),
        pipeline_stage);
  }
  estimate.zero_stage = config.zero_optimization.stage;
  estimate.compute_dtype = compute_dtype_of(config);
  const std::uint64_t element = dtype_size(estimate.compute_dtype);
  estimate.optimizer_bytes_per_parameter = static_cast<int>(4 * plan.settings().optimizer_state_arrays) +
                                           (estimate.compute_dtype == DType::fp32 ? 0 : 4);
  // The rank's share of each model state, wherever it lives.
  std::uint64_t persistent = 0;
  for (std::size_t i = 0; i < plan.size(); ++i) {
    if (plan.persistent(i)) persistent += element * static_cast<std::uint64_t>(plan.layout()[i].numel);
  }
  estimate.frozen_parameters_count = frozen_count;
  estimate.frozen_parameters = element * static_cast<std::uint64_t>(frozen_count);
  estimate.parameters = element * static_cast<std::uint64_t>(plan.parameter_buffer_elements()) + persistent +
                        estimate.frozen_parameters;
  estimate.gradients = resident.gradients;
  std::uint64_t owned_elements = 0;
  for (const engine_detail::OwnedRange& range : plan.owned())
    owned_elements += static_cast<std::uint64_t>(range.count);
  estimate.optimizer_states =
      sizeof(float) * (static_cast<std::uint64_t>(plan.separate_master() ? plan.shard_size() : 0) +
                       plan.settings().optimizer_state_arrays * owned_elements);

  // Offload: where the states live, and where DeepSpeed would put everything with CUDA.
  const ZeroConfig& zero = config.zero_optimization;
  estimate.offload_device = zero.offload_optimizer.device;
  estimate.optimizer_states_host = resident.optimizer_states;
  estimate.nvme_bytes = resident.optimizer_states_nvme;
  estimate.param_offload_device = plan.settings().parameter_offload;
  estimate.largest_parameter = largest_parameter;
  estimate.parameters_host = resident.parameters + estimate.frozen_parameters;
  estimate.parameters_nvme = resident.parameters_nvme;
  estimate.device_bytes_with_cuda = estimate.parameters + estimate.gradients;
  estimate.host_bytes_with_cuda = 0;
  if (estimate.offload_device == OffloadDevice::none) {
    estimate.device_bytes_with_cuda += estimate.optimizer_states;
  } else {
    estimate.host_bytes_with_cuda = estimate.optimizer_states_host;
  }
  if (estimate.param_offload_device != OffloadDevice::none) {
    // The device then holds gathered parameters only (activations' share, not counted here).
    estimate.device_bytes_with_cuda -= estimate.parameters;
    estimate.host_bytes_with_cuda += estimate.parameters_host;
  }
  // DeepSpeed's estimators, one node with N GPUs (reference: deepspeed-semantics.md §2).
  {
    const double p = static_cast<double>(estimate.parameters_count);
    const double g = static_cast<double>(data_parallel);
    const double factor = 1.5;
    const double largest = static_cast<double>(estimate.largest_parameter);
    double gpu = 0;
    double cpu = 0;
    const bool offloaded = estimate.offload_device != OffloadDevice::none;
    // DeepSpeed's stage-3 estimator knows parameter offload only together with optimizer offload.
    const bool params_offloaded = estimate.param_offload_device != OffloadDevice::none;
    if (!plan.partitioning().parameters) {  // DeepSpeed has no stage-1 estimator; its stage-2 one is used
      gpu = offloaded ? 2 * p : 2 * p + 18 * p / g;
      cpu = offloaded ? p * std::max(4 * g, 16.0) * factor : 4 * p * g * factor;
    } else if (params_offloaded) {
      gpu = 4 * largest;
      cpu = 18 * p * factor;  // zero_init, one node
    } else {
      gpu = offloaded ? 4 * largest + 2 * p / g : 4 * largest + 18 * p / g;
      cpu = offloaded ? 16 * p * factor : 4 * largest * g * factor;  // zero_init, one node
    }
    estimate.deepspeed_gpu_bytes = static_cast<std::uint64_t>(gpu);
    estimate.deepspeed_cpu_bytes = static_cast<std::uint64_t>(cpu);
  }
  estimate.bucket_buffers = plan.bucket_bytes();
  if (parameters_count == 0 && config.model.has_value()) {
    estimate.activations = estimate_activation_memory(config, world_size, pipeline_stage, activations_device);
  }
  return estimate;
}

std::string MemoryEstimate::table() const {
  const int k = static_cast<int>(dtype_size(compute_dtype));
  const int big_k = optimizer_bytes_per_parameter;
  const auto line = engine_detail::write_estimate_row;
  const std::string per_rank = "/N";
  const engine_detail::ZeroPartitioning partitioned = engine_detail::ZeroPartitioning::of_stage(zero_stage);
  std::ostringstream out;
  if (pipeline_stages > 1) {
    out << "pipeline stage " << pipeline_stage << " of " << pipeline_stages << ": " << stage_layers << "\n";
  }
  out << "model states per rank: " << parameters_count << " parameters (Ψ), ZeRO stage " << zero_stage << ", "
      << world_size << " data-parallel rank(s) (N), " << dtype_name(compute_dtype) << " (k = " << k
      << " bytes), optimizer states K = " << big_k << " bytes per parameter\n";
  line(out, "parameters", parameters,
       std::to_string(k) + "Ψ" + (partitioned.parameters ? per_rank : "") +
           (frozen_parameters_count > 0 ? " + " + std::to_string(k) + "Ψf" : ""));
  line(out, "gradients", gradients, std::to_string(k) + "Ψ" + (partitioned.gradients ? per_rank : ""));
  line(out, "optimizer_states", optimizer_states,
       std::to_string(big_k) + "Ψ" + (partitioned.optimizer_states ? per_rank : ""));
  line(out, "total", total(), "");
  if (frozen_parameters_count > 0) {
    out << "freeze: " << frozen_parameters_count
        << " frozen parameters (Ψf, not in Ψ): whole on every rank, no gradient, optimizer state or "
           "reduction\n";
    line(out, "frozen", frozen_parameters, std::to_string(k) + "Ψf");
  }
  line(out, "bucket buffers", bucket_buffers, "reduce (x2 with overlap_comm) + all-gather buckets");
  if (offload_device != OffloadDevice::none) {
    out << "offload_optimizer: " << to_string(offload_device) << "\n";
    line(out, "states in host", optimizer_states_host,
         offload_device == OffloadDevice::nvme ? "buffer_count x sub-group x fp32 arrays (4 KiB aligned)"
                                               : "all of optimizer_states");
    if (offload_device == OffloadDevice::nvme) line(out, "states on NVMe", nvme_bytes, "swap file per rank");
    const bool params = param_offload_device != OffloadDevice::none;
    line(out, "with CUDA: device", device_bytes_with_cuda, params ? "gradients" : "parameters + gradients");
    line(out, "with CUDA: host", host_bytes_with_cuda,
         std::string("optimizer states") + (params ? " + parameter pieces" : "") +
             " (with the engine on a GPU)");
  }
  if (param_offload_device != OffloadDevice::none) {
    out << "offload_param: " << to_string(param_offload_device) << "\n";
    line(out, "params in host", parameters_host,
         param_offload_device == OffloadDevice::nvme
             ? "min(max_in_cpu, shard) x k + buffer_count x largest piece (4 KiB aligned)"
             : "all of parameters");
    if (param_offload_device == OffloadDevice::nvme)
      line(out, "params on NVMe", parameters_nvme, "swap file per rank");
    if (offload_device == OffloadDevice::none) {
      line(out, "with CUDA: device", device_bytes_with_cuda, "gradients + optimizer states");
      line(out, "with CUDA: host", host_bytes_with_cuda, "parameter pieces (with the engine on a GPU)");
    }
  }
  line(out, "DeepSpeed GPU", deepspeed_gpu_bytes,
       std::string("per GPU, ") +
           (!partitioned.parameters ? "estimate_zero2_model_states_mem_needs"
                                    : "estimate_zero3_model_states_mem_needs") +
           (param_offload_device != OffloadDevice::none ? " (cpu_offload, cpu_offload_params)"
            : offload_device != OffloadDevice::none     ? " (cpu_offload)"
                                                        : ""));
  line(out, "DeepSpeed CPU", deepspeed_cpu_bytes, "per node of N GPUs, additional_buffer_factor 1.5");
  out << "  (the engine's partition plan: its allocation, padding included (each parameter to a multiple of\n"
         "   N elements, and to 16 in the flat layout); activations (below), stage 3's gathered parameters,\n"
         "   stages 2-3's transient full gradients and the allocator's slack come on top.)\n";
  if (activations) out << activations->table();
  return out.str();
}

// ---- does the model fit this host? -----------------------------------------------------------

namespace {

std::string gib_text(double bytes) {
  char text[48];
  std::snprintf(text, sizeof text, "%.1f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return text;
}

/// A number from the first line of a file ("max" and unreadable files: none).
std::optional<double> number_in_file(const std::string& path) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word == "max") return std::nullopt;
  char* end = nullptr;
  const double value = std::strtod(word.c_str(), &end);
  if (end == word.c_str() || value <= 0.0) return std::nullopt;
  return value;
}

/// This process's cgroup limit: v2 (memory.max of its cgroup, from /proc/self/cgroup), else v1.
std::optional<double> cgroup_memory_limit() {
  std::ifstream cgroups("/proc/self/cgroup");
  std::string line;
  while (std::getline(cgroups, line)) {
    if (!line.starts_with("0::")) continue;
    if (auto limit = number_in_file("/sys/fs/cgroup" + line.substr(3) + "/memory.max")) return limit;
  }
  if (auto limit = number_in_file("/sys/fs/cgroup/memory.max")) return limit;
  const auto v1 = number_in_file("/sys/fs/cgroup/memory/memory.limit_in_bytes");
  if (v1 && *v1 < 0x7FFFFFFFFFFFF000 / 2.0) return v1;  // v1 writes ~2^63 for "no limit"
  return std::nullopt;
}

}  // namespace

HostMemory host_memory(int ranks_on_node) {
  HostMemory host;
  double best = 0.0;
  const auto consider = [&](double bytes, std::string what) {
    if (bytes <= 0.0 || (best > 0.0 && bytes >= best)) return;
    best = bytes;
    host.what = gib_text(bytes) + " " + what;
  };
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kib = 0.0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemTotal:") {
      consider(kib * 1024.0, "of physical memory (MemTotal in /proc/meminfo)");
      break;
    }
  }
  if (const auto limit = cgroup_memory_limit()) consider(*limit, "(the cgroup's memory limit)");
  rlimit address_space{};
  if (::getrlimit(RLIMIT_AS, &address_space) == 0 && address_space.rlim_cur != RLIM_INFINITY) {
    consider(static_cast<double>(address_space.rlim_cur) * std::max(ranks_on_node, 1),
             "(the address-space limit RLIMIT_AS, `ulimit -v`, x " + std::to_string(ranks_on_node) +
                 " ranks on this node)");
  }
  host.node_bytes = static_cast<std::uint64_t>(std::min(best, 1.8e19));
  return host;
}

void check_fits_host_memory(const Config& config, int world_size, int ranks_on_node, const HostMemory& host,
                            DeviceType engine_device) {
  if (!config.model.has_value() || host.node_bytes == 0 || world_size < 1) return;
  const int stages = static_cast<int>(std::max<std::int64_t>(1, config.pipeline.stage_count()));
  const int data_parallel = std::max(1, world_size / stages);
  const std::vector<engine_detail::ParameterCountTerm> terms =
      engine_detail::parameter_count_terms_of_config(config);
  double parameters = 0.0;
  const engine_detail::ParameterCountTerm* largest = &terms.front();
  for (const auto& term : terms) {
    parameters += term.count;
    if (term.count > largest->count) largest = &term;
  }
  // The largest stage holds at least the average.
  const double stage_parameters = parameters / stages;
  const double element = static_cast<double>(dtype_size(compute_dtype_of(config)));
  const bool on_device = engine_device != DeviceType::host;
  // Model states: the engine's own estimate for that many parameters, where the numbers cannot
  // overflow; beyond that (far beyond any host), the gradients alone (element x Ψ / N at least).
  // With the engine on a device: the stage's model as built here before the engine moves it, or
  // what offload keeps here, whichever is larger.
  double states = on_device ? element * stage_parameters : element * stage_parameters / data_parallel;
  if (stage_parameters < 1e15) {
    Config one_stage = config;
    one_stage.pipeline.stages = std::nullopt;
    try {
      const MemoryEstimate estimate = estimate_model_state_memory(
          one_stage, data_parallel, std::max<std::int64_t>(1, std::llround(stage_parameters)));
      states = on_device ? std::max(states, static_cast<double>(estimate.host_bytes_with_cuda))
                         : static_cast<double>(estimate.resident());
    } catch (const ConfigError&) {
      // A config the engine refuses for other reasons: it says why, with its own message.
    }
  }
  // Activations of a GPT, at least: one layer's qkv (which even activation checkpointing rebuilds for
  // the layer's backward) or the logits of one micro-batch, whichever is larger. Attention saves no
  // [T, T] probabilities (its rows' log-sum-exps only), so nothing here grows as seq_len^2.
  double activations = 0.0;
  std::string activation_keys;
  const auto* gpt = std::get_if<GptModelConfig>(&*config.model);
  if (gpt != nullptr && !on_device) {
    Config batch_config = config;
    double micro = 1.0;
    try {
      micro = static_cast<double>(batch_config.resolve_batch(data_parallel).train_micro_batch_size_per_gpu);
    } catch (const ConfigError&) {
      // the engine reports the batch sizes; one sample per micro-batch is still a lower bound
    }
    const double seq = static_cast<double>(gpt->seq_len);
    const double qkv = micro * seq * 3.0 * static_cast<double>(gpt->d_model) * element;
    const double logits = micro * seq * static_cast<double>(gpt->vocab_size) * element;
    activations = std::max(qkv, logits);
    activation_keys = qkv >= logits
                          ? "train_micro_batch_size_per_gpu x model.seq_len x 3 model.d_model (one layer's "
                            "attention qkv)"
                          : "train_micro_batch_size_per_gpu x model.seq_len x model.vocab_size (the logits)";
  }
  const double per_rank = states + activations;
  const double node = per_rank * std::max(ranks_on_node, 1);
  if (node <= static_cast<double>(host.node_bytes)) return;
  std::ostringstream message;
  char count[32];
  std::snprintf(count, sizeof count, "%.3g", parameters);
  message << "the model cannot fit in this host's memory: each of the " << ranks_on_node
          << " rank(s) on this node needs at least " << gib_text(per_rank) << " (" << gib_text(node)
          << " together), but the node has " << host.what << ". Model states " << gib_text(states) << ": "
          << count << " parameters, most from " << largest->keys << ", ZeRO stage "
          << config.zero_optimization.stage << " over " << data_parallel << " data-parallel rank(s)"
          << (stages > 1 ? " per pipeline stage" : "")
          << (on_device ? " (with the engine on a device: the model as built on the host before it moves, "
                          "or the states offload keeps on the host)"
                        : "");
  if (activations > 0.0)
    message << "; activations at least " << gib_text(activations) << ": " << activation_keys;
  message << ". Reduce " << (states >= activations ? largest->keys : activation_keys)
          << ", or spread the model over more ranks or nodes (a higher zero_optimization.stage, offload)";
  ZT_THROW_AS(ConfigError, message.str());
}

namespace {
/// Bytes the step certainly holds on the device beyond the resident states, for its largest
/// (trainable) parameter: at stages 2-3 its full gradient while its layer's backward runs (the
/// partitioned gradient is what stays), and at stage 3 its gathered value then (unless it is
/// persistent, and so counted in the states). A lower bound: the rest of the layer and the gatherer's
/// prefetch window (predict_step_memory's upper reading) come on top.
std::uint64_t largest_parameter_in_step(const MemoryEstimate& estimate, const ZeroConfig& zero) {
  const auto whole =
      static_cast<std::uint64_t>(estimate.largest_parameter) * dtype_size(estimate.compute_dtype);
  std::uint64_t bytes = estimate.zero_stage >= 2 ? whole : 0;
  if (estimate.zero_stage == 3 && estimate.largest_parameter > zero.stage3_param_persistence_threshold)
    bytes += whole;
  return bytes;
}
}  // namespace

void check_fits_device_memory(const Config& config, int world_size, const DeviceMemory& device) {
  if (!config.model.has_value() || device.bytes == 0 || world_size < 1) return;
  const int stages = static_cast<int>(std::max<std::int64_t>(1, config.pipeline.stage_count()));
  // The largest stage's need decides: every rank computes every stage's, so all decide alike.
  struct Need {
    int stage = 0;
    MemoryEstimate estimate;
    std::uint64_t states = 0, buckets = 0, activations = 0, transient = 0;
    std::uint64_t total() const { return states + buckets + activations + transient; }
  };
  // The exact estimates replay every layer; beyond this many (far beyond real models) the model
  // states of the stage's parameter count as one tensor, without activations, are the lower bound.
  constexpr std::int64_t kExactLayers = 20000;
  std::int64_t layers = 0;
  if (const auto* gpt = std::get_if<GptModelConfig>(&*config.model)) {
    layers = gpt->n_layer;
  } else {
    layers = static_cast<std::int64_t>(std::get<MlpModelConfig>(*config.model).sizes.size());
  }
  const bool exact = layers <= kExactLayers;
  std::optional<Need> largest;
  for (int stage = 0; stage < (exact ? stages : 1); ++stage) {
    Need need;
    need.stage = stage;
    try {
      if (exact) {
        need.estimate = estimate_model_state_memory(config, world_size, 0, stage, DeviceType::cuda);
      } else {
        Config one_stage = config;
        one_stage.pipeline.stages = std::nullopt;
        double parameters = 0.0;
        for (const auto& term : engine_detail::parameter_count_terms_of_config(config))
          parameters += term.count;
        parameters /= stages;
        if (parameters >= 1e15) return;  // the host check has refused it already (its build alone)
        need.estimate = estimate_model_state_memory(one_stage, world_size / stages,
                                                    std::max<std::int64_t>(1, std::llround(parameters)));
      }
    } catch (const ConfigError&) {
      return;  // a config the engine refuses for other reasons: it says why, with its own message
    }
    need.states = need.estimate.device_bytes_with_cuda;
    need.buckets = need.estimate.bucket_buffers;
    need.activations = need.estimate.activations ? need.estimate.activations->peak : 0;
    need.transient = largest_parameter_in_step(need.estimate, config.zero_optimization);
    if (!largest || need.total() > largest->total()) largest = std::move(need);
  }
  if (!largest || largest->total() <= device.bytes) return;
  const MemoryEstimate& estimate = largest->estimate;
  const double states = static_cast<double>(largest->states);
  const double activations = static_cast<double>(largest->activations);
  std::ostringstream message;
  message << "the model cannot fit in the device's memory: each rank"
          << (stages > 1 ? " of pipeline stage " + std::to_string(largest->stage) : std::string())
          << " needs at least " << gib_text(static_cast<double>(largest->total())) << " on its device, but "
          << device.what << ". Model states there " << gib_text(states) << ": " << estimate.parameters_count
          << " parameters at ZeRO stage " << estimate.zero_stage << " over " << estimate.world_size
          << " data-parallel rank(s)";
  if (estimate.offload_device != OffloadDevice::none || estimate.param_offload_device != OffloadDevice::none)
    message << " (with the offloaded states on the host)";
  message << "; gradient buckets " << gib_text(static_cast<double>(largest->buckets));
  if (largest->transient > 0)
    message << "; the largest parameter whole during its backward (its full gradient"
            << (estimate.zero_stage == 3 ? " and its gathered value" : "") << ") "
            << gib_text(static_cast<double>(largest->transient));
  message << "; activations " << gib_text(activations)
          << " (the step's peak at train_micro_batch_size_per_gpu "
          << (estimate.activations ? estimate.activations->micro_batch_size : 0) << ")";
  message << ". Reduce ";
  if (activations > states) {
    message << "train_micro_batch_size_per_gpu (or model.seq_len), or checkpoint activations "
               "(pipeline.activation_checkpoint_interval, activation_checkpointing.cpu_checkpointing)";
  } else {
    const std::vector<engine_detail::ParameterCountTerm> terms =
        engine_detail::parameter_count_terms_of_config(config);
    const auto term = std::max_element(terms.begin(), terms.end(),
                                       [](const auto& a, const auto& b) { return a.count < b.count; });
    message << (term != terms.end() ? term->keys : std::string("the model"))
            << ", or raise zero_optimization.stage, offload (zero_optimization.offload_optimizer, "
               "offload_param), or spread the model over more GPUs";
  }
  ZT_THROW_AS(ConfigError, message.str());
}

}  // namespace zt
