// Host side of the device layer: aligned host allocation, buffers, streams and copies. The CUDA
// side lives in kernels/cuda/device_cuda.cpp; without CUDA the cuda entry points below explain why
// they cannot work.
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "kernels/device_backend.hpp"
#include "zerotrain/build_info.hpp"
#include "zerotrain/device.hpp"
#include "zerotrain/error.hpp"

namespace zt {

const CudaStatus& cuda_status() {
  static const CudaStatus status = detail::query_cuda_status();
  return status;
}

std::string Device::str() const {
  return is_host() ? std::string("host") : "cuda:" + std::to_string(index);
}

namespace {

class HostAllocator final : public Allocator {
 public:
  void* allocate(std::size_t bytes, std::size_t alignment) override {
    ZT_CHECK(alignment != 0 && (alignment & (alignment - 1)) == 0, "alignment must be a power of two, got ",
             alignment);
    // aligned_alloc wants a size that is a multiple of the alignment.
    const std::size_t rounded = (bytes + alignment - 1) / alignment * alignment;
    void* pointer = std::aligned_alloc(alignment, rounded == 0 ? alignment : rounded);
    if (pointer == nullptr) {
      ZT_THROW("out of host memory: could not allocate ", bytes, " bytes aligned to ", alignment);
    }
    return pointer;
  }
  void deallocate(void* pointer, std::size_t) noexcept override { std::free(pointer); }
  Device device() const override { return Device::host(); }
};

}  // namespace

Allocator& allocator_for(Device device, HostMemoryKind kind) {
  if (device.is_host()) {
    if (kind == HostMemoryKind::pinned && cuda_status().usable()) return detail::cuda_pinned_host_allocator();
    static HostAllocator host;
    return host;
  }
  return detail::cuda_device_allocator(device.index);
}

Buffer::Buffer(Device device, std::size_t bytes, std::size_t alignment, HostMemoryKind kind)
    : bytes_(bytes), device_(device), allocator_(&allocator_for(device, kind)) {
  data_ = allocator_->allocate(bytes, alignment);
}

Buffer::Buffer(Buffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      device_(other.device_),
      allocator_(std::exchange(other.allocator_, nullptr)) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    device_ = other.device_;
    allocator_ = std::exchange(other.allocator_, nullptr);
  }
  return *this;
}

Buffer::~Buffer() {
  release();
}

void Buffer::release() noexcept {
  if (data_ != nullptr && allocator_ != nullptr) allocator_->deallocate(data_, bytes_);
  data_ = nullptr;
  bytes_ = 0;
}

Stream::Stream(Device device) : device_(device) {
  if (device.is_cuda()) native_ = detail::cuda_stream_create(device.index);
}

Stream::Stream(Stream&& other) noexcept
    : device_(other.device_), native_(std::exchange(other.native_, nullptr)) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    if (native_ != nullptr) detail::cuda_stream_destroy(native_);
    device_ = other.device_;
    native_ = std::exchange(other.native_, nullptr);
  }
  return *this;
}

Stream::~Stream() {
  if (native_ != nullptr) detail::cuda_stream_destroy(native_);
}

void Stream::synchronize() const {
  if (native_ != nullptr) detail::cuda_stream_synchronize(native_);
}

void copy_bytes(void* destination, Device destination_device, const void* source, Device source_device,
                std::size_t bytes, const Stream* stream) {
  if (bytes == 0) return;
  ZT_CHECK(destination != nullptr && source != nullptr, "copy_bytes of ", bytes,
           " bytes needs non-null pointers");
  if (destination_device.is_host() && source_device.is_host()) {
    std::memcpy(destination, source, bytes);
    return;
  }
  detail::cuda_copy(destination, source, bytes, stream != nullptr ? stream->native() : nullptr);
}

void set_current_device(Device device) {
  if (device.is_cuda()) detail::cuda_set_device(device.index);
}

}  // namespace zt
