// `zerotrain plan`'s candidates: their syntax, the batch rule, their configs and predicted memory.
#include <algorithm>
#include <charconv>
#include <string>

#include "src/engine/model_layers.hpp"
#include "src/engine/plan.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/estimate.hpp"

namespace zt::engine_detail {
namespace {

std::vector<std::string_view> split(std::string_view text, char separator) {
  std::vector<std::string_view> parts;
  std::size_t begin = 0;
  while (true) {
    const std::size_t end = text.find(separator, begin);
    parts.push_back(text.substr(begin, end == std::string_view::npos ? std::string_view::npos : end - begin));
    if (end == std::string_view::npos) return parts;
    begin = end + 1;
  }
}

std::string_view trimmed(std::string_view text) {
  while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  return text;
}

constexpr const char* kSyntax =
    "expected KEY=V1,V2;... with keys stage (0-3), offload (none, cpu, cpu+params) and micro (micro-batch "
    "sizes per rank), e.g. \"stage=1,2;offload=none,cpu;micro=4,8\"";

std::int64_t whole_number(std::string_view text, std::string_view part, std::int64_t min, std::int64_t max) {
  std::int64_t value = 0;
  const auto [stop, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  ZT_CHECK_AS(ConfigError, error == std::errc() && stop == text.data() + text.size() && !text.empty(),
              "--candidates: '", text, "' in '", part, "' is not a whole number; ", kSyntax);
  ZT_CHECK_AS(ConfigError, value >= min && value <= max, "--candidates: ", value, " in '", part,
              "' is out of range: expected ", min, "..", max);
  return value;
}

std::string list_text(const std::vector<std::int64_t>& values) {
  std::string text;
  for (std::int64_t value : values) text += (text.empty() ? "" : ", ") + std::to_string(value);
  return text;
}

std::vector<std::int64_t> divisors(std::int64_t n) {
  std::vector<std::int64_t> found;
  for (std::int64_t d = 1; d * d <= n; ++d) {
    if (n % d != 0) continue;
    found.push_back(d);
    if (d != n / d) found.push_back(n / d);
  }
  std::sort(found.begin(), found.end());
  return found;
}

}  // namespace

std::string_view plan_offload_name(PlanOffload offload) {
  switch (offload) {
    case PlanOffload::none:
      return "none";
    case PlanOffload::cpu:
      return "cpu";
    case PlanOffload::cpu_params:
      return "cpu+params";
  }
  return "none";
}

std::string PlanCandidate::name() const {
  return "stage " + std::to_string(stage) + ", offload " + std::string(plan_offload_name(offload)) +
         ", micro " + std::to_string(micro_batch) + " x gas " + std::to_string(accumulation);
}

CandidateSpace parse_candidate_space(std::string_view text) {
  CandidateSpace space;
  std::vector<std::string_view> seen;
  for (std::string_view raw : split(text, ';')) {
    const std::string_view part = trimmed(raw);
    if (part.empty()) continue;  // "stage=1;" and the like
    const std::size_t equals = part.find('=');
    ZT_CHECK_AS(ConfigError, equals != std::string_view::npos, "--candidates: '", part, "' has no '='; ",
                kSyntax);
    const std::string_view key = trimmed(part.substr(0, equals));
    ZT_CHECK_AS(ConfigError, std::find(seen.begin(), seen.end(), key) == seen.end(), "--candidates: key '",
                key, "' is given twice");
    seen.push_back(key);
    std::vector<std::string_view> values;
    for (std::string_view value : split(part.substr(equals + 1), ',')) {
      value = trimmed(value);
      ZT_CHECK_AS(ConfigError, !value.empty(), "--candidates: '", part, "' has an empty value; ", kSyntax);
      values.push_back(value);
    }
    if (key == "stage") {
      space.stages.clear();
      for (std::string_view value : values) {
        const int stage = static_cast<int>(whole_number(value, part, 0, 3));
        if (std::find(space.stages.begin(), space.stages.end(), stage) == space.stages.end())
          space.stages.push_back(stage);
      }
    } else if (key == "offload") {
      space.offloads.clear();
      for (std::string_view value : values) {
        PlanOffload offload = PlanOffload::none;
        if (value == "none") {
          offload = PlanOffload::none;
        } else if (value == "cpu") {
          offload = PlanOffload::cpu;
        } else if (value == "cpu+params") {
          offload = PlanOffload::cpu_params;
        } else {
          ZT_THROW_AS(ConfigError, "--candidates: offload '", value,
                      "' is not one of none, cpu (optimizer states in host memory) and cpu+params "
                      "(parameters too, stage 3)");
        }
        if (std::find(space.offloads.begin(), space.offloads.end(), offload) == space.offloads.end())
          space.offloads.push_back(offload);
      }
    } else if (key == "micro") {
      space.micro_batches.clear();
      for (std::string_view value : values) {
        const std::int64_t micro = whole_number(value, part, 1, std::int64_t{1} << 40);
        if (std::find(space.micro_batches.begin(), space.micro_batches.end(), micro) ==
            space.micro_batches.end())
          space.micro_batches.push_back(micro);
      }
    } else {
      ZT_THROW_AS(ConfigError, "--candidates: unknown key '", key, "'; ", kSyntax);
    }
  }
  return space;
}

void check_global_batch(std::int64_t global_batch, int ranks) {
  ZT_CHECK_AS(ConfigError, global_batch >= 1, "--global-batch must be at least 1, got ", global_batch);
  if (global_batch % ranks == 0) return;
  const std::int64_t below = global_batch / ranks * ranks;
  const std::int64_t above = below + ranks;
  ZT_THROW_AS(ConfigError, "--global-batch ", global_batch, " cannot be split over ", ranks,
              " data-parallel ranks: train_batch_size = micro x gradient_accumulation_steps x ", ranks,
              " needs a multiple of ", ranks, "; the nearest are ",
              below > 0 ? std::to_string(below) + " and " : std::string(), above);
}

std::vector<std::int64_t> default_micro_batches(std::int64_t global_batch, int ranks) {
  check_global_batch(global_batch, ranks);
  const std::int64_t per_rank = global_batch / ranks;
  std::vector<std::int64_t> micro;
  for (std::int64_t d : divisors(per_rank)) {
    if (per_rank / d <= 8) micro.push_back(d);
  }
  std::reverse(micro.begin(), micro.end());
  return micro;
}

std::vector<PlanCandidate> expand_candidates(const CandidateSpace& space, std::int64_t global_batch,
                                             int ranks) {
  check_global_batch(global_batch, ranks);
  const std::int64_t per_rank = global_batch / ranks;
  const std::vector<std::int64_t> micro_batches =
      space.micro_batches.empty() ? default_micro_batches(global_batch, ranks) : space.micro_batches;
  for (std::int64_t micro : micro_batches) {
    ZT_CHECK_AS(ConfigError, per_rank % micro == 0, "--candidates: micro=", micro, " does not divide the ",
                per_rank, " samples per rank of global batch ", global_batch, " on ", ranks,
                " rank(s) (train_batch_size = micro x gradient_accumulation_steps x ranks); valid: ",
                list_text(divisors(per_rank)));
  }
  std::vector<PlanCandidate> candidates;
  for (int stage : space.stages) {
    for (PlanOffload offload : space.offloads) {
      if (offload == PlanOffload::cpu && stage == 0) continue;         // optimizer offload: stages 1-3
      if (offload == PlanOffload::cpu_params && stage != 3) continue;  // parameter offload: stage 3
      for (std::int64_t micro : micro_batches)
        candidates.push_back({stage, offload, micro, per_rank / micro});
    }
  }
  ZT_CHECK_AS(ConfigError, !candidates.empty(),
              "--candidates: no candidate: optimizer offload (cpu) needs stage 1-3 and cpu+params stage 3");
  return candidates;
}

nlohmann::json candidate_config_json(const nlohmann::json& base, const PlanCandidate& candidate,
                                     std::int64_t global_batch) {
  nlohmann::json config = base;
  config["train_batch_size"] = global_batch;
  config["train_micro_batch_size_per_gpu"] = candidate.micro_batch;
  config["gradient_accumulation_steps"] = candidate.accumulation;
  nlohmann::json& zero = config["zero_optimization"];
  if (!zero.is_object()) zero = nlohmann::json::object();
  zero["stage"] = candidate.stage;
  const auto place = [&zero](const char* key, bool on) {
    if (!on) {
      zero.erase(key);
      return;
    }
    nlohmann::json& section = zero[key];
    if (!section.is_object()) section = nlohmann::json::object();
    section["device"] = "cpu";
    section.erase("nvme_path");
  };
  place("offload_optimizer", candidate.offload != PlanOffload::none);
  place("offload_param", candidate.offload == PlanOffload::cpu_params);
  return config;
}

PredictedMemory predict_step_memory(const Config& config, int ranks) {
  const MemoryEstimate estimate = estimate_model_state_memory(config, ranks);
  PredictedMemory predicted;
  predicted.model_states = estimate.resident();
  predicted.buckets = estimate.bucket_buffers;
  predicted.activations = estimate.activations ? estimate.activations->peak : 0;
  std::int64_t largest_layer = 0;
  for (const nn::LayerSpec& layer : layers_of_config(config))
    largest_layer = std::max(largest_layer, layer.parameter_count);
  const auto element = static_cast<std::uint64_t>(dtype_size(estimate.compute_dtype));
  if (estimate.zero_stage >= 2) predicted.transient += element * static_cast<std::uint64_t>(largest_layer);
  if (estimate.zero_stage == 3) {
    const std::int64_t gathered = std::min(
        estimate.parameters_count, largest_layer + config.zero_optimization.stage3_max_live_parameters);
    predicted.transient += element * static_cast<std::uint64_t>(gathered);
  }
  return predicted;
}

}  // namespace zt::engine_detail
