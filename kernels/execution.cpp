// zt::ExecutionContext: allocations and copies on one device, ordered on its compute stream.
#include "zerotrain/execution.hpp"

#include <cstring>

#include "kernels/emulated_device.hpp"
#include "zerotrain/error.hpp"

namespace zt {

ExecutionContext::ExecutionContext(Device device)
    : device_(device),
      compute_(device),
      communication_(device),
      transfer_(device),
      compute_reached_(device),
      communication_reached_(device),
      transfer_reached_(device) {}

ExecutionContext::~ExecutionContext() {
  try {
    synchronize();                   // nothing queued by this context may outlive its streams
  } catch (const std::exception&) {  // a failed device: its work is gone with it
  }
}

const ExecutionContext& ExecutionContext::host() {
  static const ExecutionContext context(Device::host());
  return context;
}

Tensor ExecutionContext::empty(const Shape& shape, DType dtype, MemoryCategory category) const {
  return Tensor::empty(shape, dtype, device_, category, &compute_);
}

Tensor ExecutionContext::zeros(const Shape& shape, DType dtype, MemoryCategory category) const {
  Tensor tensor = empty(shape, dtype, category);
  tensor.zero_(&compute_);
  return tensor;
}

Buffer ExecutionContext::allocate(std::size_t bytes, MemoryCategory category, std::size_t alignment) const {
  return Buffer(device_, bytes, category, alignment, HostMemoryKind::pageable, &compute_);
}

Buffer ExecutionContext::allocate_pinned_host(std::size_t bytes, MemoryCategory category) const {
  // Made with the compute stream: on a GPU the free records the pinned cache's fence there.
  return Buffer(Device::host(), bytes, category, kHostAlignment, HostMemoryKind::pinned, &compute_);
}

void ExecutionContext::zero(void* data, std::size_t bytes) const {
  zero_bytes(data, device_, bytes, &compute_);
}

void ExecutionContext::zero(Tensor& tensor) const {
  ZT_CHECK(tensor.defined(), "ExecutionContext::zero of an undefined tensor");
  ZT_CHECK(tensor.device() == device_, "ExecutionContext on ", device_.str(), ": zero of ",
           tensor.description(), "; expected a tensor on the context's device");
  tensor.zero_(&compute_);
}

void ExecutionContext::copy(void* destination, const void* source, std::size_t bytes) const {
  copy_bytes(destination, device_, source, device_, bytes, &compute_);
}

void ExecutionContext::move(void* destination, const void* source, std::size_t bytes) const {
  if (bytes == 0 || destination == source) return;
  switch (device_.type) {
    case DeviceType::host:
      std::memmove(destination, source, bytes);
      return;
    case DeviceType::emulated:
      detail::emulated_enqueue(detail::emulated_queue_of(compute_), [destination, source, bytes] {
        const detail::EmulatedDeviceAccess access;
        std::memmove(destination, source, bytes);
      });
      return;
    case DeviceType::cuda: {
      // A device copy must not overlap itself: through a scratch buffer, both copies on the compute
      // stream. The scratch is allocated and freed in that stream's order (allocate()), so it is
      // reused only after the second copy has read it: no host wait.
      Buffer scratch = allocate(bytes, MemoryCategory::other);
      copy(scratch.as<std::byte>(), source, bytes);
      copy(destination, scratch.as<std::byte>(), bytes);
      return;
    }
  }
}

void ExecutionContext::to_host(void* host_destination, const void* source, std::size_t bytes) const {
  copy_bytes(host_destination, Device::host(), source, device_, bytes, &compute_);
  compute_.synchronize();
}

void ExecutionContext::to_host_async(void* host_destination, const void* source, std::size_t bytes) const {
  if (bytes == 0) return;
  compute_reached_.record(compute_);  // the kernels that produce `source`
  transfer_.wait(compute_reached_);
  copy_bytes(host_destination, Device::host(), source, device_, bytes, &transfer_);
}

void ExecutionContext::from_host(void* destination, const void* host_source, std::size_t bytes) const {
  copy_bytes(destination, device_, host_source, Device::host(), bytes, &compute_);
}

void ExecutionContext::from_host_async(void* destination, const void* host_source, std::size_t bytes) const {
  if (bytes == 0) return;
  compute_reached_.record(compute_);  // `destination`'s allocation (and any earlier use of it)
  transfer_.wait(compute_reached_);
  copy_bytes(destination, device_, host_source, Device::host(), bytes, &transfer_);
}

Tensor ExecutionContext::on_device(const Tensor& tensor, MemoryCategory category) const {
  ZT_CHECK(tensor.defined(), "ExecutionContext::on_device of an undefined tensor");
  if (tensor.device() == device_) return tensor;
  ZT_CHECK(tensor.device().is_host(), "ExecutionContext on ", device_.str(), ": on_device of ",
           tensor.description(), "; expected a host tensor or one on ", device_.str());
  Tensor moved = empty(tensor.shape(), tensor.dtype(), category);
  moved.copy_from(tensor, &compute_);
  return moved;
}

void ExecutionContext::synchronize() const {
  compute_.synchronize();
  communication_.synchronize();
  transfer_.synchronize();
}

void ExecutionContext::communication_waits_for_compute() const {
  compute_reached_.record(compute_);
  communication_.wait(compute_reached_);
}

void ExecutionContext::compute_waits_for_communication() const {
  communication_reached_.record(communication_);
  compute_.wait(communication_reached_);
}

void ExecutionContext::compute_waits_for_transfers() const {
  compute_.wait(transfers_queued());
}

const Event& ExecutionContext::transfers_queued() const {
  transfer_reached_.record(transfer_);
  return transfer_reached_;
}

}  // namespace zt
