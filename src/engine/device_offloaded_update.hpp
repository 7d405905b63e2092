// ZeRO-Offload's data path with CUDA (offload_optimizer "cpu" with the model on a GPU): gradients
// and 16-bit parameters live on the device, the fp32 master and the optimizer states in host
// memory, where the host's fused optimizer updates them. The update runs chunk by chunk through
// pinned host buffers: while the optimizer updates chunk k on the host, chunk k+1's gradients are
// copied from the device on one stream and chunk k-1's new parameters to the device on another, so
// both copies overlap the host's work and neither blocks the device's compute streams.
//
// Internal to the engine: the optimizer states of an engine on a GPU with offload_optimizer "cpu"
// (HostOffloadedStates in optimizer_states.cpp) update through it, one owned range per run, after
// the compute stream's work (the reduced gradients) by an event (docs/offload.md, "The CUDA side of
// optimizer offload"; docs/gpu.md).
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "zerotrain/device.hpp"
#include "zerotrain/dtype.hpp"
#include "zerotrain/optimizer.hpp"

namespace zt::engine_detail {

struct DeviceOffloadedUpdateOptions {
  /// Where the gradients and parameters are. The host runs the same chunks, slots and copies
  /// (memcpy, at once): what the tests check on machines without a GPU.
  Device device = Device::cuda(0);
  DType gradient_dtype = DType::bf16;   // of the gradients on the device
  DType parameter_dtype = DType::bf16;  // of the parameters on the device (fp32: a copy of the master)
  std::size_t chunk_elements = std::size_t{1} << 22;
  /// Chunks in flight: 1 runs copy in, update and copy out in turn; 3 or more overlap all three.
  std::size_t buffer_count = 3;
  /// offload_optimizer.pin_memory: page-locked buffers; pageable ones make every copy synchronous.
  bool pin_memory = true;
  /// The parameters are in host memory (offload_param "nvme": the parameter store's buffers), the
  /// gradients on the device: the host optimizer writes the new parameters in place, only the
  /// gradients travel, and the staging holds no parameter chunks. Needs a host master.
  bool parameters_on_host = false;
};

/// Where one run's time went (seconds, host clock).
struct DeviceOffloadedUpdateStats {
  double wall_seconds = 0.0;
  double update_seconds = 0.0;    // in the optimizer
  double wait_in_seconds = 0.0;   // for gradients still on their way to the host
  double wait_out_seconds = 0.0;  // for parameters still on their way to the device (buffer reuse, end)
};

class DeviceOffloadedUpdate {
 public:
  /// Creates the two copy streams and buffer_count pinned buffers of one chunk's gradients and
  /// parameters. Throws zt::CudaError saying why when no CUDA device is usable.
  explicit DeviceOffloadedUpdate(const DeviceOffloadedUpdateOptions& options);
  ~DeviceOffloadedUpdate();  // waits for copies in flight: they use the buffers
  DeviceOffloadedUpdate(const DeviceOffloadedUpdate&) = delete;
  DeviceOffloadedUpdate& operator=(const DeviceOffloadedUpdate&) = delete;

  /// Update `count` elements with `optimizer` (its begin_step() already called for this step, as for
  /// update_range): gradients at `device_gradients` and parameters at `device_parameters` (on the
  /// device, complete when this is called, or once `ordered_after`'s work queued so far is: the
  /// copies wait for it on the device; in host memory with parameters_on_host), master and states
  /// (state_names() order) in host memory.
  /// `master` null: the fp32 parameters on the device are the master (parameter_dtype fp32), and each
  /// chunk of them comes down with its gradients, is updated in the pinned buffer and goes back up.
  /// Returns when the new parameters are on the device.
  DeviceOffloadedUpdateStats run(Optimizer& optimizer, const void* device_gradients, void* device_parameters,
                                 float* master, std::span<float* const> state, std::size_t count,
                                 float grad_scale, float lr, const Stream* ordered_after = nullptr);

  /// As run(), but returns once the last chunk's parameters are queued for the device (with
  /// parameters_on_host: once they are written, so the caller may hand them on at once): the next
  /// call's chunks take up the buffers where this one left off, so that consecutive calls (the
  /// pieces of one step) keep the copies in flight; wait_for_parameters() ends the step.
  DeviceOffloadedUpdateStats queue(Optimizer& optimizer, const void* device_gradients,
                                   void* device_parameters, float* master, std::span<float* const> state,
                                   std::size_t count, float grad_scale, float lr,
                                   const Stream* ordered_after = nullptr);
  /// Waits until every queued parameter chunk is on the device; returns the seconds waited.
  double wait_for_parameters();

  /// Host bytes of the pinned (pin_memory) staging buffers, all of them.
  std::size_t buffer_bytes() const;

 private:
  struct Slot {
    Buffer gradients;   // pinned: a chunk of gradients, copied from the device
    Buffer parameters;  // pinned: the chunk's new parameters, copied to the device (none on the host)
    Event copied_in;
    Event copied_out;
    bool out_pending = false;
  };

  DeviceOffloadedUpdateOptions options_;
  std::vector<Slot> slots_;    // before the streams: destroyed after them
  std::size_t next_slot_ = 0;  // the slot of the next queued chunk (the one free the longest)
  Event gradients_ready_;      // the point of `ordered_after` at the start of a run
  Stream to_host_;
  Stream to_device_;
};

}  // namespace zt::engine_detail
