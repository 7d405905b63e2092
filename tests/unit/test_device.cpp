// The device layer on the host, and its behaviour when CUDA is absent or unusable.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "test_helpers.hpp"
#include "zerotrain/build_info.hpp"
#include "zerotrain/device.hpp"
#include "zerotrain/error.hpp"

namespace {

TEST(Device, Names) {
  EXPECT_EQ(zt::Device::host().str(), "host");
  EXPECT_EQ(zt::Device::cuda(3).str(), "cuda:3");
  EXPECT_NE(zt::Device::host(), zt::Device::cuda(0));
}

TEST(HostBuffer, IsAlignedAndMovable) {
  for (std::size_t alignment : {zt::kHostAlignment, zt::kDirectIoAlignment}) {
    zt::Buffer buffer(zt::Device::host(), 1000, zt::MemoryCategory::other, alignment);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(buffer.data()) % alignment, 0u);
    EXPECT_EQ(buffer.size(), 1000u);
    std::memset(buffer.data(), 7, buffer.size());
    void* address = buffer.data();
    zt::Buffer moved(std::move(buffer));
    EXPECT_EQ(moved.data(), address);
    EXPECT_TRUE(buffer.empty());  // NOLINT(bugprone-use-after-move): moved-from state is specified
    zt::Buffer assigned;
    assigned = std::move(moved);
    EXPECT_EQ(assigned.as<unsigned char>()[999], 7);
  }
  zt::Buffer empty(zt::Device::host(), 0);
  EXPECT_TRUE(empty.empty());
}

TEST(HostBuffer, RejectsBadAlignment) {
  EXPECT_THROW(zt::Buffer(zt::Device::host(), 64, zt::MemoryCategory::other, 48), zt::Error);
}

TEST(HostCopy, CopiesBytes) {
  std::vector<int> source(1000);
  std::iota(source.begin(), source.end(), 0);
  std::vector<int> destination(1000, -1);
  zt::copy_bytes(destination.data(), zt::Device::host(), source.data(), zt::Device::host(),
                 1000 * sizeof(int));
  EXPECT_EQ(destination, source);
  zt::Stream host_stream;
  host_stream.synchronize();
  EXPECT_EQ(host_stream.native(), nullptr);
}

TEST(Memory, CountsEveryBufferByCategory) {
  zt::reset_memory_peaks();
  const auto before = zt::memory_snapshot(zt::DeviceType::host);
  {
    zt::Buffer params(zt::Device::host(), 1000, zt::MemoryCategory::parameters);
    zt::Buffer grads(zt::Device::host(), 500, zt::MemoryCategory::gradients);
    const auto during = zt::memory_snapshot(zt::DeviceType::host);
    EXPECT_EQ(during[zt::MemoryCategory::parameters].current,
              before[zt::MemoryCategory::parameters].current + 1000);
    EXPECT_EQ(during[zt::MemoryCategory::gradients].current,
              before[zt::MemoryCategory::gradients].current + 500);
    EXPECT_EQ(during.total.current, before.total.current + 1500);
    zt::Buffer moved = std::move(grads);  // moving does not count twice
    EXPECT_EQ(zt::memory_snapshot(zt::DeviceType::host).total.current, before.total.current + 1500);
  }
  const auto after = zt::memory_snapshot(zt::DeviceType::host);
  EXPECT_EQ(after.total.current, before.total.current);
  EXPECT_EQ(after.total.peak, before.total.current + 1500);
  EXPECT_EQ(after[zt::MemoryCategory::parameters].peak,
            before[zt::MemoryCategory::parameters].current + 1000);
  EXPECT_EQ(zt::memory_category_name(zt::MemoryCategory::optimizer_states), "optimizer_states");
}

TEST(Cuda, StatusExplainsItself) {
  const zt::CudaStatus& status = zt::cuda_status();
  EXPECT_EQ(status.compiled, zt::build_info::have_cuda);
  if (!status.usable()) {
    EXPECT_FALSE(status.reason.empty());
    // Without a usable GPU, asking for device memory is an error that says why.
    try {
      zt::Buffer buffer(zt::Device::cuda(0), 16);
      FAIL() << "allocated on cuda:0 without a usable GPU";
    } catch (const zt::CudaError& e) {
      EXPECT_NE(std::string(e.what()).find(status.compiled ? status.reason : "built without CUDA"),
                std::string::npos)
          << e.what();
    }
    // Pinned host memory falls back to pageable memory when no GPU can pin it.
    zt::Buffer pinned(zt::Device::host(), 4096, zt::MemoryCategory::other, zt::kHostAlignment,
                      zt::HostMemoryKind::pinned);
    EXPECT_EQ(pinned.size(), 4096u);
  }
}

TEST(Cuda, DeviceRoundTrip) {
  if (!zt::cuda_status().usable()) GTEST_SKIP() << "no usable GPU: " << zt::cuda_status().reason;
  std::vector<float> host(12345);
  std::iota(host.begin(), host.end(), 0.5f);
  zt::Stream stream(zt::Device::cuda(0));
  zt::Buffer device(zt::Device::cuda(0), host.size() * sizeof(float));
  zt::Buffer pinned(zt::Device::host(), host.size() * sizeof(float), zt::MemoryCategory::other,
                    zt::kHostAlignment, zt::HostMemoryKind::pinned);
  zt::copy_bytes(device.data(), device.device(), host.data(), zt::Device::host(), device.size(), &stream);
  zt::copy_bytes(pinned.data(), zt::Device::host(), device.data(), device.device(), device.size(), &stream);
  zt::Event copied(zt::Device::cuda(0));
  copied.record(stream);
  copied.synchronize();
  EXPECT_TRUE(copied.ready());
  EXPECT_EQ(std::memcmp(pinned.data(), host.data(), device.size()), 0);
}

TEST(Event, OnTheHostStreamIsReachedAtOnce) {
  zt::Stream host_stream;
  zt::Event event;
  event.record(host_stream);
  EXPECT_TRUE(event.ready());
  event.synchronize();
  zt::Event moved = std::move(event);
  EXPECT_TRUE(moved.ready());
  if (zt::cuda_status().usable()) return;
  // Without a usable GPU, a CUDA event is refused with the reason, not left half made.
  const std::string message = zt::testing::error_of([] { zt::Event cuda_event(zt::Device::cuda(0)); });
  EXPECT_NE(message.find("creating a CUDA event"), std::string::npos) << message;
}

}  // namespace
