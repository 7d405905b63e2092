// Tensors: allocation and memory accounting, views and slices, dtype conversion, errors.
#include <gtest/gtest.h>

#include "test_helpers.hpp"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "zerotrain/device.hpp"
#include "zerotrain/tensor.hpp"

namespace {

using zt::testing::error_of;

using zt::DType;
using zt::MemoryCategory;
using zt::Tensor;

std::size_t current_bytes(MemoryCategory category) {
  return zt::memory_snapshot(zt::DeviceType::host)[category].current;
}

TEST(Tensor, EmptyAndZerosHaveShapeDtypeAndAlignment) {
  Tensor t = Tensor::empty({2, 3, 4}, DType::bf16);
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 48u);
  EXPECT_EQ(t.ndim(), 3);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.size(0), 2);
  EXPECT_EQ(t.dtype(), DType::bf16);
  EXPECT_TRUE(t.device().is_host());
  EXPECT_TRUE(t.owns_memory());
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.raw_data()) % zt::kHostAlignment, 0u);
  EXPECT_EQ(t.description(), "bf16[2, 3, 4] on host");

  Tensor z = Tensor::zeros({5}, DType::fp64);
  for (std::int64_t i = 0; i < 5; ++i) EXPECT_EQ(z.data<double>()[i], 0.0);
  Tensor scalar = Tensor::zeros({}, DType::fp32);
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_FALSE(Tensor().defined());
}

TEST(Tensor, MemoryIsAccountedByCategoryAndReleasedWithTheLastHandle) {
  const std::size_t parameters_before = current_bytes(MemoryCategory::parameters);
  const std::size_t gradients_before = current_bytes(MemoryCategory::gradients);
  {
    Tensor weights = Tensor::empty({1000}, DType::fp32, zt::Device::host(), MemoryCategory::parameters);
    Tensor grads = Tensor::zeros({500}, DType::fp64, zt::Device::host(), MemoryCategory::gradients);
    EXPECT_EQ(current_bytes(MemoryCategory::parameters), parameters_before + 4000);
    EXPECT_EQ(current_bytes(MemoryCategory::gradients), gradients_before + 4000);
    EXPECT_EQ(weights.category(), MemoryCategory::parameters);
    // A view shares the buffer: no new bytes, and it keeps the buffer alive.
    Tensor slice = weights.flat_slice(10, 20);
    EXPECT_EQ(slice.category(), MemoryCategory::parameters);
    weights = Tensor();
    EXPECT_EQ(current_bytes(MemoryCategory::parameters), parameters_before + 4000);
    slice = Tensor();
    EXPECT_EQ(current_bytes(MemoryCategory::parameters), parameters_before);
    // An external view is not counted.
    std::vector<float> external(100);
    Tensor view = Tensor::view_of(external.data(), {10, 10}, DType::fp32);
    EXPECT_FALSE(view.owns_memory());
    EXPECT_EQ(current_bytes(MemoryCategory::parameters), parameters_before);
  }
  EXPECT_EQ(current_bytes(MemoryCategory::gradients), gradients_before);
}

TEST(Tensor, AStreamOnTheHostOrTheEmulatedDeviceChangesNothing) {
  // Tensor::empty with a stream (what ExecutionContext passes, its compute stream) allocates and
  // frees as without one where streams have no native handle; a stream of another device is ignored.
  for (const zt::Device device : {zt::Device::host(), zt::Device::emulated()}) {
    const zt::Stream stream(device);
    const zt::Stream other_device_stream(device.is_host() ? zt::Device::emulated() : zt::Device::host());
    const std::size_t before = zt::memory_snapshot(device.type)[MemoryCategory::activations].current;
    {
      Tensor ordered = Tensor::empty({5}, DType::fp32, device, MemoryCategory::activations, &stream);
      Tensor other =
          Tensor::empty({3}, DType::fp32, device, MemoryCategory::activations, &other_device_stream);
      EXPECT_EQ(ordered.device(), device);
      EXPECT_EQ(zt::memory_snapshot(device.type)[MemoryCategory::activations].current,
                before + 8 * sizeof(float))
          << device.str();
      ordered.fill_(1.5, &stream);
      other.copy_from(ordered.flat_slice(0, 3), &stream);
      EXPECT_EQ(other.item_as_double(2), 1.5) << device.str();
    }
    EXPECT_EQ(zt::memory_snapshot(device.type)[MemoryCategory::activations].current, before) << device.str();
  }
}

TEST(Tensor, ViewOfExternalMemoryReadsAndWritesIt) {
  std::vector<float> flat(12, 0.0f);
  Tensor view = Tensor::view_of(flat.data(), {3, 4}, DType::fp32);
  view.data<float>()[5] = 2.5f;
  EXPECT_EQ(flat[5], 2.5f);
  view.fill_(1.0);
  EXPECT_EQ(flat[11], 1.0f);
  view.zero_();
  EXPECT_EQ(flat[0], 0.0f);
}

TEST(Tensor, FlatSlicesPartitionAFlatBuffer) {
  // The ZeRO layout: every parameter is a view into one flat buffer.
  Tensor flat = Tensor::zeros({10}, DType::fp32, zt::Device::host(), MemoryCategory::parameters);
  Tensor first = flat.flat_slice(0, 6).reshape({2, 3});
  Tensor second = flat.flat_slice(6, 4).reshape({2, -1});
  EXPECT_EQ(second.shape(), (zt::Shape{2, 2}));
  first.fill_(1.0);
  second.fill_(2.0);
  const float* values = flat.data<float>();
  for (int i = 0; i < 6; ++i) EXPECT_EQ(values[i], 1.0f);
  for (int i = 6; i < 10; ++i) EXPECT_EQ(values[i], 2.0f);
  EXPECT_EQ(second.raw_data(), static_cast<void*>(flat.data<float>() + 6));
  // Slices of slices.
  EXPECT_EQ(flat.flat_slice(2, 8).flat_slice(3, 2).raw_data(), static_cast<void*>(flat.data<float>() + 5));
}

TEST(Tensor, ReshapeSharesMemory) {
  Tensor t = Tensor::zeros({4, 6}, DType::fp32);
  Tensor r = t.reshape({2, -1, 3});
  EXPECT_EQ(r.shape(), (zt::Shape{2, 4, 3}));
  EXPECT_EQ(r.raw_data(), t.raw_data());
  EXPECT_EQ(t.view({24}).numel(), 24);
}

TEST(Tensor, CopyAndConvertBetweenFloatingDtypes) {
  const std::vector<float> values{0.0f, 1.0f, -2.5f, 3.140625f, 1e-3f, 65504.0f, -0.1f};
  const Tensor source = Tensor::from_vector(values, {7});
  for (DType dtype : {DType::fp64, DType::bf16, DType::fp16, DType::fp32}) {
    const Tensor converted = source.to(dtype);
    EXPECT_EQ(converted.dtype(), dtype);
    const Tensor back = converted.to(DType::fp32);
    for (std::size_t i = 0; i < values.size(); ++i) {
      float expected = values[i];
      if (dtype == DType::bf16) expected = static_cast<float>(zt::bf16(values[i]));
      if (dtype == DType::fp16) expected = static_cast<float>(zt::fp16(values[i]));
      EXPECT_EQ(back.data<float>()[i], expected) << zt::dtype_name(dtype) << " element " << i;
    }
  }
  // fp64 -> fp32 rounds once; copy_from accepts another shape with the same element count.
  Tensor doubles = Tensor::from_vector<double>({1.0 / 3.0, 2.0, 3.0, 4.0}, {2, 2});
  Tensor floats = Tensor::empty({4}, DType::fp32);
  floats.copy_from(doubles);
  EXPECT_EQ(floats.data<float>()[0], static_cast<float>(1.0 / 3.0));
  EXPECT_EQ(floats.item_as_double(3), 4.0);
  // clone is a deep copy.
  Tensor copy = floats.clone();
  copy.data<float>()[1] = 9.0f;
  EXPECT_EQ(floats.data<float>()[1], 2.0f);
  // Integer tensors copy between themselves.
  Tensor ints = Tensor::from_vector<std::int32_t>({1, -2, 3}, {3});
  EXPECT_EQ(ints.to(DType::int64).data<std::int64_t>()[1], -2);
  EXPECT_EQ(ints.item_as_double(2), 3.0);
}

TEST(Tensor, FillCopyAndConvertRoundTripThroughTheEmulatedDevice) {
  const zt::Device emulated = zt::Device::emulated();
  const std::vector<float> values{0.0f, 1.0f, -2.5f, 3.140625f, 1e-3f, 65504.0f, -0.1f};
  const Tensor source = Tensor::from_vector(values, {7});
  const std::size_t emulated_before = zt::memory_snapshot(zt::DeviceType::emulated).total.current;
  const std::size_t host_before = zt::memory_snapshot(zt::DeviceType::host).total.current;
  const Tensor on_device = source.to(emulated, MemoryCategory::activations);
  EXPECT_EQ(on_device.device(), emulated);
  EXPECT_EQ(on_device.description(), "fp32[7] on emulated:0");
  EXPECT_EQ(zt::memory_snapshot(zt::DeviceType::emulated).total.current, emulated_before + 7 * sizeof(float));
  EXPECT_EQ(zt::memory_snapshot(zt::DeviceType::host).total.current, host_before);
  for (DType dtype : {DType::fp64, DType::bf16, DType::fp16}) {
    // Converted on the device, back to fp32 on the device, then to the host: the host's bits.
    const Tensor converted = on_device.to(dtype);
    EXPECT_EQ(converted.device(), emulated);
    const Tensor back = converted.to(DType::fp32).to(zt::Device::host());
    const Tensor expected = source.to(dtype).to(DType::fp32);
    EXPECT_TRUE(back.device().is_host());
    EXPECT_EQ(std::memcmp(back.raw_data(), expected.raw_data(), back.nbytes()), 0) << zt::dtype_name(dtype);
  }
  // Fills, zeroing a slice and reading single elements, all on the device.
  Tensor filled = Tensor::zeros({6}, DType::bf16, emulated);
  EXPECT_EQ(filled.item_as_double(5), 0.0);
  filled.fill_(2.5);
  filled.flat_slice(1, 2).zero_();
  EXPECT_EQ(filled.item_as_double(0), 2.5);
  EXPECT_EQ(filled.item_as_double(2), 0.0);
  EXPECT_EQ(filled.item_as_double(3), 2.5);
  Tensor copy = filled.clone();
  EXPECT_EQ(copy.device(), emulated);
  EXPECT_NE(copy.raw_data(), filled.raw_data());
  Tensor host_copy = Tensor::empty({2, 3}, DType::bf16);
  host_copy.copy_from(copy);
  EXPECT_EQ(static_cast<float>(host_copy.data<zt::bf16>()[4]), 2.5f);
  EXPECT_EQ(static_cast<float>(host_copy.data<zt::bf16>()[1]), 0.0f);
  // Integer tensors (tokens) travel too.
  const Tensor tokens = Tensor::from_vector<std::int32_t>({7, -1, 3}, {3}).to(emulated);
  EXPECT_EQ(tokens.item_as_double(1), -1.0);
  // A conversion needs both tensors on one device.
  const std::string message = error_of([&] { filled.copy_from(Tensor::zeros({6}, DType::fp32)); });
  EXPECT_NE(message.find("dtype conversion needs both tensors on the same device"), std::string::npos)
      << message;
}

TEST(Tensor, ErrorsNameTheTensorAndWhatWasExpected) {
  Tensor t = Tensor::zeros({2, 3}, DType::fp32);
  std::string message = error_of([&] { t.data<double>(); });
  EXPECT_NE(message.find("data<fp64>()"), std::string::npos) << message;
  EXPECT_NE(message.find("fp32[2, 3]"), std::string::npos) << message;

  message = error_of([&] { t.reshape({4, 2}); });
  EXPECT_NE(message.find("expected a shape with 6 elements"), std::string::npos) << message;
  message = error_of([&] { t.reshape({-1, -1}); });
  EXPECT_NE(message.find("at most one extent may be -1"), std::string::npos) << message;
  message = error_of([&] { t.flat_slice(4, 3); });
  EXPECT_NE(message.find("flat_slice(4, 3)"), std::string::npos) << message;
  message = error_of([&] { t.size(2); });
  EXPECT_NE(message.find("dimension 2"), std::string::npos) << message;

  Tensor other = Tensor::zeros({5}, DType::fp32);
  message = error_of([&] { t.copy_from(other); });
  EXPECT_NE(message.find("expected the same number of elements"), std::string::npos) << message;
  Tensor ints = Tensor::zeros({6}, DType::int32);
  message = error_of([&] { t.copy_from(ints); });
  EXPECT_NE(message.find("int32"), std::string::npos) << message;
  message = error_of([&] { Tensor::empty({2, -3}, DType::fp32); });
  EXPECT_NE(message.find("negative extent"), std::string::npos) << message;
  message = error_of([&] { Tensor::view_of(nullptr, {3}, DType::fp32); });
  EXPECT_NE(message.find("null pointer"), std::string::npos) << message;
  message = error_of([&] { Tensor().data<float>(); });
  EXPECT_NE(message.find("undefined tensor"), std::string::npos) << message;
}

}  // namespace
