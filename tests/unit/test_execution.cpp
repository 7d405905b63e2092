// zt::ExecutionContext on the host and on the emulated device: memory on the context's device,
// copies and zeroing ordered on its compute stream, micro-batches moved on, stream ordering.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "test_helpers.hpp"
#include "zerotrain/execution.hpp"
#include "zerotrain/tensor.hpp"

namespace {

using zt::testing::error_of;

using zt::Device;
using zt::DType;
using zt::ExecutionContext;
using zt::MemoryCategory;
using zt::Tensor;

class ExecutionContextOn : public ::testing::TestWithParam<Device> {};

TEST_P(ExecutionContextOn, AllocatesOnItsDeviceUnderTheCategory) {
  const ExecutionContext context(GetParam());
  EXPECT_EQ(context.device(), GetParam());
  EXPECT_EQ(context.compute().device(), GetParam());
  EXPECT_EQ(context.communication().device(), GetParam());
  const auto before = zt::memory_snapshot(GetParam().type);
  {
    const Tensor grads = context.zeros({3, 5}, DType::fp32, MemoryCategory::gradients);
    const zt::Buffer states = context.allocate(1000, MemoryCategory::optimizer_states);
    EXPECT_EQ(grads.device(), GetParam());
    EXPECT_EQ(states.device(), GetParam());
    const auto during = zt::memory_snapshot(GetParam().type);
    EXPECT_EQ(during[MemoryCategory::gradients].current, before[MemoryCategory::gradients].current + 60);
    EXPECT_EQ(during[MemoryCategory::optimizer_states].current,
              before[MemoryCategory::optimizer_states].current + 1000);
    std::vector<float> values(15, -1.0f);
    context.to_host(values.data(), grads.raw_data(), grads.nbytes());
    EXPECT_EQ(values, std::vector<float>(15, 0.0f));
    EXPECT_EQ(context.empty({2}, DType::bf16).device(), GetParam());
  }
  EXPECT_EQ(zt::memory_snapshot(GetParam().type).total.current, before.total.current);
}

TEST_P(ExecutionContextOn, CopiesAndZeroesOnTheComputeStream) {
  const ExecutionContext context(GetParam());
  std::vector<std::int32_t> values(2000);
  std::iota(values.begin(), values.end(), 1);
  const std::size_t bytes = values.size() * sizeof(std::int32_t);
  zt::Buffer first = context.allocate(bytes), second = context.allocate(bytes);
  context.from_host(first.data(), values.data(), bytes);
  context.copy(second.data(), first.data(), bytes);
  context.zero(second.as<std::int32_t>() + 10, 5 * sizeof(std::int32_t));
  std::vector<std::int32_t> back(values.size());
  context.to_host(back.data(), second.data(), bytes);
  std::vector<std::int32_t> expected = values;
  std::fill(expected.begin() + 10, expected.begin() + 15, 0);
  EXPECT_EQ(back, expected);

  Tensor tensor = context.empty({4}, DType::fp64);
  tensor.fill_(3.0, &context.compute());
  context.zero(tensor);
  EXPECT_EQ(tensor.item_as_double(3), 0.0);
  context.synchronize();
}

TEST_P(ExecutionContextOn, MovesOverlappingRangesWithoutWaiting) {
  // move() goes through a scratch buffer freed in the compute stream's order (no host wait on a
  // GPU): a later move and the read after it still see the moved bytes.
  const ExecutionContext context(GetParam());
  std::vector<std::int32_t> values(1000);
  std::iota(values.begin(), values.end(), 0);
  const std::size_t bytes = values.size() * sizeof(std::int32_t);
  zt::Buffer buffer = context.allocate(bytes);
  context.from_host(buffer.data(), values.data(), bytes);
  auto* data = buffer.as<std::int32_t>();
  context.move(data + 100, data, 500 * sizeof(std::int32_t));  // forward overlap
  context.move(data, data + 300, 200 * sizeof(std::int32_t));  // backward overlap, after the first
  std::vector<std::int32_t> expected = values;
  std::memmove(expected.data() + 100, expected.data(), 500 * sizeof(std::int32_t));
  std::memmove(expected.data(), expected.data() + 300, 200 * sizeof(std::int32_t));
  std::vector<std::int32_t> back(values.size());
  context.to_host(back.data(), buffer.data(), bytes);
  EXPECT_EQ(back, expected);
}

TEST_P(ExecutionContextOn, MovesMicroBatchesOntoItsDevice) {
  const ExecutionContext context(GetParam());
  const Tensor tokens = Tensor::from_vector<std::int32_t>({4, 1, 2, 9, 0, 3}, {2, 3});
  const Tensor moved = context.on_device(tokens);
  EXPECT_EQ(moved.device(), GetParam());
  EXPECT_EQ(moved.shape(), tokens.shape());
  if (GetParam().is_host()) {
    EXPECT_EQ(moved.raw_data(), tokens.raw_data());  // the tensor itself, no copy
  } else {
    EXPECT_NE(moved.raw_data(), tokens.raw_data());
    EXPECT_EQ(moved.category(), MemoryCategory::activations);
    EXPECT_EQ(context.on_device(moved).raw_data(), moved.raw_data());  // already there
  }
  std::vector<std::int32_t> back(6);
  context.to_host(back.data(), moved.raw_data(), moved.nbytes());
  EXPECT_EQ(back, (std::vector<std::int32_t>{4, 1, 2, 9, 0, 3}));
}

TEST_P(ExecutionContextOn, OrdersComputeAndCommunication) {
  // On the host and the emulated device work runs at once: the ordering calls must not block or fail.
  const ExecutionContext context(GetParam());
  for (int i = 0; i < 3; ++i) {
    context.communication_waits_for_compute();
    context.compute_waits_for_communication();
  }
  context.synchronize();
}

TEST_P(ExecutionContextOn, CopiesToPinnedHostMemoryOnTheTransferStream) {
  // The ActivationCheckpoint's way (keep_input_on_host): a pinned host buffer counted under its
  // category, a device-to-host copy on the transfer stream after the compute work that wrote the
  // source, the compute stream ordered after it; then the bytes back on the device. On the host and
  // the emulated device the streams run work at once: the same calls, the same bytes.
  const ExecutionContext context(GetParam());
  EXPECT_EQ(context.transfer().device(), GetParam());
  std::vector<std::int32_t> values(3000);
  std::iota(values.begin(), values.end(), -7);
  const std::size_t bytes = values.size() * sizeof(std::int32_t);
  zt::Buffer source = context.allocate(bytes);
  context.from_host(source.data(), values.data(), bytes);
  const auto before = zt::memory_snapshot(zt::DeviceType::host);
  {
    zt::Buffer pinned = context.allocate_pinned_host(bytes, MemoryCategory::activations);
    EXPECT_EQ(pinned.device(), Device::host());
    EXPECT_EQ(zt::memory_snapshot(zt::DeviceType::host)[MemoryCategory::activations].current,
              before[MemoryCategory::activations].current + bytes);
    context.to_host_async(pinned.data(), source.data(), bytes);
    context.compute_waits_for_transfers();
    context.zero(source.data(), bytes);  // after the copy on the compute stream: the copy has the old bytes
    zt::Buffer back = context.allocate(bytes);
    context.from_host(back.data(), pinned.data(), bytes);
    std::vector<std::int32_t> read(values.size());
    context.to_host(read.data(), back.data(), bytes);
    EXPECT_EQ(read, values);
    context.to_host(read.data(), source.data(), bytes);
    EXPECT_EQ(read, std::vector<std::int32_t>(values.size(), 0));
    context.to_host_async(pinned.data(), source.data(), 0);  // nothing to copy: nothing queued
  }
  EXPECT_EQ(zt::memory_snapshot(zt::DeviceType::host)[MemoryCategory::activations].current,
            before[MemoryCategory::activations].current);
  context.synchronize();
}

TEST_P(ExecutionContextOn, ReadsAnElementAfterTheStreamThatWroteIt) {
  const ExecutionContext context(GetParam());
  Tensor tensor = context.empty({5}, DType::bf16);
  tensor.fill_(2.5, &context.compute());
  EXPECT_EQ(tensor.item_as_double(4, &context.compute()), 2.5);
  EXPECT_EQ(tensor.item_as_double(4), 2.5);
  const zt::Stream& elsewhere =
      zt::default_stream(GetParam().is_host() ? Device::emulated() : Device::host());
  const std::string message = error_of([&] { (void)tensor.item_as_double(0, &elsewhere); });
  EXPECT_NE(message.find("expected a stream of the tensor's device"), std::string::npos) << message;
}

INSTANTIATE_TEST_SUITE_P(Devices, ExecutionContextOn, ::testing::Values(Device::host(), Device::emulated()),
                         [](const ::testing::TestParamInfo<Device>& param_info) {
                           return param_info.param.is_host() ? std::string("host") : std::string("emulated");
                         });

TEST(ExecutionContext, HostContextIsOneProcessWideObject) {
  EXPECT_EQ(&ExecutionContext::host(), &ExecutionContext::host());
  EXPECT_TRUE(ExecutionContext::host().device().is_host());
}

TEST(ExecutionContext, RefusesMemoryOfAnotherDevice) {
  const ExecutionContext context(Device::emulated());
  Tensor host_tensor = Tensor::zeros({3}, DType::fp32);
  std::string message = error_of([&] { context.zero(host_tensor); });
  EXPECT_NE(message.find("ExecutionContext on emulated:0"), std::string::npos) << message;
  EXPECT_NE(message.find("fp32[3] on host"), std::string::npos) << message;
  const ExecutionContext other(Device::emulated(1));
  const Tensor elsewhere = other.zeros({2}, DType::fp32);
  message = error_of([&] { context.on_device(elsewhere); });
  EXPECT_NE(message.find("expected a host tensor or one on emulated:0"), std::string::npos) << message;
}

TEST(ExecutionContext, OnACudaDeviceWithoutAGpuSaysWhy) {
  if (zt::cuda_status().usable()) GTEST_SKIP() << "a GPU is usable: nothing to refuse";
  const std::string message = error_of([] { const ExecutionContext context(Device::cuda(0)); });
  EXPECT_NE(message.find("creating a CUDA stream"), std::string::npos) << message;
}

}  // namespace
