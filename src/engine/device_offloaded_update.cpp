// ZeRO-Offload's device <-> host update pipeline (see device_offloaded_update.hpp).
#include "src/engine/device_offloaded_update.hpp"

#include <algorithm>

#include "base/seconds_since.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/execution.hpp"

namespace zt::engine_detail {

using base::Clock;
using base::seconds_since;

DeviceOffloadedUpdate::DeviceOffloadedUpdate(const DeviceOffloadedUpdateOptions& options)
    : options_(options) {
  if (options_.device.is_cuda()) {
    const CudaStatus& status = cuda_status();
    ZT_CHECK_AS(CudaError, status.usable(), "offload_optimizer with the model on ", options_.device.str(),
                ": no usable CUDA device (", status.reason, ")");
  }
  ZT_CHECK(options_.chunk_elements > 0 && options_.buffer_count > 0,
           "DeviceOffloadedUpdate: chunk_elements and buffer_count must be positive");
  ZT_CHECK(options_.parameter_dtype == DType::fp32 || options_.parameter_dtype == DType::bf16 ||
               options_.parameter_dtype == DType::fp16,
           "DeviceOffloadedUpdate: parameters in ", dtype_name(options_.parameter_dtype),
           "; expected fp32, bf16 or fp16");
  to_host_ = Stream(options_.device);
  to_device_ = Stream(options_.device);
  gradients_ready_ = Event(options_.device);
  // The optimizer runs in the host's memory: the chunks' staging buffers are the host context's.
  const HostMemoryKind kind = options_.pin_memory ? HostMemoryKind::pinned : HostMemoryKind::pageable;
  const Device host = ExecutionContext::host().device();
  slots_.resize(options_.buffer_count);
  for (Slot& slot : slots_) {
    slot.gradients = Buffer(host, options_.chunk_elements * dtype_size(options_.gradient_dtype),
                            MemoryCategory::gradients, kHostAlignment, kind);
    if (!options_.parameters_on_host) {
      slot.parameters = Buffer(host, options_.chunk_elements * dtype_size(options_.parameter_dtype),
                               MemoryCategory::parameters, kHostAlignment, kind);
    }
    slot.copied_in = Event(options_.device);
    slot.copied_out = Event(options_.device);
  }
}

DeviceOffloadedUpdate::~DeviceOffloadedUpdate() {
  try {
    to_host_.synchronize();
    to_device_.synchronize();
  } catch (const std::exception&) {  // a failed device: the copies are gone with it
  }
}

DeviceOffloadedUpdateStats DeviceOffloadedUpdate::run(Optimizer& optimizer, const void* device_gradients,
                                                      void* device_parameters, float* master,
                                                      std::span<float* const> state, std::size_t count,
                                                      float grad_scale, float lr,
                                                      const Stream* ordered_after) {
  const auto started = Clock::now();
  DeviceOffloadedUpdateStats stats = queue(optimizer, device_gradients, device_parameters, master, state,
                                           count, grad_scale, lr, ordered_after);
  stats.wait_out_seconds += wait_for_parameters();
  stats.wall_seconds = seconds_since(started);
  return stats;
}

double DeviceOffloadedUpdate::wait_for_parameters() {
  const auto waited = Clock::now();
  to_device_.synchronize();
  for (Slot& slot : slots_) slot.out_pending = false;
  return seconds_since(waited);
}

std::size_t DeviceOffloadedUpdate::buffer_bytes() const {
  std::size_t bytes = 0;
  for (const Slot& slot : slots_) bytes += slot.gradients.size() + slot.parameters.size();
  return bytes;
}

DeviceOffloadedUpdateStats DeviceOffloadedUpdate::queue(Optimizer& optimizer, const void* device_gradients,
                                                        void* device_parameters, float* master,
                                                        std::span<float* const> state, std::size_t count,
                                                        float grad_scale, float lr,
                                                        const Stream* ordered_after) {
  const bool half = options_.parameter_dtype != DType::fp32;
  ZT_CHECK(master != nullptr || !half, "DeviceOffloadedUpdate: no host master with ",
           dtype_name(options_.parameter_dtype), " parameters; only fp32 parameters can be their own master");
  ZT_CHECK(
      master != nullptr || !options_.parameters_on_host,
      "DeviceOffloadedUpdate: parameters in host memory need a host master (the plan's separate master)");
  DeviceOffloadedUpdateStats stats;
  const auto started = Clock::now();
  if (ordered_after != nullptr) {
    // The gradients come from kernels on that stream, and kernels queued there may still read the
    // parameters: both copy streams start after that stream's work so far.
    gradients_ready_.record(*ordered_after);
    to_host_.wait(gradients_ready_);
    to_device_.wait(gradients_ready_);
  }
  const std::size_t chunk = options_.chunk_elements;
  const std::size_t chunks = (count + chunk - 1) / chunk;
  const std::size_t gradient_size = dtype_size(options_.gradient_dtype);
  const std::size_t parameter_size = dtype_size(options_.parameter_dtype);
  const auto* gradients = static_cast<const std::byte*>(device_gradients);
  auto* parameters = static_cast<std::byte*>(device_parameters);
  auto elements_of = [&](std::size_t k) { return std::min(chunk, count - k * chunk); };
  // Chunk k goes through slot (first_slot + k) mod buffer_count: its gradients (and, without a host
  // master, its parameters) come in, its new parameters go out.
  const std::size_t first_slot = next_slot_;
  auto slot_of = [&](std::size_t k) -> Slot& { return slots_[(first_slot + k) % slots_.size()]; };
  next_slot_ = (first_slot + chunks) % slots_.size();

  const Device host = ExecutionContext::host().device();
  auto copy_in = [&](std::size_t k) {
    Slot& slot = slot_of(k);
    if (slot.out_pending) {  // the slot's previous chunk is still on its way to the device
      const auto waited = Clock::now();
      slot.copied_out.synchronize();
      stats.wait_out_seconds += seconds_since(waited);
      slot.out_pending = false;
    }
    copy_bytes(slot.gradients.data(), host, gradients + k * chunk * gradient_size, options_.device,
               elements_of(k) * gradient_size, &to_host_);
    if (master == nullptr) {
      copy_bytes(slot.parameters.data(), host, parameters + k * chunk * parameter_size, options_.device,
                 elements_of(k) * parameter_size, &to_host_);
    }
    slot.copied_in.record(to_host_);
  };
  const std::size_t ahead = slots_.size() - 1;  // chunks copied in beyond the one being updated
  std::size_t issued = 0;
  for (; issued < std::min(chunks, ahead); ++issued) copy_in(issued);

  std::vector<float*> chunk_state(state.size());
  for (std::size_t k = 0; k < chunks; ++k) {
    if (issued == k) copy_in(issued++);  // one buffer: nothing was copied ahead
    Slot& slot = slot_of(k);
    const auto waited = Clock::now();
    slot.copied_in.synchronize();
    stats.wait_in_seconds += seconds_since(waited);

    const std::size_t first = k * chunk;
    const std::size_t n = elements_of(k);
    for (std::size_t s = 0; s < state.size(); ++s) chunk_state[s] = state[s] + first;
    float* chunk_master = master != nullptr ? master + first : slot.parameters.as<float>();
    // The new parameters: into the staging, on their way to the device next, or in place in host memory.
    void* new_parameters =
        options_.parameters_on_host ? parameters + first * parameter_size : slot.parameters.data();
    const auto updating = Clock::now();
    optimizer.update_range(
        {chunk_master, n}, chunk_state, {slot.gradients.data(), options_.gradient_dtype}, grad_scale, lr,
        half ? HalfParamBuffer{new_parameters, options_.parameter_dtype} : HalfParamBuffer{});
    if (!half && master != nullptr)
      ExecutionContext::host().copy(new_parameters, chunk_master, n * sizeof(float));
    stats.update_seconds += seconds_since(updating);

    if (!options_.parameters_on_host) {
      copy_bytes(parameters + first * parameter_size, options_.device, slot.parameters.data(), host,
                 n * parameter_size, &to_device_);
      slot.copied_out.record(to_device_);
      slot.out_pending = true;
    }
    while (issued < std::min(chunks, k + 1 + ahead)) copy_in(issued++);
  }
  stats.wall_seconds = seconds_since(started);
  return stats;
}

}  // namespace zt::engine_detail
