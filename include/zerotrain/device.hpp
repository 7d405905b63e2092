// Devices, memory and streams: the host and CUDA behind one interface.
//
// Every buffer zerotrain allocates is a zt::Buffer (RAII) from the allocator of its device. With CUDA
// compiled in but no usable GPU, the CUDA side reports why (cuda_status()) and the host side works.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace zt {

enum class DeviceType { host, cuda };

struct Device {
  DeviceType type = DeviceType::host;
  int index = 0;

  static constexpr Device host() { return {DeviceType::host, 0}; }
  static constexpr Device cuda(int index) { return {DeviceType::cuda, index}; }
  bool is_host() const { return type == DeviceType::host; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  std::string str() const;  // "host" or "cuda:N"
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

/// Make `device` current for this thread (cudaSetDevice); a no-op for the host.
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

/// Bytes held by live Buffers on one kind of device, per category and in total. The total's peak
/// is the peak of the sum (not the sum of the per-category peaks).
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

/// Allocates and frees raw bytes on one device. One allocator per device, process-wide.
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

/// An ordered queue of device work (a cudaStream_t); on the host, work runs at once and
/// synchronize() returns immediately. Move-only; the CUDA stream is destroyed with it.
class Stream {
 public:
  Stream() = default;  // the host stream
  explicit Stream(Device device);
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream();

  Device device() const { return device_; }
  void synchronize() const;
  /// The cudaStream_t as an opaque pointer (nullptr for the host stream).
  void* native() const { return native_; }

 private:
  Device device_{};
  void* native_ = nullptr;
};

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

 private:
  Device device_{};
  void* native_ = nullptr;
};

/// Copy bytes between any two devices; asynchronous on `stream` when a CUDA device is involved.
void copy_bytes(void* destination, Device destination_device, const void* source, Device source_device,
                std::size_t bytes, const Stream* stream = nullptr);

}  // namespace zt
