// Tensors: shapes, owning and non-owning storage, views, fills and dtype conversion.
#include "zerotrain/tensor.hpp"

#include <cstring>
#include <sstream>

#include "base/text.hpp"
#include "kernels/device_backend.hpp"
#include "kernels/nn_kernels.hpp"

namespace zt {

std::string shape_string(const Shape& shape) {
  return base::shape_text(shape);
}

std::int64_t shape_numel(const Shape& shape) {
  std::int64_t count = 1;
  for (std::int64_t extent : shape) {
    ZT_CHECK(extent >= 0, "shape ", shape_string(shape), " has a negative extent");
    count *= extent;
  }
  return count;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device, MemoryCategory category,
                     const Stream* stream) {
  Tensor tensor;
  tensor.shape_ = shape;
  tensor.numel_ = shape_numel(shape);
  tensor.dtype_ = dtype;
  tensor.device_ = device;
  tensor.defined_ = true;
  // Only a stream of the tensor's own device orders its memory (a host tensor copied on a CUDA
  // stream is pageable memory that no stream frees).
  const Stream* ordered_on = stream != nullptr && stream->device() == device ? stream : nullptr;
  tensor.storage_ = std::make_shared<Buffer>(device, tensor.nbytes(), category, kHostAlignment,
                                             HostMemoryKind::pageable, ordered_on);
  tensor.data_ = tensor.storage_->data();
  return tensor;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device, MemoryCategory category) {
  Tensor tensor = empty(shape, dtype, device, category);
  tensor.zero_();
  return tensor;
}

Tensor Tensor::view_of(void* data, const Shape& shape, DType dtype, Device device) {
  Tensor tensor;
  tensor.shape_ = shape;
  tensor.numel_ = shape_numel(shape);
  ZT_CHECK(data != nullptr || tensor.numel_ == 0, "view_of a null pointer with shape ", shape_string(shape),
           ": expected memory for ", tensor.numel_, " elements");
  tensor.dtype_ = dtype;
  tensor.device_ = device;
  tensor.defined_ = true;
  tensor.data_ = data;
  return tensor;
}

std::int64_t Tensor::size(int dim) const {
  const int rank = ndim();
  const int index = dim < 0 ? dim + rank : dim;
  ZT_CHECK(index >= 0 && index < rank, "dimension ", dim, " of a tensor with shape ", shape_string(shape_),
           ": expected -", rank, " <= dim < ", rank);
  return shape_[static_cast<std::size_t>(index)];
}

MemoryCategory Tensor::category() const {
  return storage_ ? storage_->category() : MemoryCategory::other;
}

void Tensor::check_dtype(DType expected) const {
  ZT_CHECK(defined_, "data<", dtype_name(expected), ">() on an undefined tensor");
  ZT_CHECK(dtype_ == expected, "data<", dtype_name(expected), ">() on tensor ", description(),
           ": its dtype is ", dtype_name(dtype_));
}

Tensor Tensor::reshape(const Shape& shape) const {
  ZT_CHECK(defined_, "reshape to ", shape_string(shape), " of an undefined tensor");
  Shape resolved = shape;
  int inferred = -1;
  std::int64_t known = 1;
  for (std::size_t i = 0; i < resolved.size(); ++i) {
    if (resolved[i] == -1) {
      ZT_CHECK(inferred < 0, "reshape to ", shape_string(shape), ": at most one extent may be -1");
      inferred = static_cast<int>(i);
    } else {
      ZT_CHECK(resolved[i] >= 0, "reshape to ", shape_string(shape), ": negative extent");
      known *= resolved[i];
    }
  }
  if (inferred >= 0) {
    ZT_CHECK(known > 0 && numel_ % known == 0, "reshape of ", description(), " to ", shape_string(shape),
             ": ", numel_, " elements do not divide into the known extents");
    resolved[static_cast<std::size_t>(inferred)] = numel_ / known;
  }
  ZT_CHECK(shape_numel(resolved) == numel_, "reshape of ", description(), " to ", shape_string(shape),
           ": expected a shape with ", numel_, " elements");
  Tensor result = *this;
  result.shape_ = std::move(resolved);
  return result;
}

Tensor Tensor::flat_slice(std::int64_t offset, std::int64_t count) const {
  ZT_CHECK(defined_, "flat_slice of an undefined tensor");
  ZT_CHECK(offset >= 0 && count >= 0 && offset + count <= numel_, "flat_slice(", offset, ", ", count, ") of ",
           description(), ": expected 0 <= offset and offset + count <= ", numel_);
  Tensor result = *this;
  result.shape_ = {count};
  result.numel_ = count;
  result.data_ = static_cast<unsigned char*>(data_) + static_cast<std::size_t>(offset) * dtype_size(dtype_);
  return result;
}

namespace {
const Stream& stream_or_default(const Stream* stream, Device device) {
  return stream != nullptr ? *stream : default_stream(device);
}
}  // namespace

void Tensor::zero_(const Stream* stream) {
  ZT_CHECK(defined_, "zero_ of an undefined tensor");
  if (numel_ == 0) return;
  zero_bytes(data_, device_, nbytes(), &stream_or_default(stream, device_));
}

void Tensor::fill_(double value, const Stream* stream) {
  ZT_CHECK(defined_, "fill_ of an undefined tensor");
  kernels::fill(stream_or_default(stream, device_), dtype_, data_, numel_, value);
}

void Tensor::copy_from(const Tensor& source, const Stream* stream) {
  ZT_CHECK(defined_ && source.defined_, "copy_from with an undefined tensor");
  ZT_CHECK(source.numel_ == numel_, "copy_from ", source.description(), " into ", description(),
           ": expected the same number of elements");
  if (source.data_ == data_ && source.dtype_ == dtype_ && source.device_ == device_) return;
  if (source.dtype_ == dtype_) {
    const Device ordered_on = device_.is_host() ? source.device_ : device_;
    copy_bytes(data_, device_, source.data_, source.device_, nbytes(),
               &stream_or_default(stream, ordered_on));
    return;
  }
  ZT_CHECK(device_ == source.device_, "copy_from ", source.description(), " into ", description(),
           ": dtype conversion needs both tensors on the same device");
  kernels::convert(stream_or_default(stream, device_), source.data_, source.dtype_, data_, dtype_, numel_);
}

Tensor Tensor::to(DType dtype, MemoryCategory category, const Stream* stream) const {
  ZT_CHECK(defined_, "to(", dtype_name(dtype), ") of an undefined tensor");
  Tensor result = empty(shape_, dtype, device_, category);
  result.copy_from(*this, stream);
  return result;
}

Tensor Tensor::to(Device device, MemoryCategory category, const Stream* stream) const {
  ZT_CHECK(defined_, "to(", device.str(), ") of an undefined tensor");
  Tensor result = empty(shape_, dtype_, device, category);
  result.copy_from(*this, stream);
  return result;
}

Tensor Tensor::clone(MemoryCategory category, const Stream* stream) const {
  return to(dtype_, category, stream);
}

double Tensor::item_as_double(std::int64_t index, const Stream* stream) const {
  ZT_CHECK(defined_, "item_as_double of an undefined tensor");
  ZT_CHECK(index >= 0 && index < numel_, "item_as_double(", index, ") of ", description());
  ZT_CHECK(stream == nullptr || stream->device() == device_, "item_as_double of ", description(),
           " on a stream of ", stream == nullptr ? std::string() : stream->device().str(),
           "; expected a stream of the tensor's device (the one that wrote it)");
  const std::size_t size = dtype_size(dtype_);
  alignas(8) unsigned char element[8];
  const void* source = static_cast<const unsigned char*>(data_) + index * size;
  if (stream != nullptr) {
    copy_bytes(element, Device::host(), source, device_, size, stream);
    stream->synchronize();
  } else {
    // Which stream wrote the element is unknown: on a GPU wait for all of them, then copy.
    if (device_.is_cuda()) detail::cuda_device_synchronize(device_.index);
    copy_bytes(element, Device::host(), source, device_, size);
  }
  const Stream& host = default_stream(Device::host());
  if (dtype_is_floating(dtype_)) {
    double value = 0;
    kernels::convert(host, element, dtype_, &value, DType::fp64, 1);
    return value;
  }
  std::int64_t integer = 0;
  kernels::convert(host, element, dtype_, &integer, DType::int64, 1);
  return static_cast<double>(integer);
}

std::string Tensor::description() const {
  if (!defined_) return "undefined tensor";
  return std::string(dtype_name(dtype_)) + shape_string(shape_) + " on " + device_.str();
}

}  // namespace zt
