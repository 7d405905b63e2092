// Without CUDA: the CUDA entry points of the device layer say so instead of failing obscurely.
#include "zerotrain/build_info.hpp"

#if !ZT_HAVE_CUDA
#include "kernels/device_backend.hpp"
#include "zerotrain/error.hpp"

namespace zt::detail {
namespace {
[[noreturn]] void no_cuda(const char* what) {
  ZT_THROW_AS(CudaError, what,
              ": zerotrain was built without CUDA (configure with -DZT_WITH_CUDA=ON and a CUDA toolkit)");
}
}  // namespace

Allocator& cuda_device_allocator(int) {
  no_cuda("allocating device memory");
}
Allocator& cuda_pinned_host_allocator() {
  no_cuda("allocating pinned host memory");
}
void* cuda_stream_create(int) {
  no_cuda("creating a CUDA stream");
}
void cuda_stream_destroy(void*) noexcept {}
void cuda_stream_synchronize(void*) {
  no_cuda("synchronizing a CUDA stream");
}
void cuda_device_synchronize(int) {
  no_cuda("synchronizing a CUDA device");
}
void cuda_stream_wait_event(void*, void*) {
  no_cuda("ordering a CUDA stream after an event");
}
void cuda_copy(void*, const void*, std::size_t, void*) {
  no_cuda("copying to or from a CUDA device");
}
void cuda_zero(void*, std::size_t, void*) {
  no_cuda("zeroing CUDA device memory");
}
void* cuda_event_create(int, EventTiming) {
  no_cuda("creating a CUDA event");
}
double cuda_event_seconds(void*, void*) {
  no_cuda("timing CUDA events");
}
void cuda_event_destroy(void*) noexcept {}
void cuda_add_stream_release_hook(void (*)(void*)) {}
void cuda_event_record(void*, void*) {
  no_cuda("recording a CUDA event");
}
void cuda_event_synchronize(void*) {
  no_cuda("waiting for a CUDA event");
}
bool cuda_event_query(void*) {
  no_cuda("querying a CUDA event");
}
void cuda_set_device(int) {
  no_cuda("selecting a CUDA device");
}
CudaDeviceScope::CudaDeviceScope(int) noexcept {}
CudaDeviceScope::~CudaDeviceScope() = default;
std::string cuda_device_pci_bus_id(int) noexcept {
  return {};
}
std::size_t cuda_reserved_device_bytes() noexcept {
  return 0;
}
DeviceMemoryInfo cuda_memory_info(int) {
  no_cuda("reading a CUDA device's memory");
}
std::size_t cuda_cached_pinned_bytes() noexcept {
  return 0;
}
void cuda_release_cached_device_memory() noexcept {}
void cuda_release_cached_pinned_memory() noexcept {}
CudaStatus query_cuda_status() {
  CudaStatus status;
  status.compiled = false;
  status.reason = "zerotrain was built without CUDA";
  return status;
}

}  // namespace zt::detail
#endif
