// The partition plan (see partition_plan.hpp).
#include "src/engine/partition_plan.hpp"

#include <algorithm>
#include <iterator>
#include <string>
#include <variant>

#include "base/round_up.hpp"
#include "src/engine/model_layers.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/error.hpp"

namespace zt::engine_detail {
using base::round_up;

PlanSettings plan_settings(const Config& config, int data_size, int data_rank, int tensor_size,
                           int tensor_rank, bool engine_on_device) {
  const ZeroConfig& zero = config.zero_optimization;
  PlanSettings settings;
  settings.stage = zero.stage;
  settings.data_size = data_size;
  settings.data_rank = data_rank;
  settings.tensor_size = tensor_size;
  settings.tensor_rank = tensor_rank;
  settings.compute_dtype = compute_dtype_of(config);
  settings.wire_dtype = config.communication_data_type.value_or(settings.compute_dtype);
  if (config.optimizer && config.optimizer->type == OptimizerType::sgd) {
    settings.optimizer_state_arrays = config.optimizer->momentum != 0 ? 1 : 0;
  } else {
    settings.optimizer_state_arrays = 2;  // Adam / AdamW: exp_avg, exp_avg_sq
  }
  settings.reduce_bucket_elements = zero.reduce_bucket_size;
  settings.allgather_bucket_elements = zero.allgather_bucket_size;
  settings.overlap_comm = zero.overlap_comm;
  settings.persistence_threshold = zero.stage3_param_persistence_threshold;
  settings.optimizer_offload = zero.offload_optimizer.device;
  settings.sub_group_elements = zero.sub_group_size;
  settings.optimizer_buffer_count = zero.offload_optimizer.buffer_count;
  settings.parameter_offload =
      ZeroPartitioning::of_stage(zero.stage).parameters ? zero.offload_param.device : OffloadDevice::none;
  settings.max_in_cpu = zero.offload_param.max_in_cpu;
  settings.parameter_buffer_elements = zero.offload_param.buffer_size;
  settings.parameter_buffer_count = zero.offload_param.buffer_count;
  settings.engine_on_device = engine_on_device;
  return settings;
}

PartitionPlan::PartitionPlan(std::vector<PlannedParameter> parameters, const PlanSettings& settings)
    : settings_(settings), partitioning_(ZeroPartitioning::of_stage(settings.stage)) {
  ZT_CHECK(!parameters.empty(), "the model has no parameters to train");
  ZT_CHECK(settings_.data_size >= 1 && settings_.data_rank >= 0 && settings_.data_rank < settings_.data_size,
           "partition plan: data-parallel rank ", settings_.data_rank, " of ", settings_.data_size);
  ZT_CHECK(settings_.alignment >= 1, "partition plan: alignment ", settings_.alignment, " elements");
  const int parts = partition_count();
  const int rank = partition_rank();
  std::int64_t offset = 0;
  std::int64_t shard = 0;
  for (PlannedParameter& parameter : parameters) {
    FlatParameter slot;
    slot.name = std::move(parameter.name);
    slot.shape = std::move(parameter.shape);
    slot.role = parameter.role;
    slot.shard_dim = parameter.shard_dim;
    slot.pipeline_stage = parameter.pipeline_stage;
    slot.numel = shape_numel(slot.shape);
    slot.piece_numel = (slot.numel + parts - 1) / parts;
    slot.padded_numel = slot.piece_numel * parts;
    slot.offset = offset;
    slot.shard_offset = partitioning_.optimizer_states ? shard : offset;
    OwnedRange owned;
    owned.flat_begin = offset + rank * slot.piece_numel;
    owned.shard_begin = slot.shard_offset;
    owned.count = partitioning_.optimizer_states ? slot.piece_numel : slot.numel;
    owned.parameter_offset = partitioning_.parameters ? owned.shard_begin : owned.flat_begin;
    owned.gradient_offset = partitioning_.gradients ? owned.shard_begin : owned.flat_begin;
    layout_.push_back(std::move(slot));
    owned_.push_back(owned);
    parameter_count_ += layout_.back().numel;
    offset += round_up(layout_.back().padded_numel, settings_.alignment);
    shard += layout_.back().piece_numel;
  }
  flat_size_ = offset;
  shard_size_ = partitioning_.optimizer_states ? shard : flat_size_;

  piece_in_host_.assign(layout_.size(), 1);
  if (parameters_on_nvme()) {
    piece_in_host_ = pieces_kept_in_host(layout_, settings_.max_in_cpu);
    for (std::size_t i = 0; i < layout_.size(); ++i) {
      const std::int64_t piece = layout_[i].piece_numel;
      if (piece_in_host_[i] != 0) {
        host_piece_elements_ += piece;
        continue;
      }
      nvme_piece_elements_ += piece;
      if (!largest_swapped_ || piece > layout_[*largest_swapped_].piece_numel) largest_swapped_ = i;
    }
  } else if (partitioning_.parameters) {
    host_piece_elements_ = shard_size_;
  }

  if (optimizer_states_on_nvme()) {
    ZT_CHECK_AS(ConfigError, settings_.sub_group_elements > 0, "zero_optimization.sub_group_size is ",
                settings_.sub_group_elements, "; expected > 0");
    sub_groups_ = engine_detail::swap_sub_groups(shard_size_, settings_.sub_group_elements, swapped_arrays(),
                                                 settings_.io_alignment);
  }

  // Buckets never need to be larger than the whole model, and must hold the largest parameter
  // (its piece, when the gradients go to their owners).
  std::int64_t largest_numel = 0, largest_piece = 0, total_pieces = 0;
  for (const FlatParameter& slot : layout_) {
    largest_numel = std::max(largest_numel, slot.numel);
    largest_piece = std::max(largest_piece, slot.piece_numel);
    total_pieces += slot.piece_numel;
  }
  ZT_CHECK_AS(ConfigError, settings_.reduce_bucket_elements > 0,
              "zero_optimization.reduce_bucket_size must be positive, got ",
              settings_.reduce_bucket_elements);
  if (partitioning_.optimizer_states) {
    const std::int64_t per_rank = (settings_.reduce_bucket_elements + parts - 1) / parts;
    // No floor at the largest piece: the reducer splits a parameter over buckets, so the staging
    // (and a streamed gradient's rows) stay within reduce_bucket_size at any vocabulary.
    reduce_region_ = std::max<std::int64_t>(std::min(per_rank, total_pieces), 1);
    reduce_capacity_ = reduce_region_ * parts;
  } else {
    reduce_capacity_ = std::max(std::min(settings_.reduce_bucket_elements, parameter_count_), largest_numel);
  }
  if (partitioning_.optimizer_states && !partitioning_.parameters && parts > 1) {
    allgather_region_ = std::max(
        std::min((settings_.allgather_bucket_elements + parts - 1) / parts, shard_size_), largest_piece);
  }
}

std::int64_t PartitionPlan::parameter_buffer_elements() const {
  return partitioning_.parameters ? shard_size_ : flat_size_;
}

std::int64_t PartitionPlan::gradient_buffer_elements() const {
  return partitioning_.gradients ? shard_size_ : flat_size_;
}

bool PartitionPlan::parameters_on_nvme() const {
  return partitioning_.parameters && settings_.parameter_offload == OffloadDevice::nvme;
}

bool PartitionPlan::parameters_in_host_store() const {
  return parameters_on_nvme() || (partitioning_.parameters && settings_.engine_on_device &&
                                  settings_.parameter_offload == OffloadDevice::cpu);
}

bool PartitionPlan::separate_master() const {
  return settings_.compute_dtype != DType::fp32 || parameters_in_host_store();
}

bool PartitionPlan::optimizer_states_on_nvme() const {
  // fp32 plain SGD has nothing to offload: it trains as in memory.
  return settings_.optimizer_offload == OffloadDevice::nvme &&
         (separate_master() || settings_.optimizer_state_arrays > 0);
}

std::int64_t PartitionPlan::master_elements() const {
  return separate_master() && !master_in_swap() ? shard_size_ : 0;
}

std::size_t PartitionPlan::swapped_arrays() const {
  return optimizer_states_on_nvme() ? (master_in_swap() ? 1 : 0) + settings_.optimizer_state_arrays : 0;
}

bool PartitionPlan::persistent(std::size_t index) const {
  return partitioning_.parameters && layout_[index].numel <= settings_.persistence_threshold;
}

std::size_t PartitionPlan::parameter_buffer_count() const {
  if (!largest_swapped_) return 0;
  const auto swapped = static_cast<std::size_t>(
      std::count(piece_in_host_.begin(), piece_in_host_.end(), static_cast<char>(0)));
  return std::min(static_cast<std::size_t>(std::max<std::int64_t>(settings_.parameter_buffer_count, 1)),
                  swapped);
}

std::size_t PartitionPlan::parameter_buffer_bytes() const {
  if (!largest_swapped_) return 0;
  const std::size_t bytes =
      static_cast<std::size_t>(layout_[*largest_swapped_].piece_numel) * dtype_size(settings_.compute_dtype);
  return round_up(std::max<std::size_t>(bytes, 1), settings_.io_alignment);
}

std::size_t PartitionPlan::swap_array_stride(const SwapSubGroup& group) const {
  return engine_detail::swap_array_stride(group.count, settings_.io_alignment);
}

std::size_t PartitionPlan::optimizer_swap_buffer_count() const {
  return std::min(static_cast<std::size_t>(std::max<std::int64_t>(settings_.optimizer_buffer_count, 1)),
                  sub_groups_.size());
}

std::size_t PartitionPlan::optimizer_swap_buffer_bytes() const {
  std::size_t largest = 0;
  for (const SwapSubGroup& group : sub_groups_) largest = std::max(largest, group.bytes);
  return round_up(largest, settings_.io_alignment);
}

std::uint64_t PartitionPlan::bucket_bytes() const {
  std::uint64_t bytes = 0;
  // Gradients are communicated when they go to their owners, or on more than one rank.
  if (partitioning_.gradients || settings_.data_size > 1) {
    bytes += dtype_size(settings_.wire_dtype) * static_cast<std::uint64_t>(reduce_capacity_) *
             (settings_.overlap_comm ? 2 : 1);
  }
  bytes += dtype_size(settings_.compute_dtype) * static_cast<std::uint64_t>(allgather_region_) *
           static_cast<std::uint64_t>(partition_count());
  return bytes;
}

std::pair<std::int64_t, std::int64_t> PartitionPlan::checkpoint_range(std::size_t index) const {
  const FlatParameter& slot = layout_[index];
  const int ranks = settings_.data_size;
  const std::int64_t piece =
      partitioning_.optimizer_states ? slot.piece_numel : (slot.numel + ranks - 1) / ranks;
  const std::int64_t first = std::min<std::int64_t>(settings_.data_rank * piece, slot.numel);
  return {first, std::clamp<std::int64_t>(slot.numel - first, 0, piece)};
}

ModelStateBytes PartitionPlan::model_state_bytes() const {
  const std::uint64_t element = dtype_size(settings_.compute_dtype);
  ModelStateBytes bytes;
  if (parameters_on_nvme()) {
    bytes.parameters = element * static_cast<std::uint64_t>(host_piece_elements_) +
                       parameter_buffer_count() * parameter_buffer_bytes();
    bytes.parameters_nvme = element * static_cast<std::uint64_t>(nvme_piece_elements_);
  } else {
    bytes.parameters = element * static_cast<std::uint64_t>(parameter_buffer_elements());
  }
  for (std::size_t i = 0; i < layout_.size(); ++i) {
    // Persistent stage-3 parameters stay gathered whole, besides their piece in the shard.
    if (persistent(i)) bytes.parameters += element * static_cast<std::uint64_t>(layout_[i].numel);
  }
  bytes.gradients = element * static_cast<std::uint64_t>(gradient_buffer_elements());
  if (optimizer_states_on_nvme()) {
    bytes.optimizer_states = optimizer_swap_buffer_count() * optimizer_swap_buffer_bytes();
    bytes.optimizer_states_nvme = sizeof(float) * swapped_arrays() * static_cast<std::uint64_t>(shard_size_);
  } else {
    std::uint64_t owned_elements = 0;
    for (const OwnedRange& range : owned_) owned_elements += static_cast<std::uint64_t>(range.count);
    bytes.optimizer_states = sizeof(float) * (static_cast<std::uint64_t>(master_elements()) +
                                              settings_.optimizer_state_arrays * owned_elements);
  }
  return bytes;
}

std::vector<char> pieces_kept_in_host(const std::vector<FlatParameter>& layout, std::int64_t max_in_cpu) {
  std::vector<char> in_host(layout.size(), 0);
  std::int64_t budget = std::max<std::int64_t>(max_in_cpu, 0);
  for (std::size_t i = 0; i < layout.size(); ++i) {
    if (layout[i].piece_numel > budget) continue;
    in_host[i] = 1;
    budget -= layout[i].piece_numel;
  }
  return in_host;
}

std::size_t swap_array_stride(std::int64_t count, std::size_t alignment) {
  return round_up(static_cast<std::size_t>(count) * sizeof(float), alignment);
}

std::vector<SwapSubGroup> swap_sub_groups(std::int64_t shard, std::int64_t sub_group, std::size_t arrays,
                                          std::size_t alignment) {
  ZT_CHECK(sub_group > 0 && arrays >= 1, "swap sub-groups of ", sub_group, " elements with ", arrays,
           " arrays");
  std::vector<SwapSubGroup> groups;
  for (std::int64_t first = 0; first < shard; first += sub_group) {
    SwapSubGroup group;
    group.first = first;
    group.count = std::min(sub_group, shard - first);
    group.bytes = (arrays - 1) * swap_array_stride(group.count, alignment) +
                  static_cast<std::size_t>(group.count) * sizeof(float);
    groups.push_back(group);
  }
  return groups;
}

std::vector<PlannedParameter> planned_parameters(const std::vector<nn::Parameter*>& parameters) {
  std::vector<PlannedParameter> planned;
  planned.reserve(parameters.size());
  for (const nn::Parameter* parameter : parameters) {
    ZT_CHECK(parameter->value.defined(), "parameter '", parameter->name, "' has no value");
    planned.push_back({parameter->name, parameter->value.shape(), parameter->role, parameter->shard_dim,
                       parameter->pipeline_stage});
  }
  return planned;
}

namespace {

/// The parameters of the config's model layer by layer, in the order of layers_of_config (the
/// layers of zt::nn::gpt_layers / mlp_layers, their parameters in registration order). A tied GPT's
/// head holds no parameter of its own here: its copy of "wte.weight" exists only on a stage
/// without the embeddings (planned_parameters_of_stage adds it).
std::vector<std::vector<PlannedParameter>> planned_layers_of_config(const Config& config) {
  ZT_CHECK_AS(ConfigError, config.model.has_value(),
              "the config has no \"model\" section; pass --params N to estimate for N parameters");
  std::vector<std::vector<PlannedParameter>> layers;
  auto add = [&](std::string name, Shape shape) {
    layers.back().push_back({std::move(name), std::move(shape)});
  };
  if (const auto* gpt = std::get_if<GptModelConfig>(&*config.model)) {
    // nn::Gpt's registration order: wte, wpe, blocks h.i (ln1, attn.qkv, attn.proj, ln2, mlp.fc,
    // mlp.proj), ln_f, lm_head (its own weight only when untied).
    const std::int64_t C = gpt->d_model;
    layers.emplace_back();  // "embeddings"
    add("wte.weight", {gpt->vocab_size, C});
    add("wpe.weight", {gpt->seq_len, C});
    for (std::int64_t layer = 0; layer < gpt->n_layer; ++layer) {
      layers.emplace_back();  // "h.<layer>"
      const std::string block = "h." + std::to_string(layer) + ".";
      add(block + "ln1.weight", {C});
      add(block + "ln1.bias", {C});
      add(block + "attn.qkv.weight", {3 * C, C});
      add(block + "attn.qkv.bias", {3 * C});
      add(block + "attn.proj.weight", {C, C});
      add(block + "attn.proj.bias", {C});
      add(block + "ln2.weight", {C});
      add(block + "ln2.bias", {C});
      add(block + "mlp.fc.weight", {4 * C, C});
      add(block + "mlp.fc.bias", {4 * C});
      add(block + "mlp.proj.weight", {C, 4 * C});
      add(block + "mlp.proj.bias", {C});
    }
    layers.emplace_back();  // "head"
    add("ln_f.weight", {C});
    add("ln_f.bias", {C});
    if (!gpt->tie_embeddings) add("lm_head.weight", {gpt->vocab_size, C});
    return layers;
  }
  // nn::Mlp: Linear layers "0", "2", ... with activations (no parameters) between them.
  const auto& sizes = std::get<MlpModelConfig>(*config.model).sizes;
  for (std::size_t i = 0; i + 1 < sizes.size(); ++i) {
    layers.emplace_back();
    const std::string layer = std::to_string(2 * i) + ".";
    add(layer + "weight", {sizes[i + 1], sizes[i]});
    add(layer + "bias", {sizes[i + 1]});
    if (i + 2 < sizes.size()) layers.emplace_back();
  }
  return layers;
}

}  // namespace

std::vector<PlannedParameter> planned_parameters_of_config(const Config& config) {
  std::vector<PlannedParameter> planned;
  for (std::vector<PlannedParameter>& layer : planned_layers_of_config(config))
    std::move(layer.begin(), layer.end(), std::back_inserter(planned));
  return planned;
}

std::vector<ParameterCountTerm> parameter_count_terms_of_config(const Config& config) {
  ZT_CHECK_AS(ConfigError, config.model.has_value(), "the config has no \"model\" section");
  if (const auto* gpt = std::get_if<GptModelConfig>(&*config.model)) {
    // The shapes of planned_layers_of_config: wte and (untied) lm_head [V, C], wpe [T, C]; per block
    // ln1, ln2 (2C each), qkv 3C^2 + 3C, proj C^2 + C, fc 4C^2 + 4C, mlp.proj 4C^2 + C; ln_f 2C.
    const double C = static_cast<double>(gpt->d_model);
    return {
        {"model.vocab_size x model.d_model" + std::string(gpt->tie_embeddings ? "" : " (twice, untied)"),
         static_cast<double>(gpt->vocab_size) * C * (gpt->tie_embeddings ? 1.0 : 2.0)},
        {"model.seq_len x model.d_model", static_cast<double>(gpt->seq_len) * C},
        {"model.n_layer x 12 model.d_model^2", static_cast<double>(gpt->n_layer) * (12.0 * C * C + 13.0 * C)},
        {"model.d_model (ln_f)", 2.0 * C},
    };
  }
  const auto& sizes = std::get<MlpModelConfig>(*config.model).sizes;
  double count = 0.0;
  for (std::size_t i = 0; i + 1 < sizes.size(); ++i)
    count += static_cast<double>(sizes[i + 1]) * (static_cast<double>(sizes[i]) + 1.0);
  return {{"model.sizes", count}};
}

std::vector<PlannedParameter> planned_parameters_of_stage(const Config& config, int stage) {
  std::vector<std::vector<PlannedParameter>> layers = planned_layers_of_config(config);
  const std::vector<std::int64_t> boundaries = stage_boundaries_of_config(config);
  ZT_CHECK(boundaries.back() == static_cast<std::int64_t>(layers.size()), "the config's model has ",
           boundaries.back(), " pipeline layers but its plan ", layers.size());
  const int stages = static_cast<int>(boundaries.size()) - 1;
  ZT_CHECK_AS(ConfigError, stage >= 0 && stage < stages, "pipeline stage ", stage,
              " of a config with pipeline.stages = ", stages, ": expected 0 <= stage < ", stages);
  const auto first = static_cast<std::size_t>(boundaries[static_cast<std::size_t>(stage)]);
  const auto end = static_cast<std::size_t>(boundaries[static_cast<std::size_t>(stage) + 1]);
  std::vector<PlannedParameter> planned;
  const auto* gpt = std::get_if<GptModelConfig>(&*config.model);
  for (std::size_t layer = first; layer < end; ++layer) {
    // A tied head on a stage without the embeddings holds its own copy of the token embedding,
    // registered before ln_f (zt::nn::gpt_layers).
    if (gpt != nullptr && gpt->tie_embeddings && layer + 1 == layers.size() && first > 0)
      planned.push_back({"wte.weight", {gpt->vocab_size, gpt->d_model}});
    std::move(layers[layer].begin(), layers[layer].end(), std::back_inserter(planned));
  }
  for (PlannedParameter& parameter : planned) parameter.pipeline_stage = stage;
  return planned;
}

}  // namespace zt::engine_detail
