// The emulated device's memory (see include/zerotrain/device.hpp): protected host memory that only
// the device API touches. Internal to the library; kernels/dispatch.hpp, copies and emulated-device
// communicators open an EmulatedDeviceAccess around the host code that works on such memory.
#pragma once

#include <cstddef>

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
/// reserved address range, never reused, with an inaccessible page after it.
Allocator& emulated_device_allocator(int index);

/// Whether `address` lies in the emulated device's reserved address range (live or freed).
bool is_emulated_device_address(const void* address);

/// Live emulated regions (for tests of the registry).
std::size_t emulated_device_region_count();

}  // namespace zt::detail
