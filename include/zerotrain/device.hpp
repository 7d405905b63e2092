// Devices, memory and streams: the host, CUDA and an emulated device behind one interface.
//
// Every buffer zerotrain allocates is a zt::Buffer (RAII) from the allocator of its device. With CUDA
// compiled in but no usable GPU, the CUDA side reports why (cuda_status()) and the host side works.
//
// The emulated device (Device::emulated()) is a stand-in device for testing device code paths
// without a GPU (slow: every kernel call toggles page protection). Its memory is host memory that
// only the device API may touch: each buffer is its own page-rounded mmap'ed region, kept
// PROT_NONE except while a kernel, copy_bytes, zero_bytes or a collective of an emulated-device
// communicator works on it. Code that reads or writes emulated memory any other way (a raw
// pointer dereference, a memcpy, a Tensor::data<T>() loop) is killed by SIGSEGV, reported as "host
// access to emulated device memory" with the address: a host-only path in device code cannot go
// unnoticed. Addresses are never reused, so a stale pointer faults too, and a PROT_NONE page between
// buffers catches overruns. Kernels run the host kernels. Its streams queue their work as a GPU's
// do, and run it only when the host needs it done (a synchronize, a stream waiting for an event, a
// stream-less copy or free, a collective): work read through another stream without an event
// between them has not run yet, so a missing wait shows every time (kernels/emulated_device.hpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace zt {

enum class DeviceType { host, cuda, emulated };

struct Device {
  DeviceType type = DeviceType::host;
  int index = 0;

  static constexpr Device host() { return {DeviceType::host, 0}; }
  static constexpr Device cuda(int index) { return {DeviceType::cuda, index}; }
  /// The test device (see the top of this header): host kernels on protected host memory.
  static constexpr Device emulated(int index = 0) { return {DeviceType::emulated, index}; }
  bool is_host() const { return type == DeviceType::host; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  bool is_emulated() const { return type == DeviceType::emulated; }
  std::string str() const;  // "host", "cuda:N" or "emulated:N"
  friend bool operator==(const Device&, const Device&) = default;
};

/// What the CUDA runtime says about this process; computed once.
struct CudaStatus {
  bool compiled = false;  // built with ZT_WITH_CUDA
  int device_count = 0;   // devices this process sees (after CUDA_VISIBLE_DEVICES)
  int runtime_version = 0;
  int driver_version = 0;
  std::string reason;  // why no device is usable, empty when one is
  bool usable() const { return compiled && device_count > 0; }
};
const CudaStatus& cuda_status();

/// A device's memory as its driver reports it now (cudaMemGetInfo): `free` for new allocations
/// (what other processes, and this process's pools, hold is not), `total` the device's size. Both 0
/// where no size is known: the host and the emulated device. Throws for a CUDA device that is not
/// usable.
struct DeviceMemoryInfo {
  std::uint64_t free = 0;
  std::uint64_t total = 0;
};
DeviceMemoryInfo device_memory_info(Device device);

/// Make `device` current for this thread (cudaSetDevice); a no-op for the host and the emulated device.
void set_current_device(Device device);

/// Alignment of host buffers by default, and of buffers that may go through O_DIRECT I/O.
inline constexpr std::size_t kHostAlignment = 64;
inline constexpr std::size_t kDirectIoAlignment = 4096;

/// How host memory is obtained: plain aligned pages, or page-locked (pinned) for fast async copies.
enum class HostMemoryKind { pageable, pinned };

/// What an allocation is for. Every Buffer is counted under one category, so that memory per rank
/// can be compared with the ZeRO formulas (parameters, gradients, optimizer states) and the rest.
enum class MemoryCategory : std::uint8_t {
  parameters,
  gradients,
  optimizer_states,
  activations,
  comm_buffers,
  /// A kernel's temporaries for one call: the bf16 GEMMs' oneDNN scratchpads and the 16-bit GEMMs'
  /// fp32 copies (the LM head's are tens of MiB at a GPT-2 vocabulary).
  workspace,
  other,
};
inline constexpr std::size_t kMemoryCategoryCount = 7;
std::string_view memory_category_name(MemoryCategory category);

struct MemoryUsage {
  std::size_t current = 0;
  std::size_t peak = 0;
};

/// Bytes held by live Buffers on one kind of device, per category and in total (host, CUDA and
/// emulated buffers are counted apart). The total's peak is the peak of the sum (not the sum of the
/// per-category peaks).
struct MemorySnapshot {
  std::array<MemoryUsage, kMemoryCategoryCount> by_category{};
  MemoryUsage total{};
  /// What the caching allocators keep for reuse on top of total.current: freed by buffers, not given
  /// back to the system (on a GPU: CUDA's stream-ordered pool, kernels' temporaries in flight
  /// included; on the host: the pinned-staging and activation caches). total.current + cached is
  /// what this kind of memory holds now (docs/gpu.md, "Device memory and device choice").
  std::size_t cached = 0;
  const MemoryUsage& operator[](MemoryCategory category) const {
    return by_category[static_cast<std::size_t>(category)];
  }
};
MemorySnapshot memory_snapshot(DeviceType type);
/// Gives what the caching allocators keep for reuse (MemorySnapshot::cached) back to the system, as
/// torch.cuda.empty_cache does: on CUDA, the stream-ordered pools' unused memory, once the device has
/// done the work queued so far (this waits for it); on the host, the activation and pinned caches.
/// Live buffers are untouched. For after a phase whose large temporaries the rest of the run will
/// not reuse, so that other allocations (another library's, another process's) can have the memory.
void release_cached_memory(DeviceType type);
/// Restart peak tracking from the current values (e.g. after initialization, before training).
void reset_memory_peaks();

/// Allocates and frees raw bytes on one device. One allocator per device, process-wide. The emulated
/// device's hands out page-aligned regions (any alignment up to the page size).
///
/// The CUDA allocators cache what is freed (docs/gpu.md, "Device memory and device choice"), and a
/// free never races with kernels still using the memory: without a stream, deallocate() waits for
/// the device's queued work (as cudaFree and cudaFreeHost do) before the block may be reused; with a
/// stream (allocate_on/deallocate_on: a cudaStream_t from Stream::native(), or an emulated stream's
/// queue, which the emulated device's and the page-locked stand-in's allocators follow), the memory is usable
/// by work queued on that stream after the allocation, and reused only after the work queued on it before the
/// free (cudaMallocFromPoolAsync/cudaFreeAsync semantics): work on other streams that uses it must be ordered
/// before the free through events (Stream::wait).
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(std::size_t bytes, std::size_t alignment) = 0;
  virtual void deallocate(void* pointer, std::size_t bytes) noexcept = 0;
  virtual Device device() const = 0;
  /// Stream-ordered allocate and free (see above); allocators without streams ignore `stream`.
  virtual void* allocate_on(std::size_t bytes, std::size_t alignment, void* stream) {
    (void)stream;
    return allocate(bytes, alignment);
  }
  virtual void deallocate_on(void* pointer, std::size_t bytes, void* stream) noexcept {
    (void)stream;
    deallocate(pointer, bytes);
  }
};
Allocator& allocator_for(Device device, HostMemoryKind kind = HostMemoryKind::pageable);

class Stream;

/// An owned, aligned, untyped block of bytes on one device, counted under a memory category.
/// Move-only. The contents are uninitialized.
class Buffer {
 public:
  Buffer() = default;
  /// With `stream` (a CUDA or emulated stream: device memory, or pinned host memory for copies on it), the
  /// buffer is allocated and freed in the stream's order (Allocator::allocate_on): the hot path's
  /// temporaries, without a device-wide wait at the free. The stream must outlive the buffer.
  Buffer(Device device, std::size_t bytes, MemoryCategory category = MemoryCategory::other,
         std::size_t alignment = kHostAlignment, HostMemoryKind kind = HostMemoryKind::pageable,
         const Stream* stream = nullptr);
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  void* data() { return data_; }
  const void* data() const { return data_; }
  template <typename T>
  T* as() {
    return static_cast<T*>(data_);
  }
  template <typename T>
  const T* as() const {
    return static_cast<const T*>(data_);
  }
  std::size_t size() const { return bytes_; }
  Device device() const { return device_; }
  MemoryCategory category() const { return category_; }
  bool empty() const { return bytes_ == 0; }

 private:
  void release() noexcept;

  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  Device device_{};
  MemoryCategory category_ = MemoryCategory::other;
  Allocator* allocator_ = nullptr;
  void* stream_ = nullptr;  // the cudaStream_t it is freed on, nullptr: a free that waits for the device
};

class Event;
class Stream;
namespace detail {
std::uint64_t emulated_queue_of(const Stream& stream);  // kernels/emulated_device.hpp
}

/// An ordered queue of device work (a cudaStream_t); on the host work runs at once and synchronize()
/// returns immediately; on the emulated device work is queued until the host needs it done (see the
/// top). Move-only; the CUDA stream is destroyed with it, an emulated one runs its work first.
class Stream {
 public:
  Stream() = default;  // the host stream
  /// A new stream: a non-blocking cudaStream_t on a CUDA device (it does not order against the
  /// legacy default stream), a queue on the emulated device, a stream that runs work at once on the
  /// host.
  explicit Stream(Device device);
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream();

  Device device() const { return device_; }
  void synchronize() const;
  /// Work queued on this stream from now on waits until `event` is reached (cudaStreamWaitEvent; on
  /// the emulated device the event's work runs before this stream's next item); streams that run
  /// work at once (the host's, default streams of the emulated device) block until then instead.
  void wait(const Event& event) const;
  /// The cudaStream_t as an opaque pointer (nullptr for the host and emulated streams, and for a
  /// CUDA device's legacy default stream).
  void* native() const { return native_; }

 private:
  friend const Stream& default_stream(Device device);
  friend std::uint64_t detail::emulated_queue_of(const Stream& stream);
  struct Unowned {};
  Stream(Device device, Unowned) : device_(device) {}  // a default stream: nothing to create

  Device device_{};
  void* native_ = nullptr;
  std::uint64_t emulated_queue_ = 0;  // an emulated stream's queue; 0: work runs at once
};

/// The stream for callers without an execution context (tests, benchmarks, conveniences such as
/// Tensor::zero_()): the host stream, the emulated device's stream, or a CUDA device's legacy
/// default stream (stream 0; copies on it are synchronous, its synchronize() waits for it, and it
/// does not order against the non-blocking streams of Stream(device): engine code runs on an
/// ExecutionContext's streams).
/// Process-wide; never destroyed.
const Stream& default_stream(Device device);

/// A point in a stream's work (a cudaEvent_t, without timing): record() marks the work queued so far,
/// synchronize() waits for it (on the emulated device: runs it), ready() polls. Work on the host
/// stream runs at once, so a host event is always reached. Move-only; the CUDA event is destroyed
/// with it.
class Event {
 public:
  Event() = default;  // a host event
  explicit Event(Device device);
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event();

  /// The device whose streams it is recorded on (host for a host event).
  Device device() const { return device_; }
  void record(const Stream& stream);
  void synchronize() const;
  bool ready() const;
  /// The cudaEvent_t as an opaque pointer (nullptr for host and emulated events).
  void* native() const { return native_; }

 private:
  friend class Stream;
  Device device_{};
  void* native_ = nullptr;
  std::uint64_t emulated_queue_ = 0;     // where an emulated event was recorded (0: reached)
  std::uint64_t emulated_position_ = 0;  // how much of that queue's work it marks
};

/// Copy bytes between any two devices; asynchronous on `stream` when a CUDA or emulated device is
/// involved (without one, or on the emulated default stream: synchronous, after the work queued on
/// the device's every stream, as Tensor::item_as_double). As cudaMemcpyAsync, a copy from pageable
/// host memory reads its source before it returns and one into pageable host memory returns done;
/// page-locked memory (HostMemoryKind::pinned) is read or written when the stream runs the copy.
/// Emulated memory is copied inside the device API's access; a copy between a CUDA device and the
/// emulated device is an error.
void copy_bytes(void* destination, Device destination_device, const void* source, Device source_device,
                std::size_t bytes, const Stream* stream = nullptr);

/// Set `bytes` bytes at `destination` on `device` to zero; asynchronous on `stream` on a CUDA or
/// emulated device (cudaMemsetAsync; without a stream: synchronous, after the work queued on the
/// device's every stream).
void zero_bytes(void* destination, Device device, std::size_t bytes, const Stream* stream = nullptr);

}  // namespace zt
