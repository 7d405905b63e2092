// zt::ExecutionContext: where device work runs and in which order.
//
// A context is a device with a compute, a communication and a transfer stream. Every allocation, fill,
// copy and kernel of the engine and of the nn modules goes through one (kernels take
// context.compute()), so the same code runs on the host, on the emulated test device and on a GPU:
//   - the operations below are ordered on the compute stream;
//   - to_host() waits for the copy (and the work before it); everything else is asynchronous on a
//     GPU and immediate on the host and the emulated device;
//   - its memory (empty, zeros, allocate, on_device) is allocated and freed in the compute stream's
//     order (zt::Buffer with the stream): on a GPU a free does not wait for the device, and the
//     memory is reused only by work queued after the free on the compute stream, or on another
//     stream once the free is done. Work on another stream that uses such memory must be ordered
//     after the allocation and before the free by events: the engine's NCCL communicators, ordered
//     with the compute stream, are (docs/gpu.md, "NCCL in the engine"). On the host and the
//     emulated device the stream changes nothing;
//   - collectives run on the communication stream; communication_waits_for_compute() and
//     compute_waits_for_communication() order the two with events (no-ops on the host and the
//     emulated device, whose streams run work at once);
//   - to_host_async() and from_host_async() copy on the transfer stream, after the compute work
//     queued so far (an event), so that the copy overlaps the kernels queued after it;
//     compute_waits_for_transfers() orders later compute after it (an event, no host wait), and
//     transfers_queued() is the event for other work to wait for (a communicator: the copy then
//     holds up only the collective that sends its bytes).
// A context is not copyable or movable (modules and communicators keep pointers to it), and its
// ordering calls are made by one thread.
#pragma once

#include <cstddef>

#include "zerotrain/device.hpp"
#include "zerotrain/dtype.hpp"
#include "zerotrain/tensor.hpp"

namespace zt {

class ExecutionContext {
 public:
  /// New streams (and events) on `device`: two non-blocking CUDA streams on a GPU.
  explicit ExecutionContext(Device device);
  ExecutionContext(const ExecutionContext&) = delete;
  ExecutionContext& operator=(const ExecutionContext&) = delete;
  ExecutionContext(ExecutionContext&&) = delete;
  ExecutionContext& operator=(ExecutionContext&&) = delete;
  ~ExecutionContext();

  /// The host's context, for defaults (nn::RunContext, the loss helpers). Process-wide.
  static const ExecutionContext& host();

  Device device() const { return device_; }
  const Stream& compute() const { return compute_; }
  const Stream& communication() const { return communication_; }
  const Stream& transfer() const { return transfer_; }

  // ---- memory on the context's device, ordered on the compute stream (see the top) ----
  Tensor empty(const Shape& shape, DType dtype, MemoryCategory category = MemoryCategory::other) const;
  Tensor zeros(const Shape& shape, DType dtype, MemoryCategory category = MemoryCategory::other) const;
  Buffer allocate(std::size_t bytes, MemoryCategory category = MemoryCategory::other,
                  std::size_t alignment = kHostAlignment) const;
  /// Page-locked host memory for asynchronous copies to and from this device (plain host memory
  /// where no GPU is usable), freed in the compute stream's order: on a GPU the pinned cache hands
  /// it out again only once the compute stream has passed the work queued before the free (an
  /// event), so every copy that reads or writes it must be ordered before the free on the compute
  /// stream (queued on it, or followed by compute_waits_for_transfers()).
  Buffer allocate_pinned_host(std::size_t bytes, MemoryCategory category = MemoryCategory::other) const;

  // ---- operations, ordered on the compute stream ----
  /// `bytes` bytes of device memory at `data` set to zero.
  void zero(void* data, std::size_t bytes) const;
  /// Every element of `tensor` (on this context's device) set to zero.
  void zero(Tensor& tensor) const;
  /// Device to device, both on this context's device.
  void copy(void* destination, const void* source, std::size_t bytes) const;
  /// The same where the two ranges may overlap (memmove's semantics).
  void move(void* destination, const void* source, std::size_t bytes) const;
  /// Device to host; returns once the bytes are in `host_destination`.
  void to_host(void* host_destination, const void* source, std::size_t bytes) const;
  /// Device to host without a host wait: on the transfer stream, after the compute work queued so
  /// far (an event), so it overlaps the compute work queued after it. Until
  /// compute_waits_for_transfers() has been called, `source` must not be written or freed and
  /// `host_destination` not freed; the host may read the bytes only after waiting for the compute
  /// stream past that call. `host_destination` should be pinned (allocate_pinned_host): CUDA copies
  /// into pageable memory synchronously. Immediate on the host and the emulated device.
  void to_host_async(void* host_destination, const void* source, std::size_t bytes) const;
  /// Host to device. The host bytes are read before the call returns unless they are pinned (a
  /// pinned source must stay unchanged until the compute stream has passed the copy).
  void from_host(void* destination, const void* host_source, std::size_t bytes) const;
  /// Host to device without holding up the compute stream: on the transfer stream, after the compute
  /// work queued so far (an event: `destination` may have been allocated just before, in the compute
  /// stream's order), so it overlaps the compute work queued after it. Compute queued after the next
  /// compute_waits_for_transfers() sees the bytes; until that call `destination` must not be used or
  /// freed and `host_source` not changed or freed. `host_source` should be pinned
  /// (allocate_pinned_host): CUDA copies from pageable memory synchronously. Immediate on the host
  /// and the emulated device.
  void from_host_async(void* destination, const void* host_source, std::size_t bytes) const;
  /// `tensor` on this context's device: the tensor itself when it is there already (always, for the
  /// host's context), else a copy from the host under `category` (micro-batches from a data loader).
  Tensor on_device(const Tensor& tensor, MemoryCategory category = MemoryCategory::activations) const;
  /// Wait for everything queued on both streams.
  void synchronize() const;

  // ---- ordering between the streams ----
  /// Communication queued from now on starts after the compute work queued so far.
  void communication_waits_for_compute() const;
  /// Compute queued from now on starts after the communication queued so far.
  void compute_waits_for_communication() const;
  /// Compute queued from now on starts after the transfers queued so far (to_host_async,
  /// from_host_async).
  void compute_waits_for_transfers() const;
  /// An event reached once the transfers queued so far are done, for work elsewhere that needs
  /// them without holding up the compute stream: a communicator's next operations
  /// (Communicator::order_after), another stream (Stream::wait). Recorded on the transfer stream
  /// by this call, and again by the next call (and by compute_waits_for_transfers()): wait for it
  /// before either, as CUDA's waits take the record made last before them.
  const Event& transfers_queued() const;

 private:
  Device device_;
  Stream compute_;
  Stream communication_;
  Stream transfer_;
  mutable Event compute_reached_;
  mutable Event communication_reached_;
  mutable Event transfer_reached_;
};

}  // namespace zt
