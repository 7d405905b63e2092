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
// buffers catches overruns. Kernels run the host kernels; streams and events run work at once, as
// on the host.
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
  other,
};
inline constexpr std::size_t kMemoryCategoryCount = 6;
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
  const MemoryUsage& operator[](MemoryCategory category) const {
    return by_category[static_cast<std::size_t>(category)];
  }
};
MemorySnapshot memory_snapshot(DeviceType type);
/// Restart peak tracking from the current values (e.g. after initialization, before training).
void reset_memory_peaks();

/// Allocates and frees raw bytes on one device. One allocator per device, process-wide. The emulated
/// device's hands out page-aligned regions (any alignment up to the page size).
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(std::size_t bytes, std::size_t alignment) = 0;
  virtual void deallocate(void* pointer, std::size_t bytes) noexcept = 0;
  virtual Device device() const = 0;
};
Allocator& allocator_for(Device device, HostMemoryKind kind = HostMemoryKind::pageable);

/// An owned, aligned, untyped block of bytes on one device, counted under a memory category.
/// Move-only. The contents are uninitialized.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Device device, std::size_t bytes, MemoryCategory category = MemoryCategory::other,
         std::size_t alignment = kHostAlignment, HostMemoryKind kind = HostMemoryKind::pageable);
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
};

class Event;

/// An ordered queue of device work (a cudaStream_t); on the host and the emulated device, work runs
/// at once and synchronize() returns immediately. Move-only; the CUDA stream is destroyed with it.
class Stream {
 public:
  Stream() = default;  // the host stream
  /// A new stream: a non-blocking cudaStream_t on a CUDA device (it does not order against the
  /// legacy default stream), a stream that runs work at once on the host and the emulated device.
  explicit Stream(Device device);
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream();

  Device device() const { return device_; }
  void synchronize() const;
  /// Work queued on this stream from now on waits until `event` is reached (cudaStreamWaitEvent);
  /// the host and emulated streams run work at once, so they block until then instead.
  void wait(const Event& event) const;
  /// The cudaStream_t as an opaque pointer (nullptr for the host and emulated streams, and for a
  /// CUDA device's legacy default stream).
  void* native() const { return native_; }

 private:
  friend const Stream& default_stream(Device device);
  struct Unowned {};
  Stream(Device device, Unowned) : device_(device) {}  // a default stream: nothing to create

  Device device_{};
  void* native_ = nullptr;
};

/// The stream for callers without an execution context (tests, benchmarks, conveniences such as
/// Tensor::zero_()): the host stream, the emulated device's stream, or a CUDA device's legacy
/// default stream (stream 0; copies on it are synchronous, and it does not order against the
/// non-blocking streams of Stream(device): engine code runs on an ExecutionContext's streams).
/// Process-wide; never destroyed.
const Stream& default_stream(Device device);

/// A point in a stream's work (a cudaEvent_t, without timing): record() marks the work queued so far,
/// synchronize() waits for it, ready() polls. Work on the host stream runs at once, so a host event
/// is always reached. Move-only; the CUDA event is destroyed with it.
class Event {
 public:
  Event() = default;  // a host event
  explicit Event(Device device);
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event();

  void record(const Stream& stream);
  void synchronize() const;
  bool ready() const;
  /// The cudaEvent_t as an opaque pointer (nullptr for host and emulated events).
  void* native() const { return native_; }

 private:
  Device device_{};
  void* native_ = nullptr;
};

/// Copy bytes between any two devices; asynchronous on `stream` when a CUDA device is involved
/// (synchronous without a stream). Emulated memory is copied inside the device API's access; a copy
/// between a CUDA device and the emulated device is an error.
void copy_bytes(void* destination, Device destination_device, const void* source, Device source_device,
                std::size_t bytes, const Stream* stream = nullptr);

/// Set `bytes` bytes at `destination` on `device` to zero; asynchronous on `stream` on a CUDA device
/// (cudaMemsetAsync; synchronous without a stream).
void zero_bytes(void* destination, Device device, std::size_t bytes, const Stream* stream = nullptr);

}  // namespace zt
