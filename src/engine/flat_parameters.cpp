// ZeRO stages 0-2's flat parameter buffer (see flat_parameters.hpp).
#include "src/engine/flat_parameters.hpp"

#include <chrono>
#include <cstring>

#include "base/seconds_since.hpp"
#include "kernels/nn_kernels.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/external_model.hpp"

namespace zt::engine_detail {

FlatParameters::FlatParameters(const StrategyInputs& inputs) : ZeroStrategy(inputs) {
  flat_ = execution_.allocate(static_cast<std::size_t>(plan_.parameter_buffer_elements()) * element_size(),
                              MemoryCategory::parameters);
  execution_.zero(flat_.data(), flat_.size());  // padding stays zero: no update moves it
  for (std::size_t i = 0; i < model_parameters_.size(); ++i) {
    nn::Parameter& parameter = *model_parameters_[i];
    const FlatParameter& slot = plan_.layout()[i];
    Tensor flat_value =
        Tensor::view_of(flat_.as<std::byte>() + static_cast<std::size_t>(slot.offset) * element_size(),
                        slot.shape, dtype_, execution_.device());
    flat_value.copy_from(parameter.value, &execution_.compute());
    if (external_ == nullptr) parameter.value = flat_value;  // the model's own storage is released
  }
}

std::byte* FlatParameters::parameters(std::size_t index) {
  return flat_.as<std::byte>() +
         static_cast<std::size_t>(plan_.owned()[index].parameter_offset) * element_size();
}

void FlatParameters::after_update() {
  if (plan_.partition_count() > 1) {
    const auto started = base::Clock::now();
    all_gather_updated_parameters();
    allgather_wait_seconds_ += base::seconds_since(started);
  }
  if (external_ != nullptr) copy_parameters_out();
}

void FlatParameters::all_gather_updated_parameters() {
  Communicator& data = *parallel_.data().device;
  const int ranks = data.size();
  const int rank = data.rank();
  const std::size_t element = element_size();
  const std::vector<FlatParameter>& layout = plan_.layout();
  const std::vector<OwnedRange>& owned = plan_.owned();
  const std::int64_t region = plan_.allgather_region();
  if (allgather_staging_.numel() < region * ranks) {
    allgather_staging_ = execution_.empty({region * ranks}, dtype_, MemoryCategory::comm_buffers);
  }
  auto* staging = static_cast<std::byte*>(allgather_staging_.raw_data());
  auto* flat = flat_.as<std::byte>();
  auto bytes = [element](std::int64_t elements) { return static_cast<std::size_t>(elements) * element; };
  std::size_t first = 0;
  while (first < layout.size()) {
    std::size_t last = first;
    std::int64_t count = 0;
    while (last < layout.size() && (last == first || count + layout[last].piece_numel <= region)) {
      count += layout[last++].piece_numel;
    }
    std::int64_t offset = 0;
    for (std::size_t i = first; i < last; ++i) {
      execution_.copy(staging + bytes(rank * count + offset), flat + bytes(owned[i].flat_begin),
                      bytes(layout[i].piece_numel));
      offset += layout[i].piece_numel;
    }
    data.all_gather(staging + bytes(rank * count), staging, static_cast<std::size_t>(count), dtype_);
    offset = 0;
    for (std::size_t i = first; i < last; ++i) {
      for (int q = 0; q < ranks; ++q) {
        execution_.copy(flat + bytes(layout[i].offset + q * layout[i].piece_numel),
                        staging + bytes(q * count + offset), bytes(layout[i].piece_numel));
      }
      offset += layout[i].piece_numel;
    }
    first = last;
  }
}

void FlatParameters::copy_parameters_out() {
  for (std::size_t i = 0; i < model_parameters_.size(); ++i) {
    const FlatParameter& slot = plan_.layout()[i];
    model_parameters_[i]->value.copy_from(Tensor::view_of(
        flat_.as<std::byte>() + static_cast<std::size_t>(slot.offset) * element_size(), slot.shape, dtype_));
  }
}

std::pair<std::int64_t, std::int64_t> FlatParameters::held_range(std::size_t index) const {
  return {0, plan_.layout()[index].numel};
}

void FlatParameters::load_parameter(std::size_t index, const float* values) {
  const FlatParameter& slot = plan_.layout()[index];
  // From the host's fp32 values (a copy on the device first, when the device is not the host).
  const Tensor on_device = execution_.on_device(
      Tensor::view_of(const_cast<float*>(values), {slot.numel}, DType::fp32), MemoryCategory::other);
  kernels::convert(execution_.compute(), on_device.raw_data(), DType::fp32,
                   flat_.as<std::byte>() + static_cast<std::size_t>(slot.offset) * element_size(), dtype_,
                   slot.numel);
}

void FlatParameters::after_load() {
  clear_gradients();
  if (external_ != nullptr) copy_parameters_out();
}

ParametersPlacement FlatParameters::parameters_placement() const {
  ParametersPlacement placement;
  placement.memory = execution_.device();
  placement.host_elements = plan_.parameter_buffer_elements();
  return placement;
}

}  // namespace zt::engine_detail
