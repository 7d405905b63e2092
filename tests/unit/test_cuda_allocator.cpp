// The CUDA allocators on a GPU (ctest unit.cuda_allocator, label gpu): the stream-ordered device pool
// and the pinned cache keep what is freed (MemorySnapshot::cached), count buffers by category as on
// the host, and hand a block out again only once the work that used it is done. Without a usable GPU
// every test skips saying so. The policy itself is tested without a GPU in unit.device.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "cuda_kernel_checks.hpp"
#include "src/engine/model_flops.hpp"
#include "zerotrain/device.hpp"

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

TEST(CudaAllocator, CountsDeviceBuffersByCategoryAndKeepsFreedMemory) {
  ZT_REQUIRE_GPU();
  zt::reset_memory_peaks();
  const zt::MemorySnapshot before = zt::memory_snapshot(zt::DeviceType::cuda);
  {
    zt::Buffer parameters(zt::Device::cuda(0), 3 * kMiB + 7, zt::MemoryCategory::parameters);
    zt::Buffer gradients(zt::Device::cuda(0), kMiB, zt::MemoryCategory::gradients);
    const zt::MemorySnapshot during = zt::memory_snapshot(zt::DeviceType::cuda);
    EXPECT_EQ(during[zt::MemoryCategory::parameters].current,
              before[zt::MemoryCategory::parameters].current + 3 * kMiB + 7);
    EXPECT_EQ(during.total.current, before.total.current + 4 * kMiB + 7);
  }
  const zt::MemorySnapshot after = zt::memory_snapshot(zt::DeviceType::cuda);
  EXPECT_EQ(after.total.current, before.total.current);
  EXPECT_EQ(after.total.peak, before.total.current + 4 * kMiB + 7);
  // The release threshold keeps the freed blocks in the pool: reserved, not in use.
  EXPECT_GE(after.cached, 4 * kMiB) << "the pool gave the freed memory back";
}

TEST(CudaAllocator, StreamOrderedBuffersCarryDataAcrossReuse) {
  ZT_REQUIRE_GPU();
  const zt::Stream stream(zt::Device::cuda(0));
  std::vector<float> values(100003);
  std::iota(values.begin(), values.end(), 1.0f);
  const std::size_t bytes = values.size() * sizeof(float);
  zt::Buffer pinned(zt::Device::host(), bytes, zt::MemoryCategory::comm_buffers, zt::kHostAlignment,
                    zt::HostMemoryKind::pinned, &stream);
  // Many rounds of allocate, use and free on the stream: each round's block may be the previous
  // round's, reused in stream order after the previous round's copies.
  for (int round = 0; round < 20; ++round) {
    zt::Buffer device(zt::Device::cuda(0), bytes, zt::MemoryCategory::activations, zt::kHostAlignment,
                      zt::HostMemoryKind::pageable, &stream);
    std::vector<float> sent(values);
    for (float& value : sent) value += static_cast<float>(round);
    zt::copy_bytes(device.data(), device.device(), sent.data(), zt::Device::host(), bytes, &stream);
    zt::copy_bytes(pinned.data(), zt::Device::host(), device.data(), device.device(), bytes, &stream);
    stream.synchronize();
    ASSERT_EQ(std::memcmp(pinned.data(), sent.data(), bytes), 0) << "round " << round;
  }
}

TEST(CudaAllocator, PinnedBuffersAreCachedAndReusedAfterTheirCopies) {
  ZT_REQUIRE_GPU();
  const zt::Stream stream(zt::Device::cuda(0));
  const std::size_t bytes = 5 * kMiB + 123;
  void* first = nullptr;
  {
    zt::Buffer pinned(zt::Device::host(), bytes, zt::MemoryCategory::other, zt::kHostAlignment,
                      zt::HostMemoryKind::pinned);
    first = pinned.data();
  }
  const std::size_t cached = zt::memory_snapshot(zt::DeviceType::host).cached;
  EXPECT_GE(cached, bytes) << "a freed pinned block is kept";
  zt::Buffer again(zt::Device::host(), bytes, zt::MemoryCategory::other, zt::kHostAlignment,
                   zt::HostMemoryKind::pinned);
  EXPECT_EQ(again.data(), first) << "the same size class comes back from the cache";
  // Freed on a stream with a copy still queued: reusable only once the copy is done, and the data
  // the copy read is what was there at the free.
  zt::Buffer device(zt::Device::cuda(0), bytes);
  std::memset(again.data(), 0x5a, bytes);
  zt::copy_bytes(device.data(), device.device(), again.data(), zt::Device::host(), bytes, &stream);
  {
    zt::Buffer moved(zt::Device::host(), bytes, zt::MemoryCategory::other, zt::kHostAlignment,
                     zt::HostMemoryKind::pinned, &stream);
    std::memset(moved.data(), 0x5a, bytes);
    zt::copy_bytes(device.data(), device.device(), moved.data(), zt::Device::host(), bytes, &stream);
  }  // freed on the stream: an event fences it
  zt::Buffer next(zt::Device::host(), bytes, zt::MemoryCategory::other, zt::kHostAlignment,
                  zt::HostMemoryKind::pinned);
  std::memset(next.data(), 0, bytes);  // must not change what the queued copy reads
  std::vector<unsigned char> check(bytes);
  zt::copy_bytes(check.data(), zt::Device::host(), device.data(), device.device(), bytes, &stream);
  stream.synchronize();
  EXPECT_EQ(check.front(), 0x5a);
  EXPECT_EQ(check.back(), 0x5a);
}

TEST(CudaAllocator, ReleasingTheCachesGivesTheirMemoryBack) {
  ZT_REQUIRE_GPU();
  const zt::Stream stream(zt::Device::cuda(0));
  // Larger than any chunk the pool maps at a time, so that the block has its own mapping, which
  // nothing else shares when it is freed; the pool starts empty.
  const std::size_t bytes = 256 * kMiB;
  zt::release_cached_memory(zt::DeviceType::cuda);
  {
    zt::Buffer live(zt::Device::cuda(0), kMiB);  // untouched by the release
    {
      // Freed on the stream: back in the pool only once the device reaches the free.
      zt::Buffer device(zt::Device::cuda(0), bytes, zt::MemoryCategory::activations, zt::kHostAlignment,
                        zt::HostMemoryKind::pageable, &stream);
      zt::zero_bytes(device.data(), device.device(), bytes, &stream);
      zt::Buffer pinned(zt::Device::host(), bytes, zt::MemoryCategory::other, zt::kHostAlignment,
                        zt::HostMemoryKind::pinned);
    }
    const std::size_t kept = zt::memory_snapshot(zt::DeviceType::cuda).cached;
    ASSERT_GE(kept, bytes) << "the pool did not keep the freed block";
    ASSERT_GE(zt::memory_snapshot(zt::DeviceType::host).cached, bytes)
        << "the pinned cache did not keep its block";

    zt::release_cached_memory(zt::DeviceType::cuda);
    const zt::MemorySnapshot device = zt::memory_snapshot(zt::DeviceType::cuda);
    EXPECT_LE(device.cached + bytes, kept) << "the pool still holds the freed block";
    EXPECT_GE(device.total.current, kMiB) << "the live buffer is still counted";
    zt::release_cached_memory(zt::DeviceType::host);
    EXPECT_EQ(zt::memory_snapshot(zt::DeviceType::host).cached, 0u);

    zt::zero_bytes(live.data(), live.device(), kMiB);  // still usable
  }
}

TEST(CudaAllocator, TheMatmulProbeGivesItsOperandsBack) {
  // The MFU's peak on a GPU the data sheet does not list is measured on 8192^2 operands; they must
  // not stay reserved in the pool for the rest of the run.
  ZT_REQUIRE_GPU();
  zt::release_cached_memory(zt::DeviceType::cuda);
  const std::size_t before = zt::memory_snapshot(zt::DeviceType::cuda).cached;
  const zt::engine_detail::MatmulProbe probe =
      zt::engine_detail::probe_matmul(zt::DType::bf16, zt::Device::cuda(0), /*budget_seconds=*/0.01);
  EXPECT_GT(probe.flops_per_second, 0.0);
  // 3 x 8192^2 bf16 elements are 384 MiB; what the pool may keep of its own is far less.
  EXPECT_LT(zt::memory_snapshot(zt::DeviceType::cuda).cached, before + 16 * kMiB);
}

TEST(CudaAllocator, RefusesAnAlignmentPinnedPagesCannotGive) {
  ZT_REQUIRE_GPU();
  EXPECT_THROW(
      zt::Buffer(zt::Device::host(), 4096, zt::MemoryCategory::other, 8192, zt::HostMemoryKind::pinned),
      zt::Error);
}

}  // namespace
