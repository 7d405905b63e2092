// ZeRO-Infinity's optimizer-state offload: this rank's fp32 arrays (the master in 16-bit training,
// the optimizer's moments) live in its NVMe swap file, split into sub-groups of the shard, and come
// into host memory one sub-group at a time (docs/offload.md, "The optimizer on NVMe").
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "zerotrain/device.hpp"
#include "zerotrain/swap.hpp"

namespace zt::engine_detail {

struct SwappedStatesOptions {
  SwapOptions swap;
  std::int64_t shard_elements = 0;      // elements of the rank's shard
  std::size_t arrays = 0;               // fp32 arrays per element: master (16-bit training) + states
  std::int64_t sub_group_elements = 0;  // zero_optimization.sub_group_size
  std::size_t buffer_count = 4;         // offload_optimizer.buffer_count
};

/// The arrays of a sub-group are stored one after the other, each starting at a multiple of the
/// swap file's O_DIRECT alignment, so that one array of one sub-group can be read on its own
/// (checkpoints read and write one array at a time).
class SwappedOptimizerStates {
 public:
  /// work(first, count, arrays): shard elements [first, first + count), arrays[k] = array k of them.
  using Work = std::function<void(std::int64_t first, std::int64_t count, std::span<float* const> arrays)>;

  /// Creates the swap file and reserves every sub-group on disk (a bad nvme_path or a disk too
  /// small fails here, with the swap engine's message). The pipeline's host buffers are allocated
  /// as MemoryCategory::optimizer_states: they are where the states are while in memory.
  explicit SwappedOptimizerStates(const SwappedStatesOptions& options);
  ~SwappedOptimizerStates();
  SwappedOptimizerStates(const SwappedOptimizerStates&) = delete;
  SwappedOptimizerStates& operator=(const SwappedOptimizerStates&) = delete;

  /// Every sub-group in shard order through the double-buffered pipeline: sub-group i+1 is read
  /// and i-1 written while `work` runs on i. With write_back = false nothing is written.
  SwapPipeline::Stats for_each_sub_group(const Work& work, bool write_back = true);

  /// Random access to elements [first, first + count) of one array, through a cache of one
  /// sub-group's array (in shard order each is read once). write() changes the cache; flush()
  /// writes it back and releases the cache's memory.
  void read(std::size_t array, std::int64_t first, std::int64_t count, float* destination);
  void write(std::size_t array, std::int64_t first, std::int64_t count, const float* source);
  void flush();

  std::size_t sub_group_count() const { return groups_.size(); }
  std::size_t arrays() const { return arrays_; }
  /// Bytes reserved in the swap file.
  std::uint64_t swap_bytes() const { return swap_.reserved_bytes(); }
  /// Host bytes of the pipeline's buffers.
  std::uint64_t buffer_bytes() const { return buffer_bytes_; }
  const SwapEngine& swap() const { return swap_; }

 private:
  struct SubGroup {
    std::string name;  // of its swap tensor
    std::int64_t first = 0;
    std::int64_t count = 0;
  };
  std::size_t array_stride_bytes(const SubGroup& group) const;
  /// Make the cache hold `array` of sub-group `group`; returns its floats.
  float* cached(std::size_t group, std::size_t array);
  void write_back_cache();
  template <typename Copy>
  void for_each_piece(std::size_t array, std::int64_t first, std::int64_t count, Copy&& copy);

  std::size_t arrays_;
  SwapEngine swap_;
  std::vector<SubGroup> groups_;
  std::unique_ptr<SwapPipeline> pipeline_;
  std::uint64_t buffer_bytes_ = 0;
  Buffer cache_;  // empty when released
  std::optional<std::size_t> cached_group_;
  std::size_t cached_array_ = 0;
  bool cache_dirty_ = false;
};

}  // namespace zt::engine_detail
