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
  out << "  (activations, stage 3's gathered parameters and the allocator's slack come on top; the engine\n"
         "   pads each parameter to a multiple of N elements.)\n";
  return out.str();
}

}  // namespace zt
