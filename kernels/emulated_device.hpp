// The emulated device's memory (see include/zerotrain/device.hpp): protected host memory that only
// the device API touches. Internal to the library; kernels/dispatch.hpp, copies and emulated-device
// communicators open an EmulatedDeviceAccess around the host code that works on such memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "zerotrain/device.hpp"

namespace zt::detail {

/// While at least one of these exists (in any thread), every live emulated region is readable and
/// writable; the last one to go makes them PROT_NONE again. Regions allocated while access is open
/// stay accessible until it closes. Nests; thread-safe (one process-wide mutex).
class EmulatedDeviceAccess {
 public:
  EmulatedDeviceAccess();
  ~EmulatedDeviceAccess();
  EmulatedDeviceAccess(const EmulatedDeviceAccess&) = delete;
  EmulatedDeviceAccess& operator=(const EmulatedDeviceAccess&) = delete;
};

/// The allocator of Device::emulated(index): every allocation its own region of whole pages in one
/// reserved address range, never reused, with an inaccessible page after it. One allocated on a
/// stream (allocate_on) stays inaccessible until that stream's work reaches the allocation, and one
/// freed on a stream goes when its work reaches the free (cudaMallocFromPoolAsync/cudaFreeAsync).
Allocator& emulated_device_allocator(int index);

/// Whether `address` lies in the emulated device's reserved address range (live or freed).
bool is_emulated_device_address(const void* address);

/// Live emulated regions (for tests of the registry).
std::size_t emulated_device_region_count();

// ---- the emulated device's streams ----------------------------------------------------------
// A Stream(Device::emulated()) queues its work, as a GPU's stream does, and runs it only when the
// host needs it done: Stream::synchronize(), Event::synchronize(), the work of a stream that waits
// for an event recorded on it (Stream::wait: the waiting stream's next item runs it up to the event
// first), a copy, zero or free without a stream (after every stream's work, as on a GPU), a device
// collective (after the stream its communicator is ordered with), the stream's destruction. Nothing
// runs on its own, and what else runs when the host waits is fixed (EmulatedStreamOrder, below), so
// work that another stream reads without an event between them runs in the wrong order every time
// under one of the two orders: a missing wait gives wrong numbers or a fault on the emulated device
// deterministically, where a GPU would give them now and then. Copies follow cudaMemcpyAsync: from
// pageable host memory the source is read at the call, into pageable host memory the call returns
// when the copy is done (after the stream's earlier work); page-locked host memory is read and
// written when the copy runs. The default stream (default_stream(Device::emulated()), queue 0) is
// CUDA's legacy default stream: its work runs at the call, after every stream's queued work, so
// the tensor API's stream-less calls see everything queued before them. One process-wide recursive
// mutex orders every queue; queued work must not wait for other threads.

/// A new queue's id (never 0, never reused).
std::uint64_t emulated_queue_create();
/// Runs what is queued (a failure is printed: nothing can report it any more) and forgets the queue.
void emulated_queue_destroy(std::uint64_t queue) noexcept;
/// Appends `work` (run inside the device API's access by the callers that need it); on queue 0 it
/// runs at once, after every queue's work.
void emulated_enqueue(std::uint64_t queue, std::function<void()> work);
/// Appends a wait: `queue`'s later items run after `event_queue`'s work up to `event_position` (an
/// event's; Stream::wait). On queue 0 it waits at once.
void emulated_enqueue_wait(std::uint64_t queue, std::uint64_t event_queue, std::uint64_t event_position);
/// How many items were ever queued on `queue`: an event's position (0 for queue 0).
std::uint64_t emulated_queue_position(std::uint64_t queue);
/// Runs `queue`'s work up to `position` (a destroyed queue's is done). A queued item that threw is
/// rethrown here (once; what was queued after it is dropped).
void emulated_run_until(std::uint64_t queue, std::uint64_t position);
/// Whether `queue`'s work up to `position` has run.
bool emulated_reached(std::uint64_t queue, std::uint64_t position);
/// Runs every queue's work: a copy, zero or free without a stream waits for the whole device.
void emulated_run_all();
/// The same from noexcept code: a failure stays with its queue for the next emulated_run_until.
void emulated_run_all_noexcept() noexcept;
/// When the host waits for a stream, what else runs first. Both are orders a GPU may choose; each
/// shows the missing events the other hides, so the tests of the emulated device run under both.
///   lazy:  nothing else. A stream reading another's output without an event reads it unwritten
///          when the host waits for the reader first (an upload on the transfer stream that the
///          compute stream uses without compute_waits_for_transfers).
///   eager: every other stream first runs what it can without waiting for an event not yet
///          reached. A stream reading another's output without an event reads it unwritten when
///          the host waits for the writer first (a copy to the host queued on the transfer stream
///          without waiting for the compute stream's kernels).
/// From ZT_EMULATED_STREAM_ORDER (lazy, the default, or eager); tests set it.
enum class EmulatedStreamOrder { lazy, eager };
EmulatedStreamOrder emulated_stream_order();
void set_emulated_stream_order(EmulatedStreamOrder order);
/// The queue of an emulated stream (0 for the default stream and for other devices).
std::uint64_t emulated_queue_of(const Stream& stream);

/// Whether `address` lies in host memory allocated page-locked (HostMemoryKind::pinned) while no
/// GPU is usable: the emulated device's copies treat it as a GPU's copies treat pinned memory.
bool is_page_locked_stand_in(const void* address);
/// The pinned host allocator when no GPU is usable: page-aligned host memory that is registered for
/// is_page_locked_stand_in and freed in a stream's order (deallocate_on with an emulated queue).
Allocator& page_locked_stand_in_allocator();

}  // namespace zt::detail
