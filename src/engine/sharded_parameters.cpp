// ZeRO stage 3's sharded parameters (see sharded_parameters.hpp).
#include "src/engine/sharded_parameters.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

#include "kernels/nn_kernels.hpp"
#include "src/engine/swap_options_from_config.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/swap.hpp"

namespace zt::engine_detail {

ShardedParameters::ShardedParameters(const StrategyInputs& inputs) : ZeroStrategy(inputs) {
  const std::size_t element = element_size();
  // On a device the pieces in the host store are updated where they are, in its host memory: only
  // the host optimizer writes there (the device's kernels write device memory), so its master and
  // states must be on the host too.
  ZT_CHECK_AS(ConfigError,
              !plan_.parameters_in_host_store() || execution_.device().is_host() ||
                  plan_.settings().optimizer_offload != OffloadDevice::none,
              "zero_optimization.offload_param.device \"", to_string(plan_.settings().parameter_offload),
              "\" with the engine on ", execution_.device().str(),
              " needs zero_optimization.offload_optimizer.device \"cpu\" or \"nvme\": the new parameters are "
              "written into the parameter store's host memory by the host optimizer, which needs the master "
              "and optimizer states on the host (set offload_optimizer.device to \"cpu\" or \"nvme\", or "
              "train on the host)");
  shard_ = execution_.allocate(static_cast<std::size_t>(plan_.parameter_buffer_elements()) * element,
                               MemoryCategory::parameters);
  execution_.zero(shard_.data(), shard_.size());  // padding stays zero: no update moves it
  const int rank = plan_.partition_rank();
  for (std::size_t i = 0; i < model_parameters_.size(); ++i) {
    const FlatParameter& slot = plan_.layout()[i];
    const std::int64_t begin = rank * slot.piece_numel;
    const std::int64_t real = std::clamp<std::int64_t>(slot.numel - begin, 0, slot.piece_numel);
    if (real > 0) {
      execution_.from_host(shard_.as<std::byte>() + static_cast<std::size_t>(slot.shard_offset) * element,
                           static_cast<const std::byte*>(model_parameters_[i]->value.raw_data()) +
                               static_cast<std::size_t>(begin) * element,
                           static_cast<std::size_t>(real) * element);
    }
  }

  const ZeroConfig& zero = inputs.config.zero_optimization;
  if (!plan_.parameters_in_host_store()) {
    store_ = std::make_unique<ParameterStore>(plan_.layout(), dtype_, shard_.as<std::byte>(), execution_);
  } else {
    const OffloadParamConfig& offload = zero.offload_param;
    ParameterStoreOptions options;
    options.dtype = dtype_;
    if (plan_.parameters_on_nvme()) {
      ZT_CHECK_AS(ConfigError, offload.nvme_path.has_value(),
                  "zero_optimization.offload_param.nvme_path: required when device is \"nvme\"");
      options.swap = swap_options_from_config(inputs.config.aio, *offload.nvme_path);
      options.swap->pin_memory = offload.pin_memory;
      options.max_in_cpu = offload.max_in_cpu;
    } else {
      // offload_param "cpu" on a device: every piece in host memory, no swap file.
      options.max_in_cpu = std::numeric_limits<std::int64_t>::max();
    }
    options.buffer_elements = offload.buffer_size;
    options.buffer_count = static_cast<std::size_t>(offload.buffer_count);
    options.pin_memory = offload.pin_memory;
    store_ =
        std::make_unique<ParameterStore>(plan_.layout(), options, shard_.as<const std::byte>(), execution_);
  }

  std::vector<std::vector<std::size_t>> uses;
  for (const ModuleUse& use : inputs.uses) uses.push_back(use.parameters);
  ParameterGathererOptions gathering;
  gathering.dtype = dtype_;
  gathering.prefetch_elements = zero.stage3_prefetch_bucket_size;
  // A zt::ExternalModel's forward and backward are the caller's, who reads the full values from its
  // own buffers: every parameter stays gathered there (each buffer is the "persistent" copy), and
  // is gathered again after each update and load, straight into the caller's buffer through
  // staging of allgather_bucket_size elements. The engine itself keeps only the rank's pieces.
  for (std::size_t i = 0; i < plan_.size(); ++i)
    gathering.persistent.push_back(external_ != nullptr || plan_.persistent(i) ? 1 : 0);
  gathering.max_live = zero.stage3_max_live_parameters;
  gathering.max_reuse_distance = zero.stage3_max_reuse_distance;
  gathering.allgather_bucket_elements = zero.allgather_bucket_size;
  // Persistent parameters stay gathered for good: their values move to the device once (on the
  // host they stay where the model put them).
  for (std::size_t i = 0; i < model_parameters_.size(); ++i) {
    if (gathering.persistent[i] != 0)
      model_parameters_[i]->value =
          execution_.on_device(model_parameters_[i]->value, MemoryCategory::parameters);
  }
  gatherer_ = std::make_unique<ParameterGatherer>(*parallel_.data().device, execution_, plan_.layout(),
                                                  model_parameters_, std::move(uses), *store_, gathering);
}

ShardedParameters::~ShardedParameters() = default;

void ShardedParameters::drop_initial_shard() {
  if (plan_.parameters_in_host_store()) shard_ = Buffer();
}

void ShardedParameters::begin_forward(bool training) {
  gatherer_->begin_pass(training);
}

void ShardedParameters::before_forward(const ModuleUse& use) {
  gatherer_->before(use.index, Phase::forward);
}

void ShardedParameters::after_forward(const ModuleUse& use) {
  gatherer_->after(use.index, Phase::forward);
}

void ShardedParameters::gather_for_backward(const ModuleUse& use) {
  gatherer_->before(use.index, Phase::backward);
}

void ShardedParameters::release_after_backward(const ModuleUse& use) {
  gatherer_->after(use.index, Phase::backward);
  gatherer_->poll();
}

void ShardedParameters::end_of_backward() {
  gatherer_->end_of_backward();
}

std::byte* ShardedParameters::parameters(std::size_t index) {
  if (shard_.empty()) return nullptr;  // the pieces live in the parameter store's host memory or swap file
  return shard_.as<std::byte>() +
         static_cast<std::size_t>(plan_.owned()[index].parameter_offset) * element_size();
}

std::byte* ShardedParameters::update_target(std::size_t index) {
  return plan_.parameters_in_host_store() ? store_->update_target(index) : parameters(index);
}

void ShardedParameters::commit(std::size_t index) {
  if (plan_.parameters_in_host_store()) store_->commit(index);
}

void ShardedParameters::after_update() {
  if (plan_.parameters_in_host_store()) store_->finish_updates();
  gatherer_->refresh_persistent();
}

std::pair<std::int64_t, std::int64_t> ShardedParameters::held_range(std::size_t index) const {
  return plan_.checkpoint_range(index);
}

void ShardedParameters::load_parameter(std::size_t index, const float* values) {
  // The piece goes where stage 3 keeps it: the shard in memory, or the parameter swap file; the
  // padding past the parameter's end stays zero.
  const OwnedRange& owned = plan_.owned()[index];
  const auto [first, count] = held_range(index);
  std::vector<float> piece(static_cast<std::size_t>(owned.count), 0.0f);
  std::copy_n(values, count, piece.data());
  std::vector<std::byte> converted(static_cast<std::size_t>(owned.count) * element_size());
  kernels::convert(ExecutionContext::host().compute(), piece.data(), DType::fp32, converted.data(), dtype_,
                   owned.count);
  store_->write(index, converted.data());
}

void ShardedParameters::after_load() {
  gatherer_->refresh_persistent();
}

OffloadTiming ShardedParameters::parameter_swap_counters() const {
  OffloadTiming counters;
  if (!plan_.parameters_on_nvme()) return counters;
  const ParameterStoreStats& stats = store_->stats();
  counters.parameter_bytes_read = stats.bytes_read;
  counters.parameter_bytes_written = stats.bytes_written;
  counters.parameter_wait_seconds =
      stats.read_wait_seconds + stats.write_wait_seconds + stats.copy_wait_seconds;
  return counters;
}

ParametersPlacement ShardedParameters::parameters_placement() const {
  ParametersPlacement placement;
  placement.device = plan_.settings().parameter_offload;
  placement.memory = plan_.parameters_in_host_store() ? Device::host() : execution_.device();
  placement.host_elements = store_->host_elements();
  placement.nvme_elements = store_->nvme_elements();
  placement.host_pinned = store_->kept_pieces_pinned();
  if (const SwapEngine* swap = store_->swap()) {
    placement.swap_file = swap->file_path().string();
    placement.swap_backend = std::string(to_string(swap->backend()));
    placement.swap_bytes = swap->reserved_bytes();
    placement.buffer_bytes = store_->buffer_bytes();
    placement.buffer_count = static_cast<std::int64_t>(store_->buffer_count());
  }
  return placement;
}

}  // namespace zt::engine_detail
