// CUDA half of the device layer: device and pinned allocators, streams, copies, status.
#include <cuda_runtime.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/never_destroyed.hpp"
#include "kernels/block_cache.hpp"
#include "kernels/cuda/cuda_common.hpp"
#include "kernels/device_backend.hpp"
#include "zerotrain/error.hpp"

namespace zt::detail {
namespace {
using kernels::cuda::as_cuda_stream;

void require_usable(const char* what) {
  const CudaStatus& status = cuda_status();
  if (!status.usable()) ZT_THROW_AS(CudaError, what, ": no usable CUDA device (", status.reason, ")");
}

using DeviceScope = CudaDeviceScope;

/// The device cuda_set_device bound this process to (the runtime's, one GPU per rank), -1 before:
/// what a free without a stream waits for, from whichever thread it runs.
std::atomic<int> bound_device{-1};

/// cudaDeviceSynchronize on the bound device (the current one before any binding): every stream's
/// work, the non-blocking ones too, which the legacy default stream does not wait for.
cudaError_t synchronize_bound_device() noexcept {
  const int device = bound_device.load();
  const std::optional<CudaDeviceScope> scope =
      device >= 0 ? std::optional<CudaDeviceScope>(std::in_place, device) : std::nullopt;
  return cudaDeviceSynchronize();
}

std::uint64_t pool_attribute(cudaMemPool_t pool, cudaMemPoolAttr attribute) noexcept {
  std::uint64_t value = 0;
  if (cudaMemPoolGetAttribute(pool, attribute, &value) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return value;
}

/// The streams made by cuda_stream_create and not destroyed yet. A buffer freed in stream order
/// remembers its stream's handle, and a tensor may outlive the stream it was allocated on (an
/// engine's forward output kept after the engine, whose execution context owns the stream): a free
/// on a stream that is gone falls back to the free that waits for the device, instead of handing a
/// dead handle to cudaFreeAsync.
class LiveStreams {
 public:
  void add(void* stream) {
    const std::lock_guard lock(mutex_);
    streams_.insert(stream);
  }
  void remove(void* stream) noexcept {
    const std::lock_guard lock(mutex_);
    streams_.erase(stream);
  }
  bool contains(void* stream) noexcept {
    const std::lock_guard lock(mutex_);
    return streams_.contains(stream);
  }

 private:
  std::mutex mutex_;
  std::set<void*> streams_;
};
/// Never destroyed: buffers may be freed during static destruction.
LiveStreams& live_streams() {
  static base::NeverDestroyed<LiveStreams> streams;
  return *streams;
}

/// Device memory, cached, in stream order: the device's default memory pool (the one cudaMallocAsync
/// draws from, so the kernels' temporaries share its cache) with its release threshold at the
/// maximum, so that what is freed stays in the pool instead of going back to the driver at every
/// synchronization.
///
/// Why CUDA's pool and not a size-class cache of our own (PyTorch's caching allocator): the driver
/// knows the stream order of every free and hands a block to another stream only once its free has
/// completed (the pool's default reuse policies: follow event dependencies, opportunistic reuse of
/// completed frees), which is exactly the race a size-class cache has to prevent with an event per
/// block; it maps physical pages into the virtual range it needs, so sizes that vary cost less
/// fragmentation than fixed classes; and with no GPU to run on while this was written, less code of
/// our own is less to get wrong (docs/gpu.md, "Device memory and device choice").
///
/// Without a stream (allocate/deallocate), the allocation is ordered on this allocator's own stream
/// and waited for, so any stream may use the memory, and the free first waits for the device (as
/// cudaFree does), so no kernel still uses the block when the pool may hand it out again.
class CudaDeviceAllocator final : public Allocator {
 public:
  explicit CudaDeviceAllocator(int index) : index_(index) {
    const DeviceScope scope(index_);
    ZT_CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool_, index_));
    std::uint64_t keep_everything = std::numeric_limits<std::uint64_t>::max();
    ZT_CHECK_CUDA(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep_everything));
    // Lives as long as the process, as the allocator: buffers are freed until static destruction.
    ZT_CHECK_CUDA(cudaStreamCreateWithFlags(&ordering_stream_, cudaStreamNonBlocking));
  }

  void* allocate(std::size_t bytes, std::size_t alignment) override {
    void* pointer = allocate_on(bytes, alignment, ordering_stream_);
    // Reached: the memory is ready for work on any stream.
    ZT_CHECK_CUDA(cudaStreamSynchronize(ordering_stream_));
    return pointer;
  }

  void deallocate(void* pointer, std::size_t) noexcept override {
    const DeviceScope scope(index_);
    cudaDeviceSynchronize();  // whichever stream used the block is done with it
    cudaFreeAsync(pointer, ordering_stream_);
  }

  // Pool blocks are aligned to at least 256 bytes, more than any alignment zerotrain asks for.
  void* allocate_on(std::size_t bytes, std::size_t, void* stream) override {
    require_usable("allocating device memory");
    const DeviceScope scope(index_);
    const std::size_t size = bytes == 0 ? 1 : bytes;
    void* pointer = nullptr;
    cudaError_t status = cudaMallocFromPoolAsync(&pointer, size, pool_, as_cuda_stream(stream));
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      // What the pool keeps goes back to the driver once the frees queued so far are done; then once more.
      cudaDeviceSynchronize();
      cudaMemPoolTrimTo(pool_, 0);
      status = cudaMallocFromPoolAsync(&pointer, size, pool_, as_cuda_stream(stream));
    }
    if (status != cudaSuccess) {
      cudaGetLastError();
      ZT_THROW_AS(CudaError, "out of device memory on cuda:", index_, ": cudaMallocFromPoolAsync(", bytes,
                  " bytes) failed: ", cudaGetErrorString(status), "; the pool holds ", reserved_bytes(),
                  " bytes, ", pool_attribute(pool_, cudaMemPoolAttrUsedMemCurrent), " of them in use");
    }
    return pointer;
  }

  void deallocate_on(void* pointer, std::size_t bytes, void* stream) noexcept override {
    if (!live_streams().contains(stream)) {
      deallocate(pointer, bytes);  // its stream is gone (see LiveStreams)
      return;
    }
    const DeviceScope scope(index_);
    cudaFreeAsync(pointer, as_cuda_stream(stream));
  }

  Device device() const override { return Device::cuda(index_); }

  std::size_t reserved_bytes() const noexcept {
    return static_cast<std::size_t>(pool_attribute(pool_, cudaMemPoolAttrReservedMemCurrent));
  }

  /// What the pool keeps beyond its live blocks goes back to the driver: a block freed on a stream
  /// returns to the pool only when the device reaches its free, hence the synchronization first.
  void release_cached() noexcept {
    const DeviceScope scope(index_);
    cudaDeviceSynchronize();
    cudaMemPoolTrimTo(pool_, 0);
    cudaGetLastError();  // a failed device shows at the next checked call
  }

 private:
  int index_;
  cudaMemPool_t pool_ = nullptr;
  cudaStream_t ordering_stream_ = nullptr;
};

struct DeviceAllocators {
  std::mutex mutex;
  std::map<int, std::unique_ptr<CudaDeviceAllocator>> by_index;
};
/// Never destroyed: buffers may be freed during static destruction.
DeviceAllocators& device_allocators() {
  static base::NeverDestroyed<DeviceAllocators> allocators;
  return *allocators;
}

/// Pinned (page-locked) host memory for staging and offload, cached: cudaHostAlloc pins every page
/// as it allocates (milliseconds per hundred MiB) and cudaFreeHost waits for the device, so freed
/// blocks are kept by size class (pinned_size_class) up to a capacity (ZT_PINNED_CACHE_MB, default
/// an eighth of physical memory; 0 caches nothing) and handed out again once the device is done with
/// them: a block freed without a stream after the current device's queued work (what cudaFreeHost
/// waits for), a block freed on a stream once an event recorded there at the free is reached. A
/// failed cudaHostAlloc empties the cache and retries. Counted as host memory, like any Buffer.
class CudaPinnedAllocator final : public Allocator {
 public:
  static constexpr std::size_t kPinnedAlignment = 4096;

  CudaPinnedAllocator() : cache_(default_capacity()) {}

  void* allocate(std::size_t bytes, std::size_t alignment) override {
    require_usable("allocating pinned host memory");
    ZT_CHECK(alignment <= kPinnedAlignment, "pinned host memory is aligned to ", kPinnedAlignment,
             " bytes; an alignment of ", alignment, " was asked for");
    const std::size_t size = pinned_size_class(bytes);
    {
      const std::lock_guard lock(mutex_);
      if (const std::optional<BlockCache::Block> block = cache_.take(size, event_reached)) {
        if (block->fence != nullptr) spare_events_.push_back(static_cast<cudaEvent_t>(block->fence));
        return block->pointer;
      }
    }
    void* pointer = nullptr;
    cudaError_t status = cudaHostAlloc(&pointer, size, cudaHostAllocDefault);
    if (status != cudaSuccess) {
      cudaGetLastError();
      release_all();
      status = cudaHostAlloc(&pointer, size, cudaHostAllocDefault);
    }
    if (status != cudaSuccess) {
      cudaGetLastError();
      ZT_THROW_AS(CudaError, "cudaHostAlloc(", size, " bytes, for a buffer of ", bytes,
                  ") failed: ", cudaGetErrorString(status));
    }
    return pointer;
  }

  void deallocate(void* pointer, std::size_t bytes) noexcept override {
    // Copies from or to the block are done: on the process's GPU (one per rank), which need not be
    // the calling thread's current device (a thread starts on device 0).
    synchronize_bound_device();
    keep({pointer, pinned_size_class(bytes), nullptr});
  }

  void deallocate_on(void* pointer, std::size_t bytes, void* stream) noexcept override {
    if (!live_streams().contains(stream)) {
      deallocate(pointer, bytes);  // its stream is gone (see LiveStreams)
      return;
    }
    cudaEvent_t event = spare_event();
    if (event != nullptr && cudaEventRecord(event, as_cuda_stream(stream)) != cudaSuccess) {
      cudaGetLastError();
      cudaEventDestroy(event);
      event = nullptr;
    }
    if (event == nullptr) cudaStreamSynchronize(as_cuda_stream(stream));  // no fence: wait instead
    keep({pointer, pinned_size_class(bytes), event});
  }

  Device device() const override { return Device::host(); }

  std::size_t cached_bytes() {
    const std::lock_guard lock(mutex_);
    return cache_.cached_bytes();
  }

  void release_all() noexcept {
    std::vector<BlockCache::Block> blocks;
    {
      const std::lock_guard lock(mutex_);
      blocks = cache_.take_all();
    }
    for (const BlockCache::Block& block : blocks) free_block(block);
  }

 private:
  static bool event_reached(void* event) {
    return kernels::cuda::query_event(static_cast<cudaEvent_t>(event)) == cudaSuccess;
  }

  static std::size_t default_capacity() {
    if (const char* env = std::getenv("ZT_PINNED_CACHE_MB"); env != nullptr && *env != '\0')
      return static_cast<std::size_t>(std::strtoull(env, nullptr, 10)) << 20;
    const long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGE_SIZE);
    if (pages <= 0 || page_size <= 0) return std::size_t{1} << 30;
    return static_cast<std::size_t>(pages) * static_cast<std::size_t>(page_size) / 8;
  }

  /// An event for a fence: a spare one, or a new one (nullptr when none can be made).
  cudaEvent_t spare_event() noexcept {
    {
      const std::lock_guard lock(mutex_);
      if (!spare_events_.empty()) {
        cudaEvent_t event = spare_events_.back();
        spare_events_.pop_back();
        return event;
      }
    }
    cudaEvent_t event = nullptr;
    if (cudaEventCreateWithFlags(&event, cudaEventDisableTiming) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    return event;
  }

  /// Into the cache, or, past its capacity, back to CUDA once its fence is passed.
  void keep(const BlockCache::Block& block) noexcept {
    {
      const std::lock_guard lock(mutex_);
      try {
        if (cache_.put(block)) return;
      } catch (...) {  // no memory for the cache's node: free the block instead
      }
    }
    free_block(block);
  }

  static void free_block(const BlockCache::Block& block) noexcept {
    if (block.fence != nullptr) {
      cudaEventSynchronize(static_cast<cudaEvent_t>(block.fence));
      cudaEventDestroy(static_cast<cudaEvent_t>(block.fence));
    }
    cudaFreeHost(block.pointer);
  }

  std::mutex mutex_;
  BlockCache cache_;
  std::vector<cudaEvent_t> spare_events_;
};

/// Never destroyed: pinned buffers may be freed during static destruction.
CudaPinnedAllocator& pinned_allocator() {
  static base::NeverDestroyed<CudaPinnedAllocator> allocator;
  return *allocator;
}

}  // namespace

Allocator& cuda_device_allocator(int device_index) {
  require_usable("allocating device memory");
  ZT_CHECK(device_index >= 0 && device_index < cuda_status().device_count, "cuda:", device_index,
           " does not exist: this process sees ", cuda_status().device_count, " device(s)");
  DeviceAllocators& allocators = device_allocators();
  const std::lock_guard lock(allocators.mutex);
  auto& slot = allocators.by_index[device_index];
  if (!slot) slot = std::make_unique<CudaDeviceAllocator>(device_index);
  return *slot;
}

Allocator& cuda_pinned_host_allocator() {
  return pinned_allocator();
}

std::size_t cuda_reserved_device_bytes() noexcept {
  DeviceAllocators& allocators = device_allocators();
  const std::lock_guard lock(allocators.mutex);
  std::size_t reserved = 0;
  for (const auto& [index, allocator] : allocators.by_index) reserved += allocator->reserved_bytes();
  return reserved;
}

std::size_t cuda_cached_pinned_bytes() noexcept {
  return pinned_allocator().cached_bytes();
}

void cuda_release_cached_device_memory() noexcept {
  DeviceAllocators& allocators = device_allocators();
  const std::lock_guard lock(allocators.mutex);
  for (const auto& [index, allocator] : allocators.by_index) allocator->release_cached();
}

void cuda_release_cached_pinned_memory() noexcept {
  pinned_allocator().release_all();
}

std::string cuda_device_pci_bus_id(int device_index) noexcept {
  char id[32] = {};
  if (cudaDeviceGetPCIBusId(id, sizeof id, device_index) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  return id;
}

void* cuda_stream_create(int device_index) {
  require_usable("creating a CUDA stream");
  ZT_CHECK_CUDA(cudaSetDevice(device_index));
  cudaStream_t stream = nullptr;
  ZT_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  live_streams().add(stream);
  return stream;
}

namespace {
struct StreamReleaseHooks {
  std::mutex mutex;
  std::vector<void (*)(void*)> hooks;
};
/// Never destroyed: streams may be destroyed during static destruction.
StreamReleaseHooks& stream_release_hooks() {
  static base::NeverDestroyed<StreamReleaseHooks> hooks;
  return *hooks;
}
}  // namespace

void cuda_add_stream_release_hook(void (*hook)(void* stream)) {
  StreamReleaseHooks& registry = stream_release_hooks();
  const std::lock_guard lock(registry.mutex);
  registry.hooks.push_back(hook);
}

void cuda_stream_destroy(void* stream) noexcept {
  live_streams().remove(stream);
  // Its work done first: a later stream may get the same handle, and a buffer of this one freed on
  // that handle must not be reused while this stream's kernels may still touch it.
  cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
  {
    StreamReleaseHooks& registry = stream_release_hooks();
    const std::lock_guard lock(registry.mutex);
    for (void (*hook)(void*) : registry.hooks) hook(stream);
  }
  cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}

void cuda_stream_synchronize(void* stream) {
  ZT_CHECK_CUDA(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
}

void cuda_device_synchronize(int device_index) {
  const DeviceScope scope(device_index);
  ZT_CHECK_CUDA(cudaDeviceSynchronize());
}

void cuda_stream_wait_event(void* stream, void* event) {
  ZT_CHECK_CUDA(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0));
}

void cuda_zero(void* destination, std::size_t bytes, void* stream) {
  require_usable("zeroing CUDA device memory");
  // Without a stream: after the work queued on every stream, finished on return (as item_as_double).
  if (stream == nullptr) ZT_CHECK_CUDA(synchronize_bound_device());
  ZT_CHECK_CUDA(cudaMemsetAsync(destination, 0, bytes, static_cast<cudaStream_t>(stream)));
  if (stream == nullptr) ZT_CHECK_CUDA(cudaStreamSynchronize(nullptr));
}

void cuda_copy(void* destination, const void* source, std::size_t bytes, void* stream) {
  require_usable("copying to or from a CUDA device");
  // Without a stream: after the work queued on every stream (the legacy default stream alone does not
  // wait for the non-blocking ones, so a clone() could read a kernel's output half written), finished
  // on return.
  if (stream == nullptr) ZT_CHECK_CUDA(synchronize_bound_device());
  ZT_CHECK_CUDA(
      cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)));
  if (stream == nullptr) ZT_CHECK_CUDA(cudaStreamSynchronize(nullptr));
}

void* cuda_event_create(int device_index, EventTiming timing) {
  require_usable("creating a CUDA event");
  ZT_CHECK_CUDA(cudaSetDevice(device_index));
  cudaEvent_t event = nullptr;
  ZT_CHECK_CUDA(cudaEventCreateWithFlags(
      &event, timing == EventTiming::kept ? cudaEventDefault : cudaEventDisableTiming));
  return event;
}

double cuda_event_seconds(void* start, void* end) {
  float milliseconds = 0.0f;
  ZT_CHECK_CUDA(
      cudaEventElapsedTime(&milliseconds, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end)));
  return 1e-3 * static_cast<double>(milliseconds);
}

void cuda_event_destroy(void* event) noexcept {
  cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

void cuda_event_record(void* event, void* stream) {
  ZT_CHECK_CUDA(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)));
}

void cuda_event_synchronize(void* event) {
  ZT_CHECK_CUDA(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
}

bool cuda_event_query(void* event) {
  const cudaError_t status = kernels::cuda::query_event(static_cast<cudaEvent_t>(event));
  if (status == cudaErrorNotReady) return false;
  ZT_CHECK_CUDA(status);
  return true;
}

CudaDeviceScope::CudaDeviceScope(int device_index) noexcept {
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current == device_index) return;
  if (cudaSetDevice(device_index) == cudaSuccess) previous_ = current;
}

CudaDeviceScope::~CudaDeviceScope() {
  if (previous_ >= 0) cudaSetDevice(previous_);
}

void cuda_set_device(int device_index) {
  require_usable("selecting a CUDA device");
  ZT_CHECK_CUDA(cudaSetDevice(device_index));
  bound_device.store(device_index);
}

DeviceMemoryInfo cuda_memory_info(int device_index) {
  require_usable("reading a CUDA device's memory");
  const kernels::cuda::CurrentDeviceScope scope(device_index);  // checked: a bad index throws
  std::size_t free = 0, total = 0;
  ZT_CHECK_CUDA(cudaMemGetInfo(&free, &total));
  return {free, total};
}

CudaStatus query_cuda_status() {
  CudaStatus status;
  status.compiled = true;
  cudaRuntimeGetVersion(&status.runtime_version);
  cudaDriverGetVersion(&status.driver_version);  // 0 when no driver is installed
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error == cudaSuccess && count > 0) {
    status.device_count = count;
  } else if (error == cudaSuccess) {
    status.reason = "the CUDA runtime sees no device (check CUDA_VISIBLE_DEVICES)";
  } else {
    // cudaErrorInsufficientDriver (35) on machines without a GPU driver, cudaErrorNoDevice (100) without a
    // GPU.
    status.reason = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(error) + " (" +
                    std::to_string(static_cast<int>(error)) + "): " + cudaGetErrorString(error);
    cudaGetLastError();  // clear the sticky-free error so later calls are not confused by it
  }
  return status;
}

}  // namespace zt::detail
