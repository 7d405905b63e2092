// The optimizer's master and states in memory or on NVMe (see optimizer_states.hpp).
#include "src/engine/optimizer_states.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "base/seconds_since.hpp"
#include "kernels/nn_kernels.hpp"
#include "src/engine/device_offloaded_update.hpp"
#include "src/engine/swap_options_from_config.hpp"
#include "src/engine/swapped_optimizer_states.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/swap.hpp"

namespace zt::engine_detail {
namespace {

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

/// The parts of the plan's owned ranges (in shard order) that overlap shard elements
/// [first, first + count), as (range, begin, end); `cursor` remembers where to start for the next,
/// later window.
template <typename Visit>
void for_each_overlap(const std::vector<OwnedRange>& ranges, std::size_t& cursor, std::int64_t first,
                      std::int64_t count, Visit&& visit) {
  while (cursor < ranges.size() && ranges[cursor].shard_begin + ranges[cursor].count <= first) ++cursor;
  for (std::size_t i = cursor; i < ranges.size() && ranges[i].shard_begin < first + count; ++i) {
    const std::int64_t begin = std::max(first, ranges[i].shard_begin);
    const std::int64_t end = std::min(first + count, ranges[i].shard_begin + ranges[i].count);
    if (end > begin) visit(i, begin, end);
  }
}

/// `count` parameters at `source` (on the engine's device, in `dtype`) as fp32 in host memory at
/// `destination`: converted where they are on the host, brought down first from a device (whose
/// memory the host's kernels cannot read).
void fp32_on_host(const ExecutionContext& execution, const std::byte* source, DType dtype, float* destination,
                  std::int64_t count) {
  if (count == 0) return;
  const auto elements = static_cast<std::size_t>(count);
  if (execution.device().is_host()) {
    kernels::convert(execution.compute(), source, dtype, destination, DType::fp32, count);
  } else if (dtype == DType::fp32) {
    execution.to_host(destination, source, elements * sizeof(float));
  } else {
    Buffer staging(ExecutionContext::host().device(), elements * dtype_size(dtype), MemoryCategory::other);
    execution.to_host(staging.data(), source, elements * dtype_size(dtype));
    kernels::convert(ExecutionContext::host().compute(), staging.data(), dtype, destination, DType::fp32,
                     count);
  }
}

/// The device <-> host update pipeline of an engine on a device whose optimizer states are in host
/// memory or in the swap file: chunks of at most `largest_run` elements (one run's count), through
/// offload_optimizer.buffer_count pinned buffers. With the parameters in the parameter store's host
/// memory (offload_param "nvme", or "cpu" on a device: update_target) the pipeline writes them there.
std::unique_ptr<DeviceOffloadedUpdate> make_device_offloaded_update(const OffloadOptimizerConfig& offload,
                                                                    const PartitionPlan& plan, Device device,
                                                                    DType dtype, std::int64_t largest_run) {
  DeviceOffloadedUpdateOptions options;
  options.device = device;
  options.parameters_on_host = plan.parameters_in_host_store();
  options.gradient_dtype = dtype;
  options.parameter_dtype = dtype;
  options.buffer_count = std::max<std::size_t>(1, static_cast<std::size_t>(offload.buffer_count));
  options.pin_memory = offload.pin_memory;
  options.chunk_elements =
      std::clamp<std::size_t>(static_cast<std::size_t>(std::max<std::int64_t>(largest_run, 1)), 1,
                              DeviceOffloadedUpdateOptions{}.chunk_elements);
  return std::make_unique<DeviceOffloadedUpdate>(options);
}

void add_timing(OffloadTiming& timing, const DeviceOffloadedUpdateStats& stats) {
  timing.update_seconds += stats.update_seconds;
  timing.stalled_seconds += stats.wait_in_seconds + stats.wait_out_seconds;
}

// Committing the ranges the device pipeline updates. With the parameters in the host store the new
// parameters are in the parameter store's host memory as soon as queue() returns (the host optimizer wrote
// them there): a range is committed when its last part is queued, so that its buffer starts its
// write to NVMe and frees up for the next range (the pool may hold fewer pieces than there are
// ranges). On the device they are complete only after wait_for_parameters(): every range is
// committed then.
void commit_if_updated_in_host_memory(const PartitionPlan& plan, ZeroStrategy& strategy, std::size_t index,
                                      std::int64_t end) {
  const OwnedRange& range = plan.owned()[index];
  if (plan.parameters_in_host_store() && end == range.shard_begin + range.count) strategy.commit(index);
}
void commit_updated_on_device(const PartitionPlan& plan, ZeroStrategy& strategy) {
  if (plan.parameters_in_host_store()) return;
  for (std::size_t i = 0; i < plan.size(); ++i) strategy.commit(i);
}

/// In memory: the optimizer's own state buffers beside the master.
class InMemoryStates final : public OptimizerStates {
 public:
  InMemoryStates(const PartitionPlan& plan, ZeroStrategy& strategy, const Config& config,
                 const ExecutionContext& execution)
      : OptimizerStates(plan, strategy, execution) {
    allocate_master();
    std::vector<ParamBuffer> buffers;
    for (std::size_t i = 0; i < plan_.size(); ++i)
      buffers.push_back({master_in_memory(i), static_cast<std::size_t>(plan_.owned()[i].count)});
    optimizer_ = make_optimizer(to_string(config.optimizer->type), std::move(buffers),
                                optimizer_params_of(*config.optimizer), execution_.device());
    names_ = optimizer_->state_names();
  }

  OffloadTiming update(float grad_scale, float lr, const UpdatePart& part) override {
    optimizer_->begin_step(grad_scale, lr);
    std::vector<float*> state(names_.size());
    for (std::size_t i = 0; i < plan_.size(); ++i) {
      for (std::size_t k = 0; k < names_.size(); ++k) state[k] = optimizer_->state(names_[k], i).data();
      const OwnedRange& range = plan_.owned()[i];
      part(i, range.shard_begin, range.shard_begin + range.count, master_in_memory(i), state);
    }
    return {};
  }

  void read_master(std::size_t index, float* destination) override {
    execution_.to_host(destination, master_in_memory(index), bytes_of(index));
  }
  void write_master(std::size_t index, const float* source) override {
    execution_.from_host(master_in_memory(index), source, bytes_of(index));
  }
  void read_state(std::size_t state, std::size_t index, float* destination) override {
    execution_.to_host(destination, optimizer_->state(names_[state], index).data(), bytes_of(index));
  }
  void write_state(std::size_t state, std::size_t index, const float* source) override {
    execution_.from_host(optimizer_->state(names_[state], index).data(), source, bytes_of(index));
  }

  OptimizerStatesPlacement placement() const override {
    OptimizerStatesPlacement placement;
    placement.device = plan_.settings().optimizer_offload;
    placement.memory = execution_.device();
    return placement;
  }

 private:
  void allocate_master() {
    if (plan_.master_elements() == 0) return;
    // fp32 master weights belong with the optimizer states (the 12 bytes of K in ZeRO's 16Ψ): each
    // rank keeps the master of its pieces only.
    master_ = execution_.allocate(static_cast<std::size_t>(plan_.master_elements()) * sizeof(float),
                                  MemoryCategory::optimizer_states);
    execution_.zero(master_.data(), master_.size());
    for (std::size_t i = 0; i < plan_.size(); ++i) {
      kernels::convert(execution_.compute(), strategy_.parameters(i), plan_.settings().compute_dtype,
                       master_in_memory(i), DType::fp32, plan_.owned()[i].count);
    }
  }

  std::size_t bytes_of(std::size_t index) const {
    return static_cast<std::size_t>(plan_.owned()[index].count) * sizeof(float);
  }

  std::vector<std::string_view> names_;
};

/// ZeRO-Offload with the model on a GPU (offload_optimizer "cpu"): the fp32 master and the states in
/// host memory, updated there by the host optimizer chunk by chunk while the chunks' gradients come
/// down and their new parameters go up through pinned buffers on two copy streams
/// (DeviceOffloadedUpdate). The gradients and the parameters stay on the device.
class HostOffloadedStates final : public OptimizerStates {
 public:
  HostOffloadedStates(const PartitionPlan& plan, ZeroStrategy& strategy, const Config& config,
                      const ExecutionContext& execution)
      : OptimizerStates(plan, strategy, execution) {
    const OffloadOptimizerConfig& offload = config.zero_optimization.offload_optimizer;
    const DType dtype = plan_.settings().compute_dtype;
    const Device host = ExecutionContext::host().device();
    // The whole shard's master, fp32, initialized from the device's parameters.
    const std::size_t elements = static_cast<std::size_t>(plan_.shard_size());
    host_master_ =
        Buffer(host, std::max<std::size_t>(1, elements) * sizeof(float), MemoryCategory::optimizer_states,
               kHostAlignment, offload.pin_memory ? HostMemoryKind::pinned : HostMemoryKind::pageable);
    ExecutionContext::host().zero(host_master_.data(), host_master_.size());
    master_from_parameters();
    std::vector<ParamBuffer> buffers;
    for (std::size_t i = 0; i < plan_.size(); ++i)
      buffers.push_back({host_master(i), static_cast<std::size_t>(plan_.owned()[i].count)});
    optimizer_ = make_optimizer(to_string(config.optimizer->type), std::move(buffers),
                                optimizer_params_of(*config.optimizer), host);
    names_ = optimizer_->state_names();
    pipeline_ = make_device_offloaded_update(offload, plan_, execution_.device(), dtype, plan_.shard_size());
  }

  /// Ignores `part` (the in-memory update): each owned range goes through the offload pipeline, which
  /// writes the new parameters on the device, the ranges one after the other with the copies in
  /// flight; once all are on the device the strategy takes the ranges as committed.
  OffloadTiming update(float grad_scale, float lr, const UpdatePart&) override {
    const auto started = base::Clock::now();
    optimizer_->begin_step(grad_scale, lr);
    OffloadTiming timing;
    std::vector<float*> state(names_.size());
    for (std::size_t i = 0; i < plan_.size(); ++i) {
      const OwnedRange& range = plan_.owned()[i];
      for (std::size_t k = 0; k < names_.size(); ++k) state[k] = optimizer_->state(names_[k], i).data();
      std::byte* target = plan_.separate_master() ? strategy_.update_target(i) : strategy_.parameters(i);
      add_timing(timing, pipeline_->queue(*optimizer_, strategy_.gradient(i), target, host_master(i), state,
                                          static_cast<std::size_t>(range.count), grad_scale, lr,
                                          &execution_.compute()));
      commit_if_updated_in_host_memory(plan_, strategy_, i, range.shard_begin + range.count);
    }
    timing.stalled_seconds += pipeline_->wait_for_parameters();
    commit_updated_on_device(plan_, strategy_);
    timing.wall_seconds = base::seconds_since(started);
    return timing;
  }

  void read_master(std::size_t index, float* destination) override {
    ExecutionContext::host().copy(destination, host_master(index), bytes_of(index));
  }
  void write_master(std::size_t index, const float* source) override {
    ExecutionContext::host().copy(host_master(index), source, bytes_of(index));
  }
  void read_state(std::size_t state, std::size_t index, float* destination) override {
    ExecutionContext::host().copy(destination, optimizer_->state(names_[state], index).data(),
                                  bytes_of(index));
  }
  void write_state(std::size_t state, std::size_t index, const float* source) override {
    ExecutionContext::host().copy(optimizer_->state(names_[state], index).data(), source, bytes_of(index));
  }

  /// In fp32 the plan has no separate master (the parameters are the master), so a checkpoint load
  /// or a weights import writes only the device's parameters: the host master follows them here.
  void flush() override {
    if (!plan_.separate_master()) master_from_parameters();
  }

  OptimizerStatesPlacement placement() const override {
    OptimizerStatesPlacement placement;
    placement.device = plan_.settings().optimizer_offload;
    placement.staging_bytes = pipeline_->buffer_bytes();
    return placement;
  }

 private:
  /// The master of every owned range from the device's parameters (compute dtype), converted.
  void master_from_parameters() {
    for (std::size_t i = 0; i < plan_.size(); ++i) {
      fp32_on_host(execution_, strategy_.parameters(i), plan_.settings().compute_dtype, host_master(i),
                   plan_.owned()[i].count);
    }
  }

  float* host_master(std::size_t index) {
    return host_master_.as<float>() + plan_.owned()[index].shard_begin;
  }
  std::size_t bytes_of(std::size_t index) const {
    return static_cast<std::size_t>(plan_.owned()[index].count) * sizeof(float);
  }

  Buffer host_master_;  // pinned with offload_optimizer.pin_memory
  std::vector<std::string_view> names_;
  std::unique_ptr<DeviceOffloadedUpdate> pipeline_;
};

/// ZeRO-Infinity: the master (in 16-bit training) and the states in the rank's swap file, updated
/// by the host optimizer in the pipeline's sub-group buffers. With the engine on a device (CUDA, the
/// emulated device) the gradients and parameters stay there: each sub-group's pieces go through the
/// device <-> host update pipeline (DeviceOffloadedUpdate, as with offload_optimizer "cpu"), so that
/// swap reads and writes, copies and the host's update overlap; in fp32 the device's parameters are
/// the master and come down with the gradients.
class NvmeStates final : public OptimizerStates {
 public:
  NvmeStates(const PartitionPlan& plan, ZeroStrategy& strategy, const Config& config,
             const ExecutionContext& execution)
      : OptimizerStates(plan, strategy, execution) {
    const ZeroConfig& zero = config.zero_optimization;
    const OffloadOptimizerConfig& offload = zero.offload_optimizer;
    // The optimizer keeps no state of its own: it updates the sub-groups swapped into the
    // pipeline's buffers (update_range), with its step count and hyperparameters.
    optimizer_ =
        make_optimizer(to_string(config.optimizer->type), {}, optimizer_params_of(*config.optimizer));
    ZT_CHECK_AS(ConfigError, offload.nvme_path.has_value(),
                "zero_optimization.offload_optimizer.nvme_path: required when device is \"nvme\"");
    SwappedStatesOptions options;
    options.swap = swap_options_from_config(config.aio, *offload.nvme_path);
    options.swap.pin_memory = offload.pin_memory;
    options.shard_elements = plan_.shard_size();
    options.arrays = plan_.swapped_arrays();
    options.sub_group_elements = zero.sub_group_size;
    options.buffer_count = static_cast<std::size_t>(offload.buffer_count);
    swapped_ = std::make_unique<SwappedOptimizerStates>(options);
    const DType dtype = plan_.settings().compute_dtype;
    if (!execution_.device().is_host()) {
      // One run per piece of a sub-group: no run is longer than a sub-group.
      device_update_ = make_device_offloaded_update(offload, plan_, execution_.device(), dtype,
                                                    std::min(zero.sub_group_size, plan_.shard_size()));
    }

    // Initial contents, as in memory: the master converted from the parameters (the padding of the
    // last piece stays zero), moments zero.
    const std::size_t element = dtype_size(dtype);
    std::size_t cursor = 0;
    swapped_->for_each_sub_group([&](std::int64_t first, std::int64_t count, std::span<float* const> arrays) {
      for (float* array : arrays) std::fill_n(array, count, 0.0f);
      if (!plan_.master_in_swap()) return;
      for_each_overlap(
          plan_.owned(), cursor, first, count, [&](std::size_t i, std::int64_t begin, std::int64_t end) {
            const OwnedRange& range = plan_.owned()[i];
            fp32_on_host(
                execution_,
                strategy_.parameters(i) + static_cast<std::size_t>(begin - range.shard_begin) * element,
                dtype, arrays[0] + (begin - first), end - begin);
          });
    });
  }

  OffloadTiming update(float grad_scale, float lr, const UpdatePart& part) override {
    optimizer_->begin_step(grad_scale, lr);
    std::vector<float*> state(plan_.settings().optimizer_state_arrays);
    std::size_t cursor = 0;  // the owned ranges are in shard order, and so are the sub-groups
    OffloadTiming copies;    // the device pipeline's share
    const SwapPipeline::Stats stats = swapped_->for_each_sub_group(
        [&](std::int64_t first, std::int64_t count, std::span<float* const> arrays) {
          // The parameter pieces this sub-group covers, in part or whole; the update is elementwise,
          // so pieces split at sub-group boundaries update exactly as whole ones.
          for_each_overlap(
              plan_.owned(), cursor, first, count, [&](std::size_t i, std::int64_t begin, std::int64_t end) {
                const std::int64_t in_group = begin - first;
                for (std::size_t k = 0; k < state.size(); ++k)
                  state[k] = arrays[array_of_state(k)] + in_group;
                if (device_update_) {
                  update_on_device(i, begin, end, plan_.master_in_swap() ? arrays[0] + in_group : nullptr,
                                   state, grad_scale, lr, copies);
                  return;
                }
                float* master = plan_.master_in_swap()
                                    ? arrays[0] + in_group
                                    : master_in_memory(i) + (begin - plan_.owned()[i].shard_begin);
                part(i, begin, end, master, state);
              });
        });
    OffloadTiming timing;
    timing.wall_seconds = stats.wall_seconds;
    timing.update_seconds = stats.work_seconds;
    timing.stalled_seconds = stats.stalled_seconds;
    if (device_update_) {
      // The last parameters on the device, then every range is complete.
      const auto waited = base::Clock::now();
      timing.stalled_seconds += copies.stalled_seconds + device_update_->wait_for_parameters();
      commit_updated_on_device(plan_, strategy_);
      timing.wall_seconds += base::seconds_since(waited);
      // The swap pipeline's work is the device pipeline's: its update share, its waits for copies.
      timing.update_seconds = copies.update_seconds;
    }
    return timing;
  }

  void read_master(std::size_t index, float* destination) override {
    const OwnedRange& range = plan_.owned()[index];
    if (!plan_.master_in_swap()) {
      execution_.to_host(destination, master_in_memory(index),
                         static_cast<std::size_t>(range.count) * sizeof(float));
      return;
    }
    swapped_->read(0, range.shard_begin, range.count, destination);
  }
  void write_master(std::size_t index, const float* source) override {
    const OwnedRange& range = plan_.owned()[index];
    if (!plan_.master_in_swap()) {
      execution_.from_host(master_in_memory(index), source,
                           static_cast<std::size_t>(range.count) * sizeof(float));
      return;
    }
    swapped_->write(0, range.shard_begin, range.count, source);
  }
  void read_state(std::size_t state, std::size_t index, float* destination) override {
    const OwnedRange& range = plan_.owned()[index];
    swapped_->read(array_of_state(state), range.shard_begin, range.count, destination);
  }
  void write_state(std::size_t state, std::size_t index, const float* source) override {
    const OwnedRange& range = plan_.owned()[index];
    swapped_->write(array_of_state(state), range.shard_begin, range.count, source);
  }
  void flush() override { swapped_->flush(); }

  OptimizerStatesPlacement placement() const override {
    OptimizerStatesPlacement placement;
    placement.device = plan_.settings().optimizer_offload;
    placement.master_in_swap = plan_.master_in_swap();
    placement.swap_file = swapped_->swap().file_path().string();
    placement.swap_backend = std::string(to_string(swapped_->swap().backend()));
    placement.swap_bytes = swapped_->swap_bytes();
    placement.buffer_bytes = swapped_->buffer_bytes();
    placement.sub_groups = static_cast<std::int64_t>(swapped_->sub_group_count());
    placement.sub_group_elements =
        std::min<std::int64_t>(plan_.settings().sub_group_elements, plan_.shard_size());
    if (device_update_) placement.staging_bytes = device_update_->buffer_bytes();
    return placement;
  }

 private:
  /// Elements [begin, end) of owned range `index` through the device pipeline: their gradients down,
  /// the update against `master` (null: the device's fp32 parameters, brought down) and `state` in
  /// the sub-group's buffer, the new parameters queued for the device.
  void update_on_device(std::size_t index, std::int64_t begin, std::int64_t end, float* master,
                        std::span<float* const> state, float grad_scale, float lr, OffloadTiming& timing) {
    const OwnedRange& range = plan_.owned()[index];
    const std::size_t offset =
        static_cast<std::size_t>(begin - range.shard_begin) * dtype_size(plan_.settings().compute_dtype);
    std::byte* target =
        plan_.separate_master() ? strategy_.update_target(index) : strategy_.parameters(index);
    add_timing(timing, device_update_->queue(*optimizer_, strategy_.gradient(index) + offset, target + offset,
                                             master, state, static_cast<std::size_t>(end - begin), grad_scale,
                                             lr, &execution_.compute()));
    commit_if_updated_in_host_memory(plan_, strategy_, index, end);
  }

  /// Index in the swap file's arrays of optimizer state `state` (after the master, when swapped).
  std::size_t array_of_state(std::size_t state) const { return (plan_.master_in_swap() ? 1 : 0) + state; }

  std::unique_ptr<SwappedOptimizerStates> swapped_;
  std::unique_ptr<DeviceOffloadedUpdate> device_update_;  // with the engine on a device
};

}  // namespace

float* OptimizerStates::master_in_memory(std::size_t index) {
  const OwnedRange& range = plan_.owned()[index];
  if (!plan_.separate_master()) return reinterpret_cast<float*>(strategy_.parameters(index));
  ZT_CHECK(!master_.empty(), "internal: the fp32 master of '", plan_.layout()[index].name,
           "' is in the swap file; read it through the swapped states");
  return master_.as<float>() + range.shard_begin;
}

std::unique_ptr<OptimizerStates> make_optimizer_states(const PartitionPlan& plan, ZeroStrategy& strategy,
                                                       const Config& config,
                                                       const ExecutionContext& execution) {
  if (plan.optimizer_states_on_nvme()) return std::make_unique<NvmeStates>(plan, strategy, config, execution);
  // The host and the emulated device keep offloaded states in their own memory, which the host
  // optimizer reads there; a GPU's memory it cannot read. With the parameters in the host store
  // their new values go to the parameter store's host memory, which only the host optimizer writes:
  // the emulated device takes the GPU's path then (the master and states on the host).
  const Device device = execution.device();
  if (plan.settings().optimizer_offload == OffloadDevice::cpu &&
      (device.is_cuda() || (device.is_emulated() && plan.parameters_in_host_store())))
    return std::make_unique<HostOffloadedStates>(plan, strategy, config, execution);
  return std::make_unique<InMemoryStates>(plan, strategy, config, execution);
}

}  // namespace zt::engine_detail
