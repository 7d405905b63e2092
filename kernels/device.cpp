// Host side of the device layer: aligned host allocation, buffers, streams and copies. The CUDA
// side lives in kernels/cuda/device_cuda.cpp; without CUDA the cuda entry points below explain why
// they cannot work.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/never_destroyed.hpp"
#include "kernels/block_cache.hpp"
#include "kernels/device_backend.hpp"
#include "kernels/emulated_device.hpp"
#include "kernels/host_memory.hpp"
#include "zerotrain/build_info.hpp"
#include "zerotrain/device.hpp"
#include "zerotrain/error.hpp"

namespace zt {

const CudaStatus& cuda_status() {
  static const CudaStatus status = detail::query_cuda_status();
  return status;
}

DeviceMemoryInfo device_memory_info(Device device) {
  if (!device.is_cuda()) return {};
  return detail::cuda_memory_info(device.index);
}

std::string Device::str() const {
  switch (type) {
    case DeviceType::host:
      return "host";
    case DeviceType::cuda:
      return "cuda:" + std::to_string(index);
    case DeviceType::emulated:
      return "emulated:" + std::to_string(index);
  }
  return "?";
}

bool host_huge_pages_enabled() {
  const char* env = std::getenv("ZT_HOST_HUGE_PAGES");
  return env == nullptr || std::string_view(env) != "0";
}

std::string host_huge_pages_description() {
  std::string mode;  // "always [madvise] never": the bracketed one is in force
  if (std::ifstream file("/sys/kernel/mm/transparent_hugepage/enabled"); file) std::getline(file, mode);
  const std::size_t open = mode.find('['), close = mode.find(']');
  const std::string in_force =
      open != std::string::npos && close > open ? mode.substr(open + 1, close - open - 1) : "";
  if (!host_huge_pages_enabled()) return "off (ZT_HOST_HUGE_PAGES=0): 4 KiB pages unless THP is always";
  const std::string advice = "blocks of " + std::to_string(kHostHugePageMinimumBytes >> 20) +
                             " MiB and more 2 MiB-aligned, advised MADV_HUGEPAGE";
  if (in_force.empty()) return advice + "; this kernel has no transparent huge pages: 4 KiB pages";
  if (in_force == "never") return advice + "; THP is never here: 4 KiB pages";
  return advice + " (THP " + in_force + "; ZT_HOST_HUGE_PAGES=0 to disable)";
}

namespace {
/// The whole 2 MiB pages inside [pointer, pointer + bytes): the only range advised, so that the advice
/// never reaches the heap's neighbouring chunks and a block's tail (under 2 MiB) is not faulted in
/// as a whole huge page it does not fill.
std::size_t huge_page_span(std::size_t bytes) {
  return bytes / kHostHugePageBytes * kHostHugePageBytes;
}
}  // namespace

void* allocate_host_block(std::size_t bytes, std::size_t alignment, bool huge_pages) {
  const bool huge = huge_pages && bytes >= kHostHugePageMinimumBytes && host_huge_pages_enabled();
  if (huge) alignment = std::max(alignment, kHostHugePageBytes);
  // aligned_alloc wants a size that is a multiple of the alignment; a huge block is rounded to 4 KiB
  // only (the pages past its end stay the heap's).
  const std::size_t granule = huge ? std::size_t{4096} : alignment;
  const std::size_t rounded = (bytes + granule - 1) / granule * granule;
  void* pointer = nullptr;
  if (huge) {
    if (posix_memalign(&pointer, alignment, rounded) != 0) pointer = nullptr;
  } else {
    pointer = std::aligned_alloc(alignment, rounded == 0 ? alignment : rounded);
  }
  // Advice only: where the kernel has no THP (EINVAL) or THP is "never", these stay 4 KiB pages.
  if (pointer != nullptr && huge) (void)madvise(pointer, huge_page_span(bytes), MADV_HUGEPAGE);
  return pointer;
}

void free_host_block(void* pointer, std::size_t bytes, bool huge_pages) noexcept {
  // The heap keeps the freed range (the malloc tuning) and will hand it out in small pieces: advised
  // huge it would stay so, and khugepaged (max_ptes_none 511 by default) would fill each 2 MiB range
  // around a few touched 4 KiB pages, resident memory that no allocation holds (~50 MiB per rank at
  // vocabulary 50257, docs/benchmarks.md). Not read again from ZT_HOST_HUGE_PAGES: a block advised
  // before the variable changed still loses its advice.
  if (pointer != nullptr && huge_pages && bytes >= kHostHugePageMinimumBytes)
    (void)madvise(pointer, huge_page_span(bytes), MADV_NOHUGEPAGE);
  std::free(pointer);
}

namespace {

class HostAllocator final : public Allocator {
 public:
  explicit HostAllocator(bool huge_pages = true) : huge_pages_(huge_pages) {}

  void* allocate(std::size_t bytes, std::size_t alignment) override {
    ZT_CHECK(alignment != 0 && (alignment & (alignment - 1)) == 0, "alignment must be a power of two, got ",
             alignment);
    void* pointer = allocate_host_block(bytes, alignment, huge_pages_);
    if (pointer == nullptr) {
      ZT_THROW("out of host memory: could not allocate ", bytes, " bytes aligned to ", alignment);
    }
    return pointer;
  }
  void deallocate(void* pointer, std::size_t bytes) noexcept override {
    free_host_block(pointer, bytes, huge_pages_);
  }
  Device device() const override { return Device::host(); }

 private:
  bool huge_pages_;
};

/// Host activations: a layer's outputs are allocated and freed once per step with the same sizes.
/// Through malloc, blocks this large are mmap'ed (or trimmed off the heap) and come back as fresh
/// pages, so every step paid a page fault per 4 KiB of activations (a third of a GPT-2 step's time
/// on 2 cores). This cache keeps freed blocks by size and hands them out again. Only blocks of
/// kMinimumBytes and more are cached (smaller ones stay with malloc), the free blocks held are capped
/// (ZT_HOST_ACTIVATION_CACHE_MB, default a quarter of physical memory, 0 disables), and a failed
/// allocation empties the cache and retries. Cached bytes are not counted as in use.
class CachingHostAllocator final : public Allocator {
 public:
  static constexpr std::size_t kMinimumBytes = std::size_t{64} << 10;
  static constexpr std::size_t kPage = 4096;

  CachingHostAllocator() : cache_(default_capacity()) {}

  static bool caches(std::size_t bytes, std::size_t alignment) {
    return bytes >= kMinimumBytes && alignment <= kPage;
  }

  void* allocate(std::size_t bytes, std::size_t alignment) override {
    if (!caches(bytes, alignment)) return fallback_.allocate(bytes, alignment);
    const std::size_t size = rounded(bytes);
    {
      const std::lock_guard lock(mutex_);
      if (const std::optional<detail::BlockCache::Block> block = cache_.take(size, no_fences))
        return block->pointer;
    }
    void* pointer = allocate_host_block(size, kPage);
    if (pointer == nullptr) {
      release_all();
      pointer = allocate_host_block(size, kPage);
    }
    if (pointer == nullptr)
      ZT_THROW("out of host memory: could not allocate ", bytes, " bytes for activations");
    return pointer;
  }

  void deallocate(void* pointer, std::size_t bytes) noexcept override {
    // Buffer passes the size it allocated with, and alignment <= kPage for every cached block, so
    // blocks below kMinimumBytes came from the fallback.
    if (bytes < kMinimumBytes) return fallback_.deallocate(pointer, bytes);
    {
      const std::lock_guard lock(mutex_);
      try {
        if (cache_.put({pointer, rounded(bytes), nullptr})) return;
      } catch (...) {  // no memory for the cache's node: free the block instead
      }
    }
    free_host_block(pointer, rounded(bytes), /*huge_pages=*/true);
  }

  Device device() const override { return Device::host(); }

  std::size_t cached_bytes() {
    const std::lock_guard lock(mutex_);
    return cache_.cached_bytes();
  }

  void release_all() noexcept {
    const std::lock_guard lock(mutex_);
    for (const detail::BlockCache::Block& block : cache_.take_all())
      free_host_block(block.pointer, block.size, /*huge_pages=*/true);
  }

 private:
  static std::size_t rounded(std::size_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }
  static bool no_fences(void*) { return true; }  // host work is done when the buffer is freed

  static std::size_t default_capacity() {
    if (const char* env = std::getenv("ZT_HOST_ACTIVATION_CACHE_MB"); env != nullptr && *env != '\0') {
      return static_cast<std::size_t>(std::strtoull(env, nullptr, 10)) << 20;
    }
    const long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGE_SIZE);
    if (pages <= 0 || page_size <= 0) return std::size_t{1} << 30;
    return static_cast<std::size_t>(pages) * static_cast<std::size_t>(page_size) / 4;
  }

  HostAllocator fallback_;
  std::mutex mutex_;
  detail::BlockCache cache_;  // rounded size -> free blocks
};

/// The one activation cache. Never destroyed: buffers may be released during static destruction.
CachingHostAllocator& activation_cache() {
  static base::NeverDestroyed<CachingHostAllocator> activations;
  return *activations;
}

/// Process-wide byte counters per device type and category. Atomic: buffers may be freed on
/// other threads (I/O, communication).
struct MemoryCounters {
  std::atomic<std::size_t> current[kMemoryCategoryCount]{};
  std::atomic<std::size_t> peak[kMemoryCategoryCount]{};
  std::atomic<std::size_t> total_current{0};
  std::atomic<std::size_t> total_peak{0};
};

MemoryCounters& counters_for(DeviceType type) {
  static MemoryCounters host;
  static MemoryCounters cuda;
  static MemoryCounters emulated;
  switch (type) {
    case DeviceType::host:
      return host;
    case DeviceType::cuda:
      return cuda;
    case DeviceType::emulated:
      return emulated;
  }
  return host;
}

void raise_peak(std::atomic<std::size_t>& peak, std::size_t value) {
  std::size_t seen = peak.load(std::memory_order_relaxed);
  while (value > seen && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

void count_allocation(DeviceType type, MemoryCategory category, std::size_t bytes) {
  auto& counters = counters_for(type);
  const auto index = static_cast<std::size_t>(category);
  raise_peak(counters.peak[index], counters.current[index].fetch_add(bytes) + bytes);
  raise_peak(counters.total_peak, counters.total_current.fetch_add(bytes) + bytes);
}

void count_release(DeviceType type, MemoryCategory category, std::size_t bytes) {
  auto& counters = counters_for(type);
  counters.current[static_cast<std::size_t>(category)].fetch_sub(bytes);
  counters.total_current.fetch_sub(bytes);
}

}  // namespace

std::string_view memory_category_name(MemoryCategory category) {
  switch (category) {
    case MemoryCategory::parameters:
      return "parameters";
    case MemoryCategory::gradients:
      return "gradients";
    case MemoryCategory::optimizer_states:
      return "optimizer_states";
    case MemoryCategory::activations:
      return "activations";
    case MemoryCategory::comm_buffers:
      return "comm_buffers";
    case MemoryCategory::workspace:
      return "workspace";
    case MemoryCategory::other:
      return "other";
  }
  return "?";
}

MemorySnapshot memory_snapshot(DeviceType type) {
  const auto& counters = counters_for(type);
  MemorySnapshot snapshot;
  for (std::size_t i = 0; i < kMemoryCategoryCount; ++i) {
    snapshot.by_category[i] = {counters.current[i].load(), counters.peak[i].load()};
  }
  snapshot.total = {counters.total_current.load(), counters.total_peak.load()};
  switch (type) {
    case DeviceType::host:
      snapshot.cached = activation_cache().cached_bytes() + detail::cuda_cached_pinned_bytes();
      break;
    case DeviceType::cuda: {
      // The pool holds what live buffers use, what it keeps, and kernels' temporaries in flight.
      const std::size_t reserved = detail::cuda_reserved_device_bytes();
      snapshot.cached = reserved > snapshot.total.current ? reserved - snapshot.total.current : 0;
      break;
    }
    case DeviceType::emulated:
      break;  // every emulated buffer is its own mapping, unmapped when freed
  }
  return snapshot;
}

void release_cached_memory(DeviceType type) {
  switch (type) {
    case DeviceType::host:
      activation_cache().release_all();
      detail::cuda_release_cached_pinned_memory();
      break;
    case DeviceType::cuda:
      detail::cuda_release_cached_device_memory();
      break;
    case DeviceType::emulated:
      break;  // nothing cached (memory_snapshot)
  }
}

void reset_memory_peaks() {
  for (DeviceType type : {DeviceType::host, DeviceType::cuda, DeviceType::emulated}) {
    auto& counters = counters_for(type);
    for (std::size_t i = 0; i < kMemoryCategoryCount; ++i) counters.peak[i].store(counters.current[i].load());
    counters.total_peak.store(counters.total_current.load());
  }
}

Allocator& allocator_for(Device device, HostMemoryKind kind) {
  if (device.is_host()) {
    if (kind == HostMemoryKind::pinned) {
      if (cuda_status().usable()) return detail::cuda_pinned_host_allocator();
      return detail::page_locked_stand_in_allocator();  // what the emulated device's copies see as pinned
    }
    static HostAllocator host;
    return host;
  }
  if (device.is_emulated()) return detail::emulated_device_allocator(device.index);
  return detail::cuda_device_allocator(device.index);
}

namespace {
/// Pageable host activations of a size worth caching go through the caching allocator; host workspace
/// takes no huge pages (kernels/host_memory.hpp).
Allocator& buffer_allocator(Device device, std::size_t bytes, MemoryCategory category, std::size_t alignment,
                            HostMemoryKind kind, const Stream* stream) {
  if (stream != nullptr && stream->device().is_emulated()) {
    ZT_CHECK(!device.is_cuda(), "a buffer on ", device.str(), " ordered on a ", stream->device().str(),
             " stream; expected a stream of its own device");
    // Freed in the emulated stream's order, which CUDA's pinned cache cannot follow.
    if (device.is_host() && kind == HostMemoryKind::pinned) return detail::page_locked_stand_in_allocator();
  }
  if (device.is_host() && kind == HostMemoryKind::pageable && category == MemoryCategory::activations &&
      CachingHostAllocator::caches(bytes, alignment)) {
    return activation_cache();
  }
  if (device.is_host() && kind == HostMemoryKind::pageable && category == MemoryCategory::workspace) {
    static HostAllocator workspace(/*huge_pages=*/false);
    return workspace;
  }
  return allocator_for(device, kind);
}
}  // namespace

namespace {
/// What a stream-ordered free is ordered by: the cudaStream_t, or an emulated stream's queue.
void* stream_handle(const Stream* stream) {
  if (stream == nullptr) return nullptr;
  if (stream->device().is_emulated())
    return reinterpret_cast<void*>(static_cast<std::uintptr_t>(detail::emulated_queue_of(*stream)));
  return stream->native();
}
}  // namespace

Buffer::Buffer(Device device, std::size_t bytes, MemoryCategory category, std::size_t alignment,
               HostMemoryKind kind, const Stream* stream)
    : bytes_(bytes),
      device_(device),
      category_(category),
      allocator_(&buffer_allocator(device, bytes, category, alignment, kind, stream)),
      stream_(stream_handle(stream)) {
  data_ = stream_ != nullptr ? allocator_->allocate_on(bytes, alignment, stream_)
                             : allocator_->allocate(bytes, alignment);
  count_allocation(device_.type, category_, bytes_);
}

Buffer::Buffer(Buffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      device_(other.device_),
      category_(other.category_),
      allocator_(std::exchange(other.allocator_, nullptr)),
      stream_(std::exchange(other.stream_, nullptr)) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    device_ = other.device_;
    category_ = other.category_;
    allocator_ = std::exchange(other.allocator_, nullptr);
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

Buffer::~Buffer() {
  release();
}

void Buffer::release() noexcept {
  if (data_ != nullptr && allocator_ != nullptr) {
    if (stream_ != nullptr) {
      allocator_->deallocate_on(data_, bytes_, stream_);
    } else {
      allocator_->deallocate(data_, bytes_);
    }
    count_release(device_.type, category_, bytes_);
  }
  data_ = nullptr;
  bytes_ = 0;
  stream_ = nullptr;
}

Stream::Stream(Device device) : device_(device) {
  if (device.is_cuda()) native_ = detail::cuda_stream_create(device.index);
  if (device.is_emulated()) emulated_queue_ = detail::emulated_queue_create();
}

Stream::Stream(Stream&& other) noexcept
    : device_(other.device_),
      native_(std::exchange(other.native_, nullptr)),
      emulated_queue_(std::exchange(other.emulated_queue_, 0)) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    if (native_ != nullptr) detail::cuda_stream_destroy(native_);
    detail::emulated_queue_destroy(emulated_queue_);
    device_ = other.device_;
    native_ = std::exchange(other.native_, nullptr);
    emulated_queue_ = std::exchange(other.emulated_queue_, 0);
  }
  return *this;
}

Stream::~Stream() {
  if (native_ != nullptr) detail::cuda_stream_destroy(native_);
  detail::emulated_queue_destroy(emulated_queue_);
}

void Stream::synchronize() const {
  // A CUDA device's default stream has no handle of its own: nullptr is the legacy default stream.
  if (native_ != nullptr || device_.is_cuda()) detail::cuda_stream_synchronize(native_);
  if (emulated_queue_ != 0)
    detail::emulated_run_until(emulated_queue_, detail::emulated_queue_position(emulated_queue_));
}

void Stream::wait(const Event& event) const {
  if (event.emulated_queue_ != 0) {  // queued on an emulated stream; the default stream waits now
    detail::emulated_enqueue_wait(emulated_queue_, event.emulated_queue_, event.emulated_position_);
    return;
  }
  if (event.native() == nullptr) return;  // a host event is always reached
  if (device_.is_cuda()) {
    detail::cuda_stream_wait_event(native_, event.native());
  } else {
    event.synchronize();  // work on this stream runs at once: it may start once the event is reached
  }
}

const Stream& default_stream(Device device) {
  static std::mutex mutex;
  static std::map<std::pair<int, int>, Stream> streams;  // map nodes do not move: references stay valid
  const std::lock_guard lock(mutex);
  const std::pair<int, int> key{static_cast<int>(device.type), device.index};
  auto it = streams.find(key);
  if (it == streams.end()) it = streams.emplace(key, Stream(device, Stream::Unowned{})).first;
  return it->second;
}

Event::Event(Device device) : device_(device) {
  if (device.is_cuda()) native_ = detail::cuda_event_create(device.index);
}

Event::Event(Event&& other) noexcept
    : device_(other.device_),
      native_(std::exchange(other.native_, nullptr)),
      emulated_queue_(std::exchange(other.emulated_queue_, 0)),
      emulated_position_(std::exchange(other.emulated_position_, 0)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (native_ != nullptr) detail::cuda_event_destroy(native_);
    device_ = other.device_;
    native_ = std::exchange(other.native_, nullptr);
    emulated_queue_ = std::exchange(other.emulated_queue_, 0);
    emulated_position_ = std::exchange(other.emulated_position_, 0);
  }
  return *this;
}

Event::~Event() {
  if (native_ != nullptr) detail::cuda_event_destroy(native_);
}

void Event::record(const Stream& stream) {
  const std::uint64_t queue = detail::emulated_queue_of(stream);
  ZT_CHECK((native_ != nullptr || stream.native() == nullptr) && (queue == 0 || device_.is_emulated()),
           "Event::record: a ", device_.str(), " event on a ", stream.device().str(),
           " stream; make the event with Event(", stream.device().str(), ")");
  if (native_ != nullptr) detail::cuda_event_record(native_, stream.native());
  emulated_queue_ = queue;
  emulated_position_ = detail::emulated_queue_position(queue);
}

void Event::synchronize() const {
  if (native_ != nullptr) detail::cuda_event_synchronize(native_);
  detail::emulated_run_until(emulated_queue_, emulated_position_);
}

bool Event::ready() const {
  if (emulated_queue_ != 0) return detail::emulated_reached(emulated_queue_, emulated_position_);
  return native_ == nullptr || detail::cuda_event_query(native_);
}

namespace {

/// copy_bytes with the emulated device on one side, as cudaMemcpyAsync behaves (see
/// kernels/emulated_device.hpp): without a stream after the whole device's work; from pageable host
/// memory the source read now; into pageable host memory done when it returns; else queued.
void copy_on_emulated_stream(void* destination, Device destination_device, const void* source,
                             Device source_device, std::size_t bytes, const Stream* stream) {
  const std::uint64_t queue = stream != nullptr ? detail::emulated_queue_of(*stream) : 0;
  const auto copy_now = [&] {
    const detail::EmulatedDeviceAccess access;
    std::memcpy(destination, source, bytes);
  };
  if (queue == 0) {  // no stream or the default stream: after every stream's work
    detail::emulated_run_all();
    return copy_now();
  }
  if (destination_device.is_host() && !detail::is_page_locked_stand_in(destination)) {
    detail::emulated_run_until(queue, detail::emulated_queue_position(queue));
    return copy_now();
  }
  if (source_device.is_host() && !detail::is_page_locked_stand_in(source)) {
    // Staged at the call: the caller may reuse its pageable buffer once this returns.
    auto staged = std::make_shared<std::vector<std::byte>>(static_cast<const std::byte*>(source),
                                                           static_cast<const std::byte*>(source) + bytes);
    detail::emulated_enqueue(queue, [destination, staged] {
      const detail::EmulatedDeviceAccess access;
      std::memcpy(destination, staged->data(), staged->size());
    });
    return;
  }
  detail::emulated_enqueue(queue, [destination, source, bytes] {
    const detail::EmulatedDeviceAccess access;
    std::memcpy(destination, source, bytes);
  });
}

}  // namespace

void copy_bytes(void* destination, Device destination_device, const void* source, Device source_device,
                std::size_t bytes, const Stream* stream) {
  if (bytes == 0) return;
  ZT_CHECK(destination != nullptr && source != nullptr, "copy_bytes of ", bytes,
           " bytes needs non-null pointers");
  if (destination_device.is_cuda() || source_device.is_cuda()) {
    ZT_CHECK(!destination_device.is_emulated() && !source_device.is_emulated(), "copy_bytes from ",
             source_device.str(), " to ", destination_device.str(),
             ": the emulated device exchanges data with the host only");
    detail::cuda_copy(destination, source, bytes, stream != nullptr ? stream->native() : nullptr);
    return;
  }
  if (destination_device.is_emulated() || source_device.is_emulated()) {
    copy_on_emulated_stream(destination, destination_device, source, source_device, bytes, stream);
    return;
  }
  std::memcpy(destination, source, bytes);
}

void zero_bytes(void* destination, Device device, std::size_t bytes, const Stream* stream) {
  if (bytes == 0) return;
  ZT_CHECK(destination != nullptr, "zero_bytes of ", bytes, " bytes on ", device.str(),
           " needs a non-null pointer");
  switch (device.type) {
    case DeviceType::host:
      std::memset(destination, 0, bytes);
      return;
    case DeviceType::emulated: {
      detail::emulated_enqueue(stream != nullptr ? detail::emulated_queue_of(*stream) : 0,
                               [destination, bytes] {
                                 const detail::EmulatedDeviceAccess access;
                                 std::memset(destination, 0, bytes);
                               });
      return;
    }
    case DeviceType::cuda:
      detail::cuda_zero(destination, bytes, stream != nullptr ? stream->native() : nullptr);
      return;
  }
}

void set_current_device(Device device) {
  if (device.is_cuda()) detail::cuda_set_device(device.index);
}

}  // namespace zt
