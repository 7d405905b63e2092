// The device layer on the host, and its behaviour when CUDA is absent or unusable.
#include <gtest/gtest.h>

#include <malloc.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kernels/block_cache.hpp"
#include "kernels/emulated_device.hpp"
#include "kernels/gpu_path.hpp"
#include "kernels/host_memory.hpp"
#include "kernels/stream_marks.hpp"
#include "src/engine/device_choice.hpp"
#include "swap_test_fixtures.hpp"  // ScopedEnvironment
#include "test_helpers.hpp"
#include "zerotrain/build_info.hpp"
#include "zerotrain/device.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/trainer.hpp"

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

/// The VmFlags of the mapping that holds `address` (/proc/self/smaps), "" when none does.
std::string vm_flags_at(const void* address) {
  const auto where = reinterpret_cast<std::uintptr_t>(address);
  std::ifstream smaps("/proc/self/smaps");
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    std::uintptr_t begin = 0, end = 0;
    char dash = 0;
    if (std::istringstream header(line); header >> std::hex >> begin >> dash >> end && dash == '-') {
      inside = begin <= where && where < end;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line.substr(8) + " ";
    }
  }
  return "";
}

TEST(HostBuffer, LargeBlocksAreAlignedAndAdvisedAsHugePages) {
  if (!std::filesystem::exists("/sys/kernel/mm/transparent_hugepage/enabled"))
    GTEST_SKIP() << "this kernel has no transparent huge pages";
  // 64 MiB: above glibc's largest mmap threshold, so (without a Runtime's malloc policy) a fresh
  // mapping whose flags are this allocation's alone.
  constexpr std::size_t kBytes = std::size_t{64} << 20;
  {
    zt::testing::ScopedEnvironment on("ZT_HOST_HUGE_PAGES", std::nullopt);
    ASSERT_TRUE(zt::host_huge_pages_enabled());
    for (zt::MemoryCategory category :
         {zt::MemoryCategory::optimizer_states, zt::MemoryCategory::activations}) {
      zt::Buffer large(zt::Device::host(), kBytes, category);
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(large.data()) % zt::kHostHugePageBytes, 0u);
      EXPECT_NE(vm_flags_at(large.data()).find(" hg "), std::string::npos)
          << "no MADV_HUGEPAGE on the mapping: VmFlags" << vm_flags_at(large.data());
      std::memset(large.data(), 1, large.size());  // usable to its last byte
    }
    zt::Buffer small(zt::Device::host(), zt::kHostHugePageMinimumBytes - 1, zt::MemoryCategory::parameters);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(small.data()) % zt::kHostAlignment, 0u);
  }
  zt::testing::ScopedEnvironment off("ZT_HOST_HUGE_PAGES", "0");
  EXPECT_FALSE(zt::host_huge_pages_enabled());
  zt::Buffer plain(zt::Device::host(), kBytes, zt::MemoryCategory::parameters);
  const std::string flags = vm_flags_at(plain.data());
  ASSERT_FALSE(flags.empty());
  EXPECT_EQ(flags.find(" hg "), std::string::npos) << "ZT_HOST_HUGE_PAGES=0 still advised: VmFlags" << flags;
}

/// The Runtime's malloc policy (mpi_layer/runtime.cpp) for one test: every block from the heap, which
/// keeps what is freed, as in training.
class HeapKeepsFreedBlocks {
 public:
  HeapKeepsFreedBlocks() {
    mallopt(M_MMAP_MAX, 0);
    mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
  }
  ~HeapKeepsFreedBlocks() {
    mallopt(M_MMAP_MAX, 65536);  // glibc's defaults
    mallopt(M_TRIM_THRESHOLD, 128 * 1024);
  }
  HeapKeepsFreedBlocks(const HeapKeepsFreedBlocks&) = delete;
  HeapKeepsFreedBlocks& operator=(const HeapKeepsFreedBlocks&) = delete;
};

// In the heap, the advice must cover the block's whole 2 MiB pages only (not its tail, not the
// neighbouring chunks) and leave with it: the heap hands the range out again in small pieces, and
// advised it would be filled 2 MiB at a time (docs/benchmarks.md, "Resident memory: huge pages").
TEST(HostBuffer, HugePageAdviceStaysInsideTheBlockAndLeavesWithIt) {
  if (!std::filesystem::exists("/sys/kernel/mm/transparent_hugepage/enabled"))
    GTEST_SKIP() << "this kernel has no transparent huge pages";
  zt::testing::ScopedEnvironment on("ZT_HOST_HUGE_PAGES", std::nullopt);
  const HeapKeepsFreedBlocks heap;
  constexpr std::size_t kWholePages = 3 * zt::kHostHugePageBytes, kTail = std::size_t{1} << 20;
  std::byte* start = nullptr;
  {
    zt::Buffer block(zt::Device::host(), kWholePages + kTail, zt::MemoryCategory::gradients);
    start = block.as<std::byte>();
    ASSERT_EQ(reinterpret_cast<std::uintptr_t>(start) % zt::kHostHugePageBytes, 0u);
    EXPECT_NE(vm_flags_at(start).find(" hg "), std::string::npos) << "VmFlags" << vm_flags_at(start);
    EXPECT_NE(vm_flags_at(start + kWholePages - 1).find(" hg "), std::string::npos);
    EXPECT_EQ(vm_flags_at(start + kWholePages).find(" hg "), std::string::npos)
        << "the tail past the last whole 2 MiB page was advised: VmFlags" << vm_flags_at(start + kWholePages);
    std::memset(start, 1, block.size());
  }
  const std::string freed = vm_flags_at(start);
  ASSERT_FALSE(freed.empty()) << "the heap gave the range back despite the malloc policy";
  EXPECT_EQ(freed.find(" hg "), std::string::npos) << "still advised after the free: VmFlags" << freed;
}

// A kernel's temporaries are counted (MemoryCategory::workspace) but take no huge pages: they live for
// one call and are often touched in part.
TEST(HostBuffer, WorkspaceIsCountedAndTakesNoHugePages) {
  zt::testing::ScopedEnvironment on("ZT_HOST_HUGE_PAGES", std::nullopt);
  const HeapKeepsFreedBlocks heap;
  constexpr std::size_t kBytes = 3 * zt::kHostHugePageBytes;
  const auto before = zt::memory_snapshot(zt::DeviceType::host);
  {
    zt::Buffer scratch(zt::Device::host(), kBytes, zt::MemoryCategory::workspace);
    EXPECT_EQ(zt::memory_snapshot(zt::DeviceType::host)[zt::MemoryCategory::workspace].current,
              before[zt::MemoryCategory::workspace].current + kBytes);
    EXPECT_EQ(vm_flags_at(scratch.data()).find(" hg "), std::string::npos)
        << "workspace advised as huge pages: VmFlags" << vm_flags_at(scratch.data());
  }
  const auto after = zt::memory_snapshot(zt::DeviceType::host);
  EXPECT_EQ(after[zt::MemoryCategory::workspace].current, before[zt::MemoryCategory::workspace].current);
  EXPECT_GE(after[zt::MemoryCategory::workspace].peak,
            before[zt::MemoryCategory::workspace].current + kBytes);
  EXPECT_EQ(zt::memory_category_name(zt::MemoryCategory::workspace), "workspace");
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

// ---- the caching allocators' policy (kernels/block_cache.hpp), without a GPU -------------------------

TEST(PinnedSizeClass, RoundsToPagesPowersOfTwoThenTwoMebibyteSteps) {
  constexpr std::size_t MiB = std::size_t{1} << 20;
  EXPECT_EQ(zt::detail::pinned_size_class(0), 4096u);
  EXPECT_EQ(zt::detail::pinned_size_class(1), 4096u);
  EXPECT_EQ(zt::detail::pinned_size_class(4096), 4096u);
  EXPECT_EQ(zt::detail::pinned_size_class(4097), 8192u);
  EXPECT_EQ(zt::detail::pinned_size_class(3 * MiB), 4 * MiB);
  EXPECT_EQ(zt::detail::pinned_size_class(4 * MiB), 4 * MiB);
  EXPECT_EQ(zt::detail::pinned_size_class(4 * MiB + 1), 6 * MiB);
  EXPECT_EQ(zt::detail::pinned_size_class(1000 * MiB + 1), 1002 * MiB);
  for (std::size_t bytes : {std::size_t{1}, std::size_t{5000}, 7 * MiB + 3, 513 * MiB}) {
    const std::size_t size = zt::detail::pinned_size_class(bytes);
    EXPECT_GE(size, bytes);
    EXPECT_EQ(size % 4096, 0u) << bytes;
    EXPECT_EQ(zt::detail::pinned_size_class(size), size) << "a class is its own class: " << bytes;
  }
}

TEST(BlockCache, ReusesOnlyTheSameSizeOnceItsFenceIsPassed) {
  zt::detail::BlockCache cache(1 << 20);
  int a = 0, b = 0, c = 0;
  int fence_a = 0, fence_b = 0;
  bool a_passed = false;
  const zt::detail::BlockCache::FencePassed passed = [&](void* fence) {
    EXPECT_NE(fence, nullptr);
    return fence == &fence_a ? a_passed : fence == &fence_b;
  };
  ASSERT_TRUE(cache.put({&a, 4096, &fence_a}));
  ASSERT_TRUE(cache.put({&b, 4096, &fence_b}));
  ASSERT_TRUE(cache.put({&c, 8192, nullptr}));
  EXPECT_EQ(cache.cached_bytes(), 4096u + 4096u + 8192u);
  EXPECT_FALSE(cache.take(12288, passed)) << "no block of that size";
  // a's work is still running: the oldest block whose fence is passed is b, and its fence comes back.
  std::optional<zt::detail::BlockCache::Block> block = cache.take(4096, passed);
  ASSERT_TRUE(block);
  EXPECT_EQ(block->pointer, &b);
  EXPECT_EQ(block->fence, &fence_b);
  EXPECT_FALSE(cache.take(4096, passed)) << "a block reused before the device is done with it";
  a_passed = true;
  block = cache.take(4096, passed);
  ASSERT_TRUE(block);
  EXPECT_EQ(block->pointer, &a);
  block = cache.take(8192, passed);  // no fence: reusable at once
  ASSERT_TRUE(block);
  EXPECT_EQ(block->pointer, &c);
  EXPECT_EQ(cache.cached_bytes(), 0u);
}

TEST(BlockCache, KeepsNoMoreThanItsCapacityAndHandsEverythingBack) {
  zt::detail::BlockCache cache(10000);
  int a = 0, b = 0, c = 0;
  EXPECT_TRUE(cache.put({&a, 4096, nullptr}));
  EXPECT_TRUE(cache.put({&b, 4096, nullptr}));
  EXPECT_FALSE(cache.put({&c, 4096, nullptr})) << "12288 bytes in a cache of 10000";
  EXPECT_FALSE(cache.put({&c, std::size_t{1} << 40, nullptr}));
  EXPECT_EQ(cache.cached_bytes(), 8192u);
  const std::vector<zt::detail::BlockCache::Block> all = cache.take_all();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(cache.cached_bytes(), 0u);
  EXPECT_FALSE(cache.take(4096, [](void*) { return true; }));
  zt::detail::BlockCache none(0);  // ZT_PINNED_CACHE_MB=0: nothing cached
  EXPECT_FALSE(none.put({&a, 4096, nullptr}));
}

TEST(Memory, ReportsWhatTheActivationCacheKeeps) {
  // Host activations of 64 KiB and more are cached when freed: reserved, not counted as in use.
  const std::size_t bytes = std::size_t{1} << 20;
  const zt::MemorySnapshot before = zt::memory_snapshot(zt::DeviceType::host);
  { zt::Buffer activations(zt::Device::host(), bytes, zt::MemoryCategory::activations); }
  const zt::MemorySnapshot freed = zt::memory_snapshot(zt::DeviceType::host);
  EXPECT_EQ(freed.total.current, before.total.current);
  EXPECT_GE(freed.cached, before.cached + bytes) << "the freed block is kept for reuse";
  { zt::Buffer again(zt::Device::host(), bytes, zt::MemoryCategory::activations); }
  EXPECT_EQ(zt::memory_snapshot(zt::DeviceType::host).cached, freed.cached) << "reused, not allocated anew";
  // Without a GPU nothing is reserved on one.
  if (!zt::cuda_status().usable()) {
    EXPECT_EQ(zt::memory_snapshot(zt::DeviceType::cuda).cached, 0u);
  }
}

TEST(Memory, ReleasingTheHostCacheFreesWhatItKeeps) {
  const std::size_t bytes = std::size_t{1} << 20;
  zt::Buffer live(zt::Device::host(), bytes, zt::MemoryCategory::activations);
  { zt::Buffer activations(zt::Device::host(), 2 * bytes, zt::MemoryCategory::activations); }
  ASSERT_GE(zt::memory_snapshot(zt::DeviceType::host).cached, 2 * bytes);
  zt::release_cached_memory(zt::DeviceType::host);
  EXPECT_EQ(zt::memory_snapshot(zt::DeviceType::host).cached, 0u);
  EXPECT_GE(zt::memory_snapshot(zt::DeviceType::host)[zt::MemoryCategory::activations].current, bytes)
      << "a live buffer is not the cache's";
  static_cast<unsigned char*>(live.data())[bytes - 1] = 1;  // still its owner's
  // Nothing cached, nothing to do: on a device without a cache, and without a GPU.
  zt::release_cached_memory(zt::DeviceType::emulated);
  zt::release_cached_memory(zt::DeviceType::cuda);
}

TEST(StreamMarks, TimeTheWorkWhereTheStreamRunsIt) {
  using namespace std::chrono_literals;
  // The host's stream runs work at the call: the clock at each mark.
  const zt::Stream host;
  zt::kernels::StreamMarks host_marks(host);
  host_marks.mark();
  std::this_thread::sleep_for(20ms);
  host_marks.mark();
  EXPECT_GE(host_marks.seconds_between(0, 1), 0.02);
  EXPECT_EQ(host_marks.seconds_between(1, 1), 0.0);

  // The emulated device queues work and runs it when the host waits: the marks time the queued
  // work, which the host only queued.
  const zt::Stream emulated(zt::Device::emulated());
  zt::kernels::StreamMarks marks(emulated);
  marks.mark();
  zt::detail::emulated_enqueue(zt::detail::emulated_queue_of(emulated),
                               [] { std::this_thread::sleep_for(30ms); });
  marks.mark();
  EXPECT_GE(marks.seconds_between(0, 1), 0.03) << "the work between the marks took 30 ms";
  marks.clear();
  EXPECT_EQ(marks.size(), 0u);
  EXPECT_EQ(marks.mark(), 0u) << "clear() starts the indices again";
  EXPECT_THROW(marks.seconds_between(0, 1), zt::Error) << "a mark that was not made";

  // A CUDA stream: timing events, the device's time between them.
  if (zt::cuda_status().usable()) {
    const zt::Stream cuda(zt::Device::cuda(0));
    const std::size_t bytes = std::size_t{64} << 20;
    zt::Buffer from(zt::Device::cuda(0), bytes), to(zt::Device::cuda(0), bytes);
    zt::kernels::StreamMarks device_marks(cuda);
    device_marks.mark();
    for (int i = 0; i < 4; ++i)
      zt::copy_bytes(to.data(), to.device(), from.data(), from.device(), bytes, &cuda);
    device_marks.mark();
    EXPECT_GT(device_marks.seconds_between(0, 1), 0.0) << "256 MiB copied between the marks";
  }
}

TEST(HostBuffer, TakesAStreamAndIgnoresItsOrder) {
  const zt::Stream host_stream;
  zt::Buffer buffer(zt::Device::host(), 256, zt::MemoryCategory::other, zt::kHostAlignment,
                    zt::HostMemoryKind::pageable, &host_stream);
  std::memset(buffer.data(), 1, buffer.size());
  zt::Buffer moved = std::move(buffer);
  EXPECT_EQ(moved.size(), 256u);
  EXPECT_EQ(static_cast<unsigned char*>(moved.data())[255], 1);
}

// ---- the device choice of zt::train (src/engine/device_choice.hpp), without a GPU -----------------

namespace {
zt::engine_detail::RankGpu gpu_rank(const std::string& host, int local_rank, int bound, const std::string& id,
                                    int visible = 2) {
  zt::engine_detail::RankGpu gpu;
  gpu.host = host;
  gpu.local_rank = local_rank;
  gpu.cuda_usable = true;
  gpu.visible_gpus = visible;
  gpu.bound_gpu = bound;
  gpu.gpu_id = id;
  return gpu;
}
zt::engine_detail::RankGpu no_gpu_rank(const std::string& host, int local_rank) {
  zt::engine_detail::RankGpu gpu;
  gpu.host = host;
  gpu.local_rank = local_rank;
  gpu.cuda_reason = "cudaGetDeviceCount: cudaErrorInsufficientDriver (35)";
  return gpu;
}
}  // namespace

TEST(DeviceChoice, HostIsAlwaysTheHost) {
  const std::vector ranks{no_gpu_rank("a", 0)};
  const auto decision = zt::engine_detail::decide_device(zt::DeviceChoice::host, ranks, 0, true);
  EXPECT_EQ(decision.device, zt::Device::host());
  EXPECT_TRUE(decision.notice.empty());
  EXPECT_TRUE(decision.error.empty());
}

TEST(DeviceChoice, AutoWithoutAGpuTrainsOnTheHostSilently) {
  const std::vector ranks{no_gpu_rank("a", 0), no_gpu_rank("a", 1)};
  const auto decision = zt::engine_detail::decide_device(zt::DeviceChoice::automatic, ranks, 1, true);
  EXPECT_EQ(decision.device, zt::Device::host());
  EXPECT_TRUE(decision.error.empty()) << decision.error;
  EXPECT_TRUE(decision.notice.empty())
      << "a machine without GPUs trains on the host without a word: " << decision.notice;
}

TEST(DeviceChoice, AutoTakesTheBoundGpuOnceTheEngineTrainsOnCuda) {
  const std::vector ranks{gpu_rank("a", 0, 0, "0000:01:00.0"), gpu_rank("a", 1, 1, "0000:02:00.0")};
  auto decision = zt::engine_detail::decide_device(zt::DeviceChoice::automatic, ranks, 1, true);
  EXPECT_EQ(decision.device, zt::Device::cuda(1));
  EXPECT_TRUE(decision.error.empty() && decision.notice.empty()) << decision.error << decision.notice;
  decision = zt::engine_detail::decide_device(zt::DeviceChoice::automatic, ranks, 1, false);
  EXPECT_EQ(decision.device, zt::Device::host());
  EXPECT_NE(decision.notice.find("has not yet been verified on a GPU"), std::string::npos) << decision.notice;
  // The build's record (kernels/gpu_path.hpp) says which applies: the CUDA engine has compiled but not
  // yet run on a GPU, so "auto" keeps to the host (a GPU session that records it as `ran` changes this).
  EXPECT_EQ(zt::kernels::gpu_path_state(zt::kernels::GpuPathPart::engine),
            zt::kernels::GpuPathState::compiled);
}

TEST(DeviceChoice, AutoBeforeTheEngineRanOnAGpuNeedsNoBoundGpu) {
  // `zerotrain train` binds no GPU when the choice cannot use one (device_choice_may_use_gpu), so
  // that no rank makes a CUDA context for nothing; "auto" still says that GPUs are left unused.
  const std::vector unbound{gpu_rank("a", 0, -1, "", 4), gpu_rank("a", 1, -1, "", 4)};
  for (int rank = 0; rank < 2; ++rank) {
    const auto decision = zt::engine_detail::decide_device(zt::DeviceChoice::automatic, unbound, rank, false);
    EXPECT_EQ(decision.device, zt::Device::host());
    EXPECT_TRUE(decision.error.empty()) << decision.error;
    EXPECT_EQ(
        decision.notice,
        "\"device\": \"auto\": rank 0 (host a, local rank 0) sees 4 GPU(s), but this build's training "
        "engine has not yet been verified on a GPU (zerotrain report, \"gpu path\"; \"device\": \"cuda\" "
        "or --device cuda uses it anyway); training on the host");
  }
  // Some ranks with a GPU and some without: the host too, named by the first that sees one.
  const std::vector mixed{no_gpu_rank("a", 0), gpu_rank("b", 0, -1, "", 1)};
  const auto decision = zt::engine_detail::decide_device(zt::DeviceChoice::automatic, mixed, 0, false);
  EXPECT_EQ(decision.device, zt::Device::host());
  EXPECT_TRUE(decision.error.empty()) << decision.error;
  EXPECT_NE(decision.notice.find("rank 1 (host b, local rank 0) sees 1 GPU(s)"), std::string::npos)
      << decision.notice;
  // What the CLI binds by: "host" never, "cuda" always, "auto" as the build's record says.
  EXPECT_FALSE(zt::device_choice_may_use_gpu(zt::DeviceChoice::host));
  EXPECT_TRUE(zt::device_choice_may_use_gpu(zt::DeviceChoice::cuda));
  EXPECT_EQ(zt::device_choice_may_use_gpu(zt::DeviceChoice::automatic),
            zt::kernels::gpu_path_state(zt::kernels::GpuPathPart::engine) == zt::kernels::GpuPathState::ran);
}

TEST(DeviceChoice, CudaWithoutAGpuNamesTheRankAndTheReason) {
  const std::vector ranks{gpu_rank("a", 0, 0, "0000:01:00.0"), no_gpu_rank("b", 0), no_gpu_rank("b", 1)};
  for (int rank = 0; rank < 3; ++rank) {  // the same verdict on every rank
    const auto decision = zt::engine_detail::decide_device(zt::DeviceChoice::cuda, ranks, rank, true);
    EXPECT_EQ(decision.error,
              "\"device\": \"cuda\": rank 1 (host b, local rank 0) has no usable GPU: cudaGetDeviceCount: "
              "cudaErrorInsufficientDriver (35) (2 of 3 ranks have none)");
  }
  // "auto" with GPUs on some ranks only cannot train on both kinds either.
  const auto mixed = zt::engine_detail::decide_device(zt::DeviceChoice::automatic, ranks, 0, true);
  EXPECT_NE(mixed.error.find("other ranks have one"), std::string::npos) << mixed.error;
  // A usable GPU the runtime did not bind (RuntimeOptions::bind_device = false).
  const std::vector unbound{gpu_rank("a", 0, -1, "")};
  EXPECT_NE(
      zt::engine_detail::decide_device(zt::DeviceChoice::cuda, unbound, 0, true).error.find("bind_device"),
      std::string::npos);
}

TEST(DeviceChoice, OneGpuPerNodeLocalRank) {
  // Three local ranks on two GPUs: the runtime binds local rank 2 to GPU 0 again.
  const std::vector ranks{gpu_rank("a", 0, 0, "0000:01:00.0"), gpu_rank("a", 1, 1, "0000:02:00.0"),
                          gpu_rank("a", 2, 0, "0000:01:00.0"), gpu_rank("b", 0, 0, "0000:01:00.0")};
  const auto decision = zt::engine_detail::decide_device(zt::DeviceChoice::cuda, ranks, 3, true);
  EXPECT_EQ(
      decision.error,
      "\"device\": \"cuda\": one GPU per node-local rank, but host a runs 3 ranks on 2 visible GPU(s): "
      "rank 0 (host a, local rank 0) and rank 2 (host a, local rank 2) would share GPU 0000:01:00.0; "
      "start at most 2 ranks per node (mpirun --map-by ppr:N:node, srun --ntasks-per-node) or make more "
      "GPUs visible");
  // One visible GPU per rank (CUDA_VISIBLE_DEVICES per rank): index 0 everywhere, distinct GPUs.
  const std::vector own{gpu_rank("a", 0, 0, "0000:01:00.0", 1), gpu_rank("a", 1, 0, "0000:02:00.0", 1)};
  const auto fine = zt::engine_detail::decide_device(zt::DeviceChoice::cuda, own, 1, true);
  EXPECT_TRUE(fine.error.empty()) << fine.error;
  EXPECT_EQ(fine.device, zt::Device::cuda(0));
}

TEST(DeviceChoice, RankDescriptionsRoundTripAsText) {
  zt::engine_detail::RankGpu gpu = no_gpu_rank("node-1.cluster", 3);
  gpu.cuda_reason = "a reason: with (parentheses), commas";
  const zt::engine_detail::RankGpu back = zt::engine_detail::RankGpu::from_text(gpu.to_text());
  EXPECT_EQ(back.host, gpu.host);
  EXPECT_EQ(back.local_rank, 3);
  EXPECT_FALSE(back.cuda_usable);
  EXPECT_EQ(back.cuda_reason, gpu.cuda_reason);
  EXPECT_EQ(back.bound_gpu, -1);
  const zt::engine_detail::RankGpu usable =
      zt::engine_detail::RankGpu::from_text(gpu_rank("h", 1, 1, "0000:02:00.0").to_text());
  EXPECT_TRUE(usable.cuda_usable);
  EXPECT_EQ(usable.gpu_id, "0000:02:00.0");
  EXPECT_EQ(usable.visible_gpus, 2);
  EXPECT_THROW(zt::engine_detail::RankGpu::from_text("too few"), zt::Error);
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

TEST(EmulatedDevice, DefaultStreamsAreOnePerDevice) {
  const zt::Stream& stream = zt::default_stream(kEmulated);
  EXPECT_EQ(&stream, &zt::default_stream(kEmulated));  // one per device, process-wide
  EXPECT_EQ(stream.device(), kEmulated);
  EXPECT_EQ(stream.native(), nullptr);
  EXPECT_EQ(zt::default_stream(zt::Device::host()).device(), zt::Device::host());
  EXPECT_NE(&zt::default_stream(zt::Device::emulated(1)), &stream);
  zt::Stream own(kEmulated);
  zt::Event event(kEmulated);
  event.record(own);
  EXPECT_TRUE(event.ready());  // nothing queued before it
  stream.wait(event);
  own.synchronize();
  event.synchronize();
  const std::string message = zt::testing::error_of([&] {
    zt::Event host_event;
    host_event.record(own);
  });
  EXPECT_NE(message.find("Event::record: a host event on a emulated:0 stream"), std::string::npos) << message;
}

/// `count` ints on the emulated device, each `value`, written at once (a stream-less copy).
zt::Buffer emulated_ints(std::size_t count, int value) {
  const std::vector<int> values(count, value);
  zt::Buffer buffer(kEmulated, count * sizeof(int));
  zt::copy_bytes(buffer.data(), kEmulated, values.data(), zt::Device::host(), buffer.size());
  return buffer;
}

/// Page-locked host memory as the emulated device's copies see it (the stand-in), whether or not a GPU
/// is usable here: a pinned Buffer made without a stream comes from CUDA's pinned cache where one is,
/// and the emulated device treats memory it did not pin as pageable (found by the CUDA-on-host build,
/// where these tests failed as they would have on the GPU machine). Allocated on a short-lived emulated
/// stream, so that the stand-in serves it; freed after the whole device (its queue is gone by then).
zt::Buffer emulated_pinned(std::size_t bytes) {
  const zt::Stream allocating(kEmulated);
  return zt::Buffer(zt::Device::host(), bytes, zt::MemoryCategory::other, zt::kHostAlignment,
                    zt::HostMemoryKind::pinned, &allocating);
}

/// The ints of an emulated buffer, read after everything queued (a stream-less copy).
std::vector<int> ints_of(const zt::Buffer& buffer) {
  std::vector<int> values(buffer.size() / sizeof(int));
  zt::copy_bytes(values.data(), zt::Device::host(), buffer.data(), kEmulated, buffer.size());
  return values;
}

/// Sets the emulated streams' order for one test.
class ScopedStreamOrder {
 public:
  explicit ScopedStreamOrder(zt::detail::EmulatedStreamOrder order)
      : previous_(zt::detail::emulated_stream_order()) {
    zt::detail::set_emulated_stream_order(order);
  }
  ~ScopedStreamOrder() { zt::detail::set_emulated_stream_order(previous_); }
  ScopedStreamOrder(const ScopedStreamOrder&) = delete;
  ScopedStreamOrder& operator=(const ScopedStreamOrder&) = delete;

 private:
  zt::detail::EmulatedStreamOrder previous_;
};

// The point of the queues: work read through another stream without an event between them has not
// run yet, every time, so a missing wait gives the wrong numbers on the CPU as on a GPU now and then.
TEST(EmulatedDevice, WorkOfAnotherStreamIsSeenOnlyAfterAnEvent) {
  const ScopedStreamOrder lazy(zt::detail::EmulatedStreamOrder::lazy);
  zt::Buffer device = emulated_ints(1000, 7);
  zt::Buffer pinned = emulated_pinned(device.size());
  EXPECT_TRUE(zt::detail::is_page_locked_stand_in(pinned.data()));
  std::fill_n(pinned.as<int>(), 1000, -1);
  const zt::Stream producer(kEmulated), consumer(kEmulated);
  zt::zero_bytes(device.data(), kEmulated, device.size(), &producer);
  zt::Event zeroed(kEmulated);
  zeroed.record(producer);
  EXPECT_FALSE(zeroed.ready());  // queued, not run

  // Without the wait: the consumer's copy runs before the zeroing.
  zt::copy_bytes(pinned.data(), zt::Device::host(), device.data(), kEmulated, device.size(), &consumer);
  EXPECT_EQ(pinned.as<int>()[0], -1);  // queued, not run
  consumer.synchronize();
  EXPECT_EQ(pinned.as<int>()[0], 7);
  EXPECT_EQ(pinned.as<int>()[999], 7);
  EXPECT_FALSE(zeroed.ready());  // the consumer ran only its own work

  // With it: the producer's work up to the event runs first.
  consumer.wait(zeroed);
  zt::copy_bytes(pinned.data(), zt::Device::host(), device.data(), kEmulated, device.size(), &consumer);
  consumer.synchronize();
  EXPECT_TRUE(zeroed.ready());
  EXPECT_EQ(pinned.as<int>()[0], 0);
  EXPECT_EQ(pinned.as<int>()[999], 0);
}

// The missing event the lazy order hides: the host waits for the writer first, and the reader on
// another stream runs only later, after it. The eager order runs the reader first.
TEST(EmulatedDevice, TheEagerOrderRunsOtherStreamsBeforeTheOneWaitedFor) {
  for (const auto order : {zt::detail::EmulatedStreamOrder::lazy, zt::detail::EmulatedStreamOrder::eager}) {
    const ScopedStreamOrder scoped(order);
    const bool eager = order == zt::detail::EmulatedStreamOrder::eager;
    SCOPED_TRACE(eager ? "eager" : "lazy");
    zt::Buffer device = emulated_ints(16, 7);
    zt::Buffer pinned = emulated_pinned(device.size());
    std::fill_n(pinned.as<int>(), 16, -1);
    const zt::Stream writer(kEmulated), reader(kEmulated);
    zt::zero_bytes(device.data(), kEmulated, device.size(), &writer);
    // No event: the copy may run before the zero on a GPU.
    zt::copy_bytes(pinned.data(), zt::Device::host(), device.data(), kEmulated, device.size(), &reader);
    writer.synchronize();
    EXPECT_EQ(pinned.as<int>()[0], eager ? 7 : -1);  // eager: the reader ran first, reading the 7s
    reader.synchronize();
    EXPECT_EQ(pinned.as<int>()[0], eager ? 7 : 0);  // lazy: it ran after the zero, hiding the bug

    // With the event, both orders give the zeroed values; the eager one stops at the wait.
    zt::Buffer again = emulated_ints(16, 7);
    zt::zero_bytes(again.data(), kEmulated, again.size(), &writer);
    zt::Event zeroed(kEmulated);
    zeroed.record(writer);
    reader.wait(zeroed);
    zt::copy_bytes(pinned.data(), zt::Device::host(), again.data(), kEmulated, again.size(), &reader);
    zt::Event copied(kEmulated);
    copied.record(reader);
    writer.synchronize();
    EXPECT_FALSE(copied.ready());  // the reader waits in front of its wait: not run ahead
    reader.synchronize();
    EXPECT_EQ(pinned.as<int>()[15], 0);
  }
}

TEST(EmulatedDevice, CopiesFollowCudaMemcpyAsync) {
  const ScopedStreamOrder lazy(zt::detail::EmulatedStreamOrder::lazy);
  zt::Buffer device = emulated_ints(4, 1);
  const zt::Stream stream(kEmulated);
  // From pageable memory the source is read at the call: the caller may reuse it at once.
  std::vector<int> pageable{10, 11, 12, 13};
  zt::copy_bytes(device.data(), kEmulated, pageable.data(), zt::Device::host(), device.size(), &stream);
  pageable.assign(4, -1);
  stream.synchronize();
  EXPECT_EQ(ints_of(device), (std::vector<int>{10, 11, 12, 13}));
  // From page-locked memory it is read when the copy runs, as a GPU's DMA does.
  zt::Buffer pinned = emulated_pinned(device.size());
  std::fill_n(pinned.as<int>(), 4, 20);
  zt::copy_bytes(device.data(), kEmulated, pinned.data(), zt::Device::host(), device.size(), &stream);
  pinned.as<int>()[2] = 22;  // before the copy ran: a GPU may read either; the emulation reads this
  stream.synchronize();
  EXPECT_EQ(ints_of(device), (std::vector<int>{20, 20, 22, 20}));
  // Into pageable memory the call returns with the copy done, after the stream's earlier work.
  zt::zero_bytes(device.data(), kEmulated, sizeof(int), &stream);
  std::vector<int> back(4, -1);
  zt::copy_bytes(back.data(), zt::Device::host(), device.data(), kEmulated, device.size(), &stream);
  EXPECT_EQ(back, (std::vector<int>{0, 20, 22, 20}));
  // Into page-locked memory it is written when the stream runs.
  std::fill_n(pinned.as<int>(), 4, -1);
  zt::copy_bytes(pinned.data(), zt::Device::host(), device.data(), kEmulated, device.size(), &stream);
  EXPECT_EQ(pinned.as<int>()[1], -1);
  zt::Event copied(kEmulated);
  copied.record(stream);
  EXPECT_FALSE(copied.ready());
  copied.synchronize();
  EXPECT_TRUE(copied.ready());
  EXPECT_EQ(pinned.as<int>()[1], 20);
}

// Stream-less calls and the default stream follow CUDA's legacy default stream: after every
// stream's queued work.
TEST(EmulatedDevice, StreamLessCallsAndTheDefaultStreamFollowEveryStream) {
  const ScopedStreamOrder lazy(zt::detail::EmulatedStreamOrder::lazy);
  zt::Buffer device = emulated_ints(8, 5);
  {
    const zt::Stream first(kEmulated), second(kEmulated);
    zt::zero_bytes(device.data(), kEmulated, 2 * sizeof(int), &first);
    zt::zero_bytes(device.as<int>() + 2, kEmulated, 2 * sizeof(int), &second);
    EXPECT_EQ(ints_of(device), (std::vector<int>{0, 0, 0, 0, 5, 5, 5, 5}));
    zt::zero_bytes(device.as<int>() + 4, kEmulated, 2 * sizeof(int), &first);
    std::vector<int> back(8, -1);
    zt::copy_bytes(back.data(), zt::Device::host(), device.data(), kEmulated, device.size(),
                   &zt::default_stream(kEmulated));
    EXPECT_EQ(back, (std::vector<int>{0, 0, 0, 0, 0, 0, 5, 5}));
    // Work queued on a stream that is destroyed still runs (at its destruction).
    zt::zero_bytes(device.as<int>() + 6, kEmulated, sizeof(int), &second);
  }
  EXPECT_EQ(ints_of(device), (std::vector<int>{0, 0, 0, 0, 0, 0, 0, 5}));
  // The default stream's wait for an event blocks until its work ran.
  const zt::Stream stream(kEmulated);
  zt::zero_bytes(device.as<int>() + 7, kEmulated, sizeof(int), &stream);
  zt::Event event(kEmulated);
  event.record(stream);
  zt::default_stream(kEmulated).wait(event);
  EXPECT_TRUE(event.ready());
}

TEST(EmulatedDevice, AQueuedFailureIsRethrownWhereTheHostWaits) {
  const zt::Stream stream(kEmulated);
  const std::uint64_t queue = zt::detail::emulated_queue_of(stream);
  ASSERT_NE(queue, 0u);
  bool later_ran = false;
  zt::detail::emulated_enqueue(queue, [] { throw zt::Error("the queued kernel failed"); });
  zt::detail::emulated_enqueue(queue, [&] { later_ran = true; });
  const std::string message = zt::testing::error_of([&] { stream.synchronize(); });
  EXPECT_NE(message.find("the queued kernel failed"), std::string::npos) << message;
  EXPECT_FALSE(later_ran);  // it would read what the failed kernel did not write
  stream.synchronize();     // reported once
  // A queued item waiting for work queued on its own stream after it would hang a GPU: an error.
  zt::detail::emulated_enqueue(
      queue, [queue] { zt::detail::emulated_run_until(queue, zt::detail::emulated_queue_position(queue)); });
  zt::detail::emulated_enqueue(queue, [] {});
  const std::string cycle = zt::testing::error_of([&] { stream.synchronize(); });
  EXPECT_NE(cycle.find("waits for work queued on the same stream after it"), std::string::npos) << cycle;
  // A stream-less call inside a queued item runs the other streams, not the item's own.
  zt::Buffer device = emulated_ints(2, 3);
  const zt::Stream other(kEmulated);
  zt::zero_bytes(device.data(), kEmulated, sizeof(int), &other);
  std::vector<int> seen;
  zt::detail::emulated_enqueue(queue, [&] { seen = ints_of(device); });
  stream.synchronize();
  EXPECT_EQ(seen, (std::vector<int>{0, 3}));
}

TEST(EmulatedDevice, StreamOrderedFreesWaitForTheStream) {
  const zt::Stream stream(kEmulated);
  zt::Buffer pinned = emulated_pinned(4 * sizeof(int));
  std::fill_n(pinned.as<int>(), 4, 9);
  zt::Buffer device(kEmulated, pinned.size(), zt::MemoryCategory::other, zt::kHostAlignment,
                    zt::HostMemoryKind::pageable, &stream);
  zt::copy_bytes(device.data(), kEmulated, pinned.data(), zt::Device::host(), pinned.size(), &stream);
  const void* address = device.data();
  device = zt::Buffer();  // freed in the stream's order: after the copy that reads it
  EXPECT_TRUE(zt::detail::is_emulated_device_address(address));
  const std::size_t live = zt::detail::emulated_device_region_count();
  stream.synchronize();
  EXPECT_EQ(zt::detail::emulated_device_region_count(), live - 1);
}

// cudaMallocFromPoolAsync's rule: memory allocated on a stream is usable by work ordered after the
// allocation. The stream's own later work and another stream's after an event may touch it.
TEST(EmulatedDevice, StreamOrderedAllocationsAreUsableAfterTheAllocationInStreamOrder) {
  for (const auto order : {zt::detail::EmulatedStreamOrder::lazy, zt::detail::EmulatedStreamOrder::eager}) {
    const ScopedStreamOrder scoped(order);
    const zt::Stream allocating(kEmulated), other(kEmulated);
    zt::Buffer device(kEmulated, 4 * sizeof(int), zt::MemoryCategory::other, zt::kHostAlignment,
                      zt::HostMemoryKind::pageable, &allocating);
    zt::zero_bytes(device.data(), kEmulated, device.size(), &allocating);  // its own stream: after it
    zt::Event allocated(kEmulated);
    allocated.record(allocating);
    other.wait(allocated);
    std::array<int, 4> values{1, 2, 3, 4};
    zt::copy_bytes(device.data(), kEmulated, values.data(), zt::Device::host(), device.size(), &other);
    other.synchronize();
    values.fill(0);
    zt::copy_bytes(values.data(), zt::Device::host(), device.data(), kEmulated, device.size());  // after all
    EXPECT_EQ(values, (std::array<int, 4>{1, 2, 3, 4}));
  }
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
  EXPECT_DEATH(static_cast<void>(*pointer), "access to emulated device memory at 0x");
  EXPECT_DEATH(*pointer = 1, "access to emulated device memory");
  // After an access closes, the memory is protected again.
  EXPECT_DEATH(
      {
        { const zt::detail::EmulatedDeviceAccess access; }
        static_cast<void>(*pointer);
      },
      "access to emulated device memory");
}

zt::Buffer stream_ordered_emulated_bytes(std::size_t bytes, const zt::Stream& stream) {
  return zt::Buffer(kEmulated, bytes, zt::MemoryCategory::other, zt::kHostAlignment,
                    zt::HostMemoryKind::pageable, &stream);
}

// Where a GPU's pool may hand a stream-ordered allocation memory that the allocating stream's earlier
// kernels still read, work of another stream not ordered after the allocation faults here, every time.
TEST(EmulatedDeviceDeathTest, AnotherStreamTouchingAStreamOrderedAllocationWithoutAnEventFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const ScopedStreamOrder lazy(zt::detail::EmulatedStreamOrder::lazy);
  EXPECT_DEATH(
      {
        const zt::Stream allocating(kEmulated);
        const zt::Stream other(kEmulated);
        auto device = stream_ordered_emulated_bytes(64, allocating);
        zt::zero_bytes(device.data(), kEmulated, device.size(), &other);
        other
            .synchronize();  // the lazy order runs `other` alone: `allocating` has not reached the allocation
      },
      "access to emulated device memory at 0x.*ordered after its allocation");
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
      "access to emulated device memory");
  EXPECT_DEATH(
      {
        zt::Buffer buffer(kEmulated, 4096);
        const zt::detail::EmulatedDeviceAccess access;
        static_cast<void>(buffer.as<volatile char>()[4096]);  // the page after the region
      },
      "access to emulated device memory");
}

}  // namespace
