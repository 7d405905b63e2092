// ZeRO-3's parameter store with the pieces on NVMe (src/engine/parameter_store.*): every read returns
// the last value written, whatever the order of prefetches, acquires, updates and commits and
// however few buffers there are, with real O_DIRECT files; pieces within max_in_cpu stay in host
// memory; reads are counted once; the swap file goes away with the store; with the engine on the
// emulated device, the pieces come from its shard and go to its memory (copy_to_device).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "src/engine/parameter_store.hpp"
#include "swap_test_fixtures.hpp"
#include "test_helpers.hpp"
#include "zerotrain/execution.hpp"

namespace {

using zt::engine_detail::ParameterStore;
using zt::engine_detail::ParameterStoreOptions;

/// Pieces of awkward sizes (fp32 elements), as one rank's shard.
std::vector<zt::FlatParameter> shard_layout() {
  const std::int64_t sizes[] = {1, 1000, 1025, 4096, 3, 20000, 777, 65536, 5, 12345, 2048, 1};
  std::vector<zt::FlatParameter> layout;
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < std::size(sizes); ++i) {
    zt::FlatParameter slot;
    slot.name = "p";  // appended: GCC 12 warns falsely on "literal" + string
    slot.name += std::to_string(i);
    slot.numel = slot.piece_numel = slot.padded_numel = sizes[i];
    slot.shape = {sizes[i]};
    slot.offset = slot.shard_offset = offset;
    offset += sizes[i];
    layout.push_back(slot);
  }
  return layout;
}

ParameterStoreOptions nvme_options(const std::filesystem::path& directory, std::size_t buffers,
                                   std::int64_t max_in_cpu) {
  ParameterStoreOptions options;
  options.dtype = zt::DType::fp32;
  options.swap = zt::SwapOptions{};
  options.swap->nvme_path = directory;
  options.swap->block_size = 8192;  // many kernel requests per piece
  options.swap->queue_depth = 4;
  options.swap->rank = 0;
  options.max_in_cpu = max_in_cpu;
  options.buffer_count = buffers;
  return options;
}

std::vector<float> random_piece(std::mt19937& generator, std::int64_t count) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> values(static_cast<std::size_t>(count));
  for (float& value : values) value = uniform(generator);
  return values;
}

TEST(ParameterStore, EveryReadSeesTheLastWriteUnderRandomOperations) {
  const std::vector<zt::FlatParameter> layout = shard_layout();
  std::int64_t total = 0;
  for (const auto& slot : layout) total += slot.piece_numel;
  for (std::size_t buffers : {1u, 2u, 3u, 5u}) {
    for (std::int64_t max_in_cpu : {std::int64_t{0}, std::int64_t{25000}}) {
      SCOPED_TRACE(std::to_string(buffers) + " buffers, max_in_cpu " + std::to_string(max_in_cpu));
      zt::testing::TestDirectory directory;
      std::mt19937 generator(static_cast<std::uint32_t>(buffers * 7 + static_cast<std::size_t>(max_in_cpu)));
      std::vector<std::vector<float>> expected;
      std::vector<float> initial;
      for (const auto& slot : layout) {
        expected.push_back(random_piece(generator, slot.piece_numel));
        initial.insert(initial.end(), expected.back().begin(), expected.back().end());
      }
      ParameterStore store(layout, nvme_options(directory.path(), buffers, max_in_cpu),
                           reinterpret_cast<const std::byte*>(initial.data()));
      EXPECT_EQ(store.host_elements() + store.nvme_elements(), total);
      std::size_t swapped = 0;
      for (std::size_t i = 0; i < layout.size(); ++i) {
        if (store.on_nvme(i)) {
          ++swapped;
        } else {
          EXPECT_LE(layout[i].piece_numel, max_in_cpu);
        }
      }
      EXPECT_EQ(store.buffer_count(), std::min(buffers, swapped));
      if (max_in_cpu == 0) {
        EXPECT_EQ(store.host_elements(), 0);
      } else {
        EXPECT_GT(store.host_elements(), 0);
        EXPECT_GT(swapped, 0u);
      }

      std::uniform_int_distribution<std::size_t> piece(0, layout.size() - 1);
      std::uniform_int_distribution<int> operation(0, 9);
      for (int step = 0; step < 400; ++step) {
        const std::size_t i = piece(generator);
        const std::size_t bytes = static_cast<std::size_t>(layout[i].piece_numel) * sizeof(float);
        switch (operation(generator)) {
          case 0:
          case 1:
          case 2:
            store.prefetch(i, /*speculative=*/step % 2 == 0);
            break;
          case 3:
          case 4:
          case 5: {  // a gather copies the piece
            const std::byte* data = store.acquire(i);
            EXPECT_EQ(std::memcmp(data, expected[i].data(), bytes), 0) << "piece " << i << ", step " << step;
            store.release(i);
            break;
          }
          case 6:
          case 7: {  // an update writes a new value, in two parts as a split range would
            expected[i] = random_piece(generator, layout[i].piece_numel);
            const std::size_t half = bytes / sizeof(float) / 2 * sizeof(float);
            std::memcpy(store.update_target(i), expected[i].data(), half);
            std::memcpy(store.update_target(i) + half,
                        reinterpret_cast<const std::byte*>(expected[i].data()) + half, bytes - half);
            store.commit(i);
            break;
          }
          case 8:
            store.finish_updates();
            break;
          default: {  // checkpoint load and a synchronous read
            expected[i] = random_piece(generator, layout[i].piece_numel);
            store.write(i, expected[i].data());
            std::vector<float> back(expected[i].size());
            store.read(i, back.data());
            EXPECT_EQ(back, expected[i]) << "piece " << i << ", step " << step;
            break;
          }
        }
      }
      store.finish_updates();
      for (std::size_t i = 0; i < layout.size(); ++i) {
        std::vector<float> back(expected[i].size());
        store.read(i, back.data());
        EXPECT_EQ(back, expected[i]) << "piece " << i << " at the end";
      }
      EXPECT_GT(store.stats().bytes_written, 0u);
      EXPECT_EQ(directory.file_count(), 1u) << "one swap file";
    }
  }
}

TEST(ParameterStore, SpeculativeReadsLeaveABufferAndPiecesAreReadOnce) {
  const std::vector<zt::FlatParameter> layout = shard_layout();
  zt::testing::TestDirectory directory;
  std::vector<float> initial;
  for (const auto& slot : layout)
    initial.resize(initial.size() + static_cast<std::size_t>(slot.piece_numel), 1.5f);
  {
    ParameterStore store(layout, nvme_options(directory.path(), 2, 0),
                         reinterpret_cast<const std::byte*>(initial.data()));
    // The initial writes leave their last two pieces cached; another piece then takes a buffer.
    EXPECT_TRUE(store.prefetch(0, /*speculative=*/true));
    EXPECT_FALSE(store.prefetch(1, /*speculative=*/true)) << "a speculative read must leave one buffer";
    EXPECT_TRUE(store.prefetch(1)) << "a needed read takes the last buffer";
    EXPECT_FALSE(store.prefetch(2)) << "both buffers hold pieces not used yet";
    const std::uint64_t reads = store.stats().reads;
    for (std::size_t index : {0u, 1u}) {
      EXPECT_EQ(*reinterpret_cast<const float*>(store.acquire(index)), 1.5f);
      store.release(index);
    }
    EXPECT_EQ(store.stats().reads, reads) << "prefetched pieces are not read again";
    store.acquire(1);
    store.release(1);
    EXPECT_EQ(store.stats().cache_hits, 1u);
  }
  EXPECT_EQ(directory.file_count(), 0u) << "the swap file goes with the store";
}

/// The engine on the emulated device (memory only the device API may touch): the first values come
/// from the shard on the device, copy_to_device() brings every piece (on NVMe, through the transfer
/// stream, or kept in host memory: page-locked with pin_memory, through the transfer stream too) into
/// device memory, and after new values are written (update_target, commit) it brings those, with 1
/// and 2 buffers.
TEST(ParameterStore, CopiesPiecesToTheEngineDevice) {
  const std::vector<zt::FlatParameter> layout = shard_layout();
  const zt::ExecutionContext device(zt::Device::emulated());
  std::int64_t shard_elements = 0;
  for (const auto& slot : layout) shard_elements += slot.piece_numel;
  const auto shard_bytes = static_cast<std::size_t>(shard_elements) * sizeof(float);
  std::mt19937 generator(7);
  for (std::size_t buffers : {1u, 2u}) {
    for (std::int64_t max_in_cpu : {std::int64_t{0}, std::int64_t{3000}}) {
      for (bool pin_memory : {false, true}) {
        SCOPED_TRACE(std::to_string(buffers) + " buffer(s), max_in_cpu " + std::to_string(max_in_cpu) +
                     (pin_memory ? ", pin_memory" : ""));
        zt::testing::TestDirectory directory;
        const std::vector<float> initial = random_piece(generator, shard_elements);
        zt::Buffer device_shard = device.allocate(shard_bytes);
        device.from_host(device_shard.data(), initial.data(), shard_bytes);
        ParameterStoreOptions options = nvme_options(directory.path(), buffers, max_in_cpu);
        options.pin_memory = pin_memory;
        ParameterStore store(layout, options, device_shard.as<const std::byte>(), device);
        EXPECT_EQ(store.device(), zt::Device::host());
        EXPECT_EQ(store.host_elements() > 0, max_in_cpu > 0);
        EXPECT_EQ(store.kept_pieces_pinned(), pin_memory && max_in_cpu > 0);
        // Every piece into one device buffer, then back to the host to compare: the initial values.
        zt::Buffer copied = device.allocate(shard_bytes);
        auto copy_all = [&] {
          for (std::size_t i = 0; i < layout.size(); ++i) {
            store.prefetch(i);
            // Swapped pieces come from a pool buffer on the transfer stream; kept pieces too when they
            // are page-locked, else on the compute stream.
            EXPECT_EQ(store.copy_to_device(i, copied.as<float>() + layout[i].shard_offset),
                      store.on_nvme(i) || pin_memory)
                << layout[i].name;
          }
          device.compute_waits_for_transfers();  // what reads them next waits for the transfers
          std::vector<float> values(static_cast<std::size_t>(shard_elements));
          device.to_host(values.data(), copied.data(), shard_bytes);
          return values;
        };
        EXPECT_EQ(copy_all(), initial);
        // New values of every piece, as the host optimizer writes them.
        std::vector<float> updated = random_piece(generator, shard_elements);
        for (std::size_t i = 0; i < layout.size(); ++i) {
          std::memcpy(store.update_target(i), updated.data() + layout[i].shard_offset,
                      static_cast<std::size_t>(layout[i].piece_numel) * sizeof(float));
          store.commit(i);
        }
        store.finish_updates();
        EXPECT_EQ(copy_all(), updated);
      }
    }
  }
}

TEST(ParameterStore, ABufferSmallerThanAPieceIsAClearError) {
  const std::vector<zt::FlatParameter> layout = shard_layout();
  zt::testing::TestDirectory directory;
  std::vector<float> initial(100000, 0.0f);
  ParameterStoreOptions options = nvme_options(directory.path(), 2, 0);
  options.buffer_elements = 1000;
  const std::string message = zt::testing::error_of(
      [&] { ParameterStore store(layout, options, reinterpret_cast<const std::byte*>(initial.data())); });
  EXPECT_NE(
      message.find("offload_param.buffer_size is 1000 elements, but this rank's piece of parameter 'p7'"),
      std::string::npos)
      << message;
  EXPECT_EQ(directory.file_count(), 0u) << "nothing left behind";
}

}  // namespace
