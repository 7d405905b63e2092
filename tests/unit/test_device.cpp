// The device layer on the host, and its behaviour when CUDA is absent or unusable.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/emulated_device.hpp"
#include "test_helpers.hpp"
#include "zerotrain/build_info.hpp"
#include "zerotrain/device.hpp"
#include "zerotrain/error.hpp"

namespace {

TEST(Device, Names) {
  EXPECT_EQ(zt::Device::host().str(), "host");
  EXPECT_EQ(zt::Device::cuda(3).str(), "cuda:3");
  EXPECT_EQ(zt::Device::emulated().str(), "emulated:0");
  EXPECT_EQ(zt::Device::emulated(2).str(), "emulated:2");
  EXPECT_TRUE(zt::Device::emulated().is_emulated());
  EXPECT_FALSE(zt::Device::emulated().is_host());
  EXPECT_NE(zt::Device::host(), zt::Device::cuda(0));
  EXPECT_NE(zt::Device::emulated(0), zt::Device::cuda(0));
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

// ---- the emulated device -------------------------------------------------------------------

const zt::Device kEmulated = zt::Device::emulated();

TEST(EmulatedDevice, CopiesAndZeroesThroughTheDeviceApi) {
  std::vector<int> source(3000);
  std::iota(source.begin(), source.end(), 1);
  zt::Buffer device(kEmulated, source.size() * sizeof(int));
  EXPECT_EQ(device.device(), kEmulated);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(device.data()) % zt::kDirectIoAlignment, 0u);
  EXPECT_TRUE(zt::detail::is_emulated_device_address(device.data()));
  EXPECT_FALSE(zt::detail::is_emulated_device_address(source.data()));
  zt::copy_bytes(device.data(), kEmulated, source.data(), zt::Device::host(), device.size());
  // Device to device, then back to the host.
  zt::Buffer second(kEmulated, device.size());
  zt::copy_bytes(second.data(), kEmulated, device.data(), kEmulated, device.size(),
                 &zt::default_stream(kEmulated));
  std::vector<int> back(source.size(), -1);
  zt::copy_bytes(back.data(), zt::Device::host(), second.data(), kEmulated, second.size());
  EXPECT_EQ(back, source);
  zt::zero_bytes(second.data(), kEmulated, 100 * sizeof(int));
  zt::copy_bytes(back.data(), zt::Device::host(), second.data(), kEmulated, second.size());
  EXPECT_EQ(back[99], 0);
  EXPECT_EQ(back[100], 101);
  const std::string message = zt::testing::error_of(
      [&] { zt::copy_bytes(device.data(), kEmulated, second.data(), zt::Device::cuda(0), 16); });
  EXPECT_NE(message.find("the emulated device exchanges data with the host only"), std::string::npos)
      << message;
}

TEST(EmulatedDevice, BuffersAreCountedApartFromTheHost) {
  const auto host_before = zt::memory_snapshot(zt::DeviceType::host);
  const auto before = zt::memory_snapshot(zt::DeviceType::emulated);
  const std::size_t regions_before = zt::detail::emulated_device_region_count();
  {
    zt::Buffer params(kEmulated, 10000, zt::MemoryCategory::parameters);
    zt::Buffer states(zt::Device::emulated(1), 300, zt::MemoryCategory::optimizer_states);
    const auto during = zt::memory_snapshot(zt::DeviceType::emulated);
    EXPECT_EQ(during[zt::MemoryCategory::parameters].current,
              before[zt::MemoryCategory::parameters].current + 10000);
    EXPECT_EQ(during.total.current, before.total.current + 10300);
    EXPECT_EQ(zt::memory_snapshot(zt::DeviceType::host).total.current, host_before.total.current);
    EXPECT_EQ(zt::detail::emulated_device_region_count(), regions_before + 2);
  }
  EXPECT_EQ(zt::memory_snapshot(zt::DeviceType::emulated).total.current, before.total.current);
  EXPECT_EQ(zt::detail::emulated_device_region_count(), regions_before);
}

TEST(EmulatedDevice, StreamsAndEventsRunWorkAtOnce) {
  const zt::Stream& stream = zt::default_stream(kEmulated);
  EXPECT_EQ(&stream, &zt::default_stream(kEmulated));  // one per device, process-wide
  EXPECT_EQ(stream.device(), kEmulated);
  EXPECT_EQ(stream.native(), nullptr);
  EXPECT_EQ(zt::default_stream(zt::Device::host()).device(), zt::Device::host());
  EXPECT_NE(&zt::default_stream(zt::Device::emulated(1)), &stream);
  zt::Stream own(kEmulated);
  zt::Event event(kEmulated);
  event.record(own);
  EXPECT_TRUE(event.ready());
  stream.wait(event);
  own.synchronize();
  event.synchronize();
}

TEST(EmulatedDevice, IsAccessibleInsideTheDeviceApiAccessOnly) {
  zt::Buffer buffer(kEmulated, 64);
  {
    const zt::detail::EmulatedDeviceAccess outer;
    buffer.as<int>()[0] = 41;
    zt::Buffer opened_inside(kEmulated, 8);  // allocated while access is open: accessible at once
    {
      const zt::detail::EmulatedDeviceAccess inner;
      opened_inside.as<int>()[0] = 1;
    }
    buffer.as<int>()[0] += opened_inside.as<int>()[0];  // the inner close left access open
  }
  int value = 0;
  zt::copy_bytes(&value, zt::Device::host(), buffer.data(), kEmulated, sizeof(value));
  EXPECT_EQ(value, 42);
}

// The protection is real: touching emulated memory outside the device API kills the process, and
// the fault handler says why.
TEST(EmulatedDeviceDeathTest, HostAccessOutsideTheDeviceApiCrashes) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  zt::Buffer buffer(kEmulated, 64);
  volatile int* pointer = buffer.as<int>();
  EXPECT_DEATH(static_cast<void>(*pointer), "host access to emulated device memory at 0x");
  EXPECT_DEATH(*pointer = 1, "host access to emulated device memory");
  // After an access closes, the memory is protected again.
  EXPECT_DEATH(
      {
        { const zt::detail::EmulatedDeviceAccess access; }
        static_cast<void>(*pointer);
      },
      "host access to emulated device memory");
}

TEST(EmulatedDeviceDeathTest, FreedMemoryAndOverrunsFaultEvenInsideTheDeviceApi) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        volatile char* stale = nullptr;
        {
          zt::Buffer buffer(kEmulated, 64);
          stale = buffer.as<char>();
        }
        const zt::detail::EmulatedDeviceAccess access;
        static_cast<void>(*stale);
      },
      "host access to emulated device memory");
  EXPECT_DEATH(
      {
        zt::Buffer buffer(kEmulated, 4096);
        const zt::detail::EmulatedDeviceAccess access;
        static_cast<void>(buffer.as<volatile char>()[4096]);  // the page after the region
      },
      "host access to emulated device memory");
}

}  // namespace
