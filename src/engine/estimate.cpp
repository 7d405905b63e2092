// The ZeRO memory formulas, for `zerotrain estimate`.
#include "zerotrain/estimate.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <variant>

#include "zerotrain/engine.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/nn.hpp"

namespace zt {

std::int64_t model_parameter_count(const Config& config) {
  ZT_CHECK_AS(ConfigError, config.model.has_value(),
              "the config has no \"model\" section; pass --params N to estimate for N parameters");
  if (const auto* gpt = std::get_if<GptModelConfig>(&*config.model)) {
    return nn::gpt_parameter_count({gpt->n_layer, gpt->n_head, gpt->d_model, gpt->seq_len, gpt->vocab_size,
                                    gpt->tie_embeddings, gpt->dropout});
  }
  const auto& sizes = std::get<MlpModelConfig>(*config.model).sizes;
  std::int64_t count = 0;
  for (std::size_t i = 0; i + 1 < sizes.size(); ++i) count += sizes[i] * sizes[i + 1] + sizes[i + 1];
  return count;
}

std::int64_t model_largest_parameter(const Config& config) {
  if (!config.model.has_value()) return 0;
  if (const auto* gpt = std::get_if<GptModelConfig>(&*config.model)) {
    // Token and position tables, the MLP's d x 4d matrices (attention's are 3d x d and d x d).
    return std::max(
        {gpt->vocab_size * gpt->d_model, gpt->seq_len * gpt->d_model, 4 * gpt->d_model * gpt->d_model});
  }
  const auto& sizes = std::get<MlpModelConfig>(*config.model).sizes;
  std::int64_t largest = 0;
  for (std::size_t i = 0; i + 1 < sizes.size(); ++i) largest = std::max(largest, sizes[i] * sizes[i + 1]);
  return largest;
}

MemoryEstimate estimate_model_state_memory(const Config& config, int world_size,
                                           std::int64_t parameters_count) {
  ZT_CHECK_AS(ConfigError, world_size >= 1, "--world-size must be at least 1, got ", world_size);
  MemoryEstimate estimate;
  estimate.parameters_count = parameters_count > 0 ? parameters_count : model_parameter_count(config);
  estimate.world_size = world_size;
  estimate.zero_stage = config.zero_optimization.stage;
  estimate.compute_dtype = compute_dtype_of(config);
  const std::uint64_t psi = static_cast<std::uint64_t>(estimate.parameters_count);
  const std::uint64_t n = static_cast<std::uint64_t>(world_size);
  const std::uint64_t element = dtype_size(estimate.compute_dtype);
  int moments = 8;  // Adam / AdamW: exp_avg + exp_avg_sq
  if (config.optimizer && config.optimizer->type == OptimizerType::sgd)
    moments = config.optimizer->momentum != 0 ? 4 : 0;
  estimate.optimizer_bytes_per_parameter = moments + (estimate.compute_dtype == DType::fp32 ? 0 : 4);
  const std::uint64_t shard = (psi + n - 1) / n;  // elements per rank when partitioned
  const int stage = estimate.zero_stage;
  estimate.parameters = element * (stage >= 3 ? shard : psi);
  estimate.gradients = element * (stage >= 2 ? shard : psi);
  estimate.optimizer_states =
      static_cast<std::uint64_t>(estimate.optimizer_bytes_per_parameter) * (stage >= 1 ? shard : psi);

  const auto& zero = config.zero_optimization;
  // Offload: where the states live, and where DeepSpeed would put everything with CUDA.
  const OffloadOptimizerConfig& offload = zero.offload_optimizer;
  estimate.offload_device = offload.device;
  estimate.optimizer_states_host = estimate.optimizer_states;
  const std::uint64_t arrays = static_cast<std::uint64_t>(estimate.optimizer_bytes_per_parameter) / 4;
  if (offload.device == OffloadDevice::nvme && arrays > 0) {
    constexpr std::uint64_t kAlignment = 4096;  // the usual direct-I/O alignment (statx says per disk)
    const std::uint64_t owned = stage >= 1 ? shard : psi;
    const std::uint64_t sub_group =
        std::min<std::uint64_t>(static_cast<std::uint64_t>(zero.sub_group_size), owned);
    const std::uint64_t groups = (owned + sub_group - 1) / sub_group;
    const std::uint64_t buffers =
        std::min<std::uint64_t>(static_cast<std::uint64_t>(offload.buffer_count), groups);
    const std::uint64_t array_bytes = (sub_group * 4 + kAlignment - 1) / kAlignment * kAlignment;
    const std::uint64_t group_bytes = (arrays - 1) * array_bytes + sub_group * 4;
    estimate.optimizer_states_host = buffers * ((group_bytes + kAlignment - 1) / kAlignment * kAlignment);
    estimate.nvme_bytes = estimate.optimizer_states;
  }
  // Parameter offload (stage 3): the pieces kept in host memory and the read buffers.
  const OffloadParamConfig& offload_param = zero.offload_param;
  estimate.param_offload_device = stage >= 3 ? offload_param.device : OffloadDevice::none;
  estimate.largest_parameter = model_largest_parameter(config);
  estimate.parameters_host = estimate.parameters;
  if (estimate.param_offload_device == OffloadDevice::nvme) {
    constexpr std::uint64_t kAlignment = 4096;
    const std::uint64_t kept = std::min<std::uint64_t>(
        static_cast<std::uint64_t>(std::max<std::int64_t>(offload_param.max_in_cpu, 0)), shard);
    estimate.parameters_host = element * kept;
    estimate.parameters_nvme = element * (shard - kept);
    if (kept < shard) {
      const std::uint64_t largest_piece =
          estimate.largest_parameter > 0
              ? (static_cast<std::uint64_t>(estimate.largest_parameter) + n - 1) / n
              : std::min<std::uint64_t>(static_cast<std::uint64_t>(offload_param.buffer_size), shard);
      const std::uint64_t buffer = (largest_piece * element + kAlignment - 1) / kAlignment * kAlignment;
      estimate.parameters_host += static_cast<std::uint64_t>(offload_param.buffer_count) * buffer;
    }
  }
  estimate.device_bytes_with_cuda = estimate.parameters + estimate.gradients;
  estimate.host_bytes_with_cuda = 0;
  if (offload.device == OffloadDevice::none) {
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
    const double p = static_cast<double>(psi);
    const double g = static_cast<double>(n);
    const double factor = 1.5;
    const double largest = static_cast<double>(estimate.largest_parameter);
    double gpu = 0;
    double cpu = 0;
    const bool offloaded = offload.device != OffloadDevice::none;
    // DeepSpeed's stage-3 estimator knows parameter offload only together with optimizer offload.
    const bool params_offloaded = estimate.param_offload_device != OffloadDevice::none;
    if (stage <= 2) {  // DeepSpeed has no stage-1 estimator; its stage-2 one is used
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

  const std::uint64_t wire = dtype_size(config.communication_data_type.value_or(estimate.compute_dtype));
  const bool reduces = stage >= 2 || n > 1;  // stages 0-1 on one rank communicate nothing
  if (reduces) {
    const std::uint64_t bucket =
        std::min<std::uint64_t>(static_cast<std::uint64_t>(zero.reduce_bucket_size), psi);
    estimate.bucket_buffers += wire * bucket * (zero.overlap_comm ? 2 : 1);
  }
  if ((stage == 1 || stage == 2) && n > 1) {
    estimate.bucket_buffers +=
        element * std::min<std::uint64_t>(static_cast<std::uint64_t>(zero.allgather_bucket_size), psi);
  }
  return estimate;
}

std::string MemoryEstimate::table() const {
  const int k = static_cast<int>(dtype_size(compute_dtype));
  const int big_k = optimizer_bytes_per_parameter;
  auto line = [](std::ostringstream& out, const char* name, std::uint64_t bytes, const std::string& formula) {
    char text[160];
    std::snprintf(text, sizeof text, "  %-18s %16llu B  %10.3f GiB   %s\n", name,
                  static_cast<unsigned long long>(bytes),
                  static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0), formula.c_str());
    out << text;
  };
  const std::string per_rank = "/N";
  std::ostringstream out;
  out << "model states per rank: " << parameters_count << " parameters (Ψ), ZeRO stage " << zero_stage << ", "
      << world_size << " data-parallel rank(s) (N), " << dtype_name(compute_dtype) << " (k = " << k
      << " bytes), optimizer states K = " << big_k << " bytes per parameter\n";
  line(out, "parameters", parameters, std::to_string(k) + "Ψ" + (zero_stage >= 3 ? per_rank : ""));
  line(out, "gradients", gradients, std::to_string(k) + "Ψ" + (zero_stage >= 2 ? per_rank : ""));
  line(out, "optimizer_states", optimizer_states,
       std::to_string(big_k) + "Ψ" + (zero_stage >= 1 ? per_rank : ""));
  line(out, "total", total(), "");
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
             " (this build trains on the host)");
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
      line(out, "with CUDA: host", host_bytes_with_cuda, "parameter pieces (this build trains on the host)");
    }
  }
  line(out, "DeepSpeed GPU", deepspeed_gpu_bytes,
       std::string("per GPU, ") +
           (zero_stage <= 2 ? "estimate_zero2_model_states_mem_needs"
                            : "estimate_zero3_model_states_mem_needs") +
           (param_offload_device != OffloadDevice::none ? " (cpu_offload, cpu_offload_params)"
            : offload_device != OffloadDevice::none     ? " (cpu_offload)"
                                                        : ""));
  line(out, "DeepSpeed CPU", deepspeed_cpu_bytes, "per node of N GPUs, additional_buffer_factor 1.5");
  out << "  (activations, stage 3's gathered parameters and the allocator's slack come on top; the engine\n"
         "   pads each parameter to a multiple of N elements.)\n";
  return out.str();
}

}  // namespace zt
