// Tensors: a contiguous block of elements with a shape, a dtype and a device.
//
// A Tensor is a cheap handle (copying it shares the memory, like a shared_ptr). It either owns its
// memory through a zt::Buffer, which is counted under a MemoryCategory, or views memory that belongs
// to someone else (view_of): a flat parameter buffer, a user's own model arrays. Views made with
// reshape() and flat_slice() keep the owning buffer alive. There are no strides: every tensor is
// row-major and contiguous, so a flat slice of a flat buffer is again a tensor.
//
// Fills, copies and conversions work on any device through the device API (kernels and
// copy_bytes), ordered on `stream` when one is given, else on default_stream() of the tensor's
// device, and then, on a CUDA device, waited for (the legacy default stream does not order against
// an execution context's non-blocking streams). raw_data() and data<T>() are pointers into the
// tensor's device memory: dereference them on the host only for host tensors (emulated memory
// faults outside the device API, device.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "zerotrain/device.hpp"
#include "zerotrain/dtype.hpp"
#include "zerotrain/error.hpp"

namespace zt {

using Shape = std::vector<std::int64_t>;

/// "[2, 3, 4]"
std::string shape_string(const Shape& shape);
/// Product of the extents (1 for a scalar shape {}); throws on a negative extent.
std::int64_t shape_numel(const Shape& shape);

class Tensor {
 public:
  /// An undefined tensor (no memory, defined() is false).
  Tensor() = default;

  /// Uninitialized memory on `device`, counted under `category`. With `stream` (a stream of
  /// `device`), allocated and freed in that stream's order (zt::Buffer): on a GPU, no device-wide
  /// wait when the tensor's memory is freed; a stream of another device, the host's or the emulated
  /// device's changes nothing.
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::host(),
                      MemoryCategory category = MemoryCategory::other, const Stream* stream = nullptr);
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::host(),
                      MemoryCategory category = MemoryCategory::other);
  /// A non-owning view of `numel(shape)` elements at `data`; the caller keeps the memory alive.
  static Tensor view_of(void* data, const Shape& shape, DType dtype, Device device = Device::host());
  /// A host tensor holding a copy of `values` (tests, small constants).
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape,
                            MemoryCategory category = MemoryCategory::other);

  bool defined() const { return defined_; }
  const Shape& shape() const { return shape_; }
  /// Extent of dimension `dim`; negative counts from the end (-1 is the last).
  std::int64_t size(int dim) const;
  int ndim() const { return static_cast<int>(shape_.size()); }
  std::int64_t numel() const { return numel_; }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel_) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  /// True when this tensor (or the tensor it is a view of) owns a Buffer; false for view_of().
  bool owns_memory() const { return storage_ != nullptr; }
  /// Category of the owning buffer; `other` for external views.
  MemoryCategory category() const;

  void* raw_data() { return data_; }
  const void* raw_data() const { return data_; }
  /// Typed access; throws naming the expected and actual dtype when T does not match.
  template <typename T>
  T* data() {
    check_dtype(dtype_of_v<T>);
    return static_cast<T*>(data_);
  }
  template <typename T>
  const T* data() const {
    check_dtype(dtype_of_v<T>);
    return static_cast<const T*>(data_);
  }

  /// Same memory, another shape with the same element count. One extent may be -1 (inferred).
  Tensor reshape(const Shape& shape) const;
  Tensor view(const Shape& shape) const { return reshape(shape); }
  /// A 1-D view of elements [offset, offset + count) of the flattened tensor.
  Tensor flat_slice(std::int64_t offset, std::int64_t count) const;

  // `stream` (optional): where the work is ordered; nullptr: default_stream() of the tensor's
  // device (for a copy between the host and a device: of the device).

  /// Set every element to zero (all dtypes: zero bits are zero).
  void zero_(const Stream* stream = nullptr);
  /// Fill with `value`, converted to the dtype.
  void fill_(double value, const Stream* stream = nullptr);
  /// Copy `source` into this tensor: same element count (shapes may differ), any device pair when the
  /// dtypes match, and conversion between floating dtypes on one device.
  void copy_from(const Tensor& source, const Stream* stream = nullptr);
  /// A new tensor of `dtype` on this tensor's device holding its values (a copy even when the dtype
  /// matches).
  Tensor to(DType dtype, MemoryCategory category = MemoryCategory::other,
            const Stream* stream = nullptr) const;
  /// A copy on `device` with the same dtype (a copy even when the device matches).
  Tensor to(Device device, MemoryCategory category = MemoryCategory::other,
            const Stream* stream = nullptr) const;
  /// A deep copy with the same dtype and device.
  Tensor clone(MemoryCategory category = MemoryCategory::other, const Stream* stream = nullptr) const;

  /// Element `index` of the flattened tensor as a double (floating/integer tensors; tests). A read
  /// for the host, so it waits for the work that produced the element: with `stream` (one of the
  /// tensor's device, the stream that wrote it), the copy is queued there and the host waits for
  /// that stream; without one, on a CUDA device the host first waits for the whole device (every
  /// stream: the legacy default stream alone does not order against non-blocking streams).
  double item_as_double(std::int64_t index = 0, const Stream* stream = nullptr) const;
  /// "fp32[2, 3] on host"
  std::string description() const;

 private:
  void check_dtype(DType expected) const;

  std::shared_ptr<Buffer> storage_;  // null for external views
  void* data_ = nullptr;
  Shape shape_;
  std::int64_t numel_ = 0;
  DType dtype_ = DType::fp32;
  bool defined_ = false;  // distinguishes an undefined tensor from one with zero elements
  Device device_ = Device::host();
};

template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape, MemoryCategory category) {
  ZT_CHECK(static_cast<std::int64_t>(values.size()) == shape_numel(shape), "from_vector got ", values.size(),
           " values for shape ", shape_string(shape), " (", shape_numel(shape), " elements)");
  Tensor tensor = empty(shape, dtype_of_v<T>, Device::host(), category);
  T* out = tensor.data<T>();
  for (std::size_t i = 0; i < values.size(); ++i) out[i] = values[i];
  return tensor;
}

}  // namespace zt
