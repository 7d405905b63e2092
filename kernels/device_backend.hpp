// The CUDA half of the device layer, as plain functions so that device.cpp compiles without CUDA.
// Implemented in kernels/cuda/device_cuda.cpp when CUDA is built, else in device_nocuda.cpp, where
// each call raises an error saying zerotrain was built without CUDA.
#pragma once

#include <cstddef>
#include <string>

#include "zerotrain/device.hpp"

namespace zt::detail {

Allocator& cuda_device_allocator(int device_index);
Allocator& cuda_pinned_host_allocator();
void* cuda_stream_create(int device_index);
/// Destroys a stream of cuda_stream_create once its work is done; the release hooks run first.
void cuda_stream_destroy(void* stream) noexcept;
/// `hook(stream)` runs when cuda_stream_destroy destroys a stream, after its work, before the
/// handle is destroyed (and may be reused): what is kept per stream elsewhere (cuBLASLt's
/// workspace) goes with it. Hooks stay for the process and must not throw.
void cuda_add_stream_release_hook(void (*hook)(void* stream));
void cuda_stream_synchronize(void* stream);
/// cudaDeviceSynchronize on `device_index`: every stream's work, the non-blocking ones too.
void cuda_device_synchronize(int device_index);
/// cudaStreamWaitEvent(stream, event).
void cuda_stream_wait_event(void* stream, void* event);
/// cudaMemcpyAsync with cudaMemcpyDefault (unified addressing) on `stream`, then a sync if stream is null.
void cuda_copy(void* destination, const void* source, std::size_t bytes, void* stream);
/// cudaMemsetAsync to zero on `stream`, then a sync if stream is null.
void cuda_zero(void* destination, std::size_t bytes, void* stream);
/// Whether an event keeps time (cudaEventDefault, for cuda_event_seconds) or not (the lighter
/// cudaEventDisableTiming, for ordering and waiting).
enum class EventTiming { none, kept };
void* cuda_event_create(int device_index, EventTiming timing = EventTiming::none);
/// cudaEventElapsedTime in seconds: the device's time from `start` to `end`, timing events both,
/// recorded and reached.
double cuda_event_seconds(void* start, void* end);
void cuda_event_destroy(void* event) noexcept;
void cuda_event_record(void* event, void* stream);
void cuda_event_synchronize(void* event);
bool cuda_event_query(void* event);
void cuda_set_device(int device_index);
/// Makes CUDA device `device_index` current on the calling thread for the scope, restoring the
/// previous one: kernel launches and the libraries' handles follow the thread's current device, and a
/// thread starts on device 0 whatever device its rank was bound to. Errors are ignored (it also runs in
/// noexcept frees; a failing device shows at the next checked call). Does nothing without CUDA.
class CudaDeviceScope {
 public:
  explicit CudaDeviceScope(int device_index) noexcept;
  ~CudaDeviceScope();
  CudaDeviceScope(const CudaDeviceScope&) = delete;
  CudaDeviceScope& operator=(const CudaDeviceScope&) = delete;

 private:
  int previous_ = -1;  // the device to restore; -1: none
};
CudaStatus query_cuda_status();
/// cudaMemGetInfo on `device_index`: {free, total} bytes.
DeviceMemoryInfo cuda_memory_info(int device_index);
/// The PCI bus id of CUDA device `device_index` ("0000:3b:00.0"), empty when it cannot be read.
std::string cuda_device_pci_bus_id(int device_index) noexcept;
/// Bytes the stream-ordered device pools hold from the GPUs (live buffers, cached blocks, kernels'
/// temporaries), over the devices this process allocated on; 0 without CUDA.
std::size_t cuda_reserved_device_bytes() noexcept;
/// Bytes of pinned host memory the pinned cache keeps for reuse; 0 without CUDA.
std::size_t cuda_cached_pinned_bytes() noexcept;
/// Gives the device pools' unused memory back to the driver, after the frees queued so far (each
/// device this process allocated on is synchronized first); nothing without CUDA.
void cuda_release_cached_device_memory() noexcept;
/// Unpins and frees the blocks the pinned cache keeps (each after its fence); nothing without CUDA.
void cuda_release_cached_pinned_memory() noexcept;

}  // namespace zt::detail
