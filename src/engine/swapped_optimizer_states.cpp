// Optimizer states in the NVMe swap file, by sub-group.
#include "src/engine/swapped_optimizer_states.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "base/round_up.hpp"
#include "src/engine/partition_plan.hpp"
#include "zerotrain/error.hpp"

namespace zt::engine_detail {

using base::round_up;

SwappedOptimizerStates::SwappedOptimizerStates(const SwappedStatesOptions& options)
    : arrays_(options.arrays), swap_(options.swap) {
  ZT_CHECK(options.arrays >= 1, "swapped optimizer states need at least one array per element");
  ZT_CHECK_AS(ConfigError, options.sub_group_elements > 0, "zero_optimization.sub_group_size is ",
              options.sub_group_elements, "; expected > 0");
  ZT_CHECK_AS(ConfigError, options.buffer_count >= 1, "zero_optimization.offload_optimizer.buffer_count is ",
              options.buffer_count, "; expected >= 1 (3 or more overlap reading, updating and writing)");
  std::size_t largest = 0;
  std::vector<std::pair<std::string, std::size_t>> tensors;
  std::vector<std::string> names;
  for (const SwapSubGroup& layout :
       swap_sub_groups(options.shard_elements, options.sub_group_elements, arrays_, swap_.alignment())) {
    SubGroup group;
    group.name = "optimizer.sub_group." + std::to_string(groups_.size());
    group.first = layout.first;
    group.count = layout.count;
    tensors.emplace_back(group.name, layout.bytes);
    largest = std::max(largest, layout.bytes);
    names.push_back(group.name);
    groups_.push_back(std::move(group));
  }
  // One reservation for the whole file, now: a disk too small fails here, saying what all of it needs.
  swap_.register_tensors(tensors);
  if (groups_.empty()) return;
  const std::size_t buffers = std::min<std::size_t>(options.buffer_count, groups_.size());
  buffer_bytes_ = buffers * round_up(largest, swap_.alignment());
  pipeline_ =
      std::make_unique<SwapPipeline>(swap_, std::move(names), buffers, MemoryCategory::optimizer_states);
}

SwappedOptimizerStates::~SwappedOptimizerStates() = default;

std::size_t SwappedOptimizerStates::array_stride_bytes(const SubGroup& group) const {
  return swap_array_stride(group.count, swap_.alignment());
}

SwapPipeline::Stats SwappedOptimizerStates::for_each_sub_group(const Work& work, bool write_back) {
  if (!pipeline_) return {};
  flush();  // the pipeline rewrites what the cache may hold
  std::vector<float*> arrays(arrays_);
  return pipeline_->run(
      [&](std::size_t index, std::span<std::byte> data) {
        const SubGroup& group = groups_[index];
        const std::size_t stride = array_stride_bytes(group);
        for (std::size_t k = 0; k < arrays_; ++k)
          arrays[k] = reinterpret_cast<float*>(data.data() + k * stride);
        work(group.first, group.count, arrays);
      },
      write_back);
}

float* SwappedOptimizerStates::cached(std::size_t group, std::size_t array) {
  if (cached_group_ == group && cached_array_ == array) return cache_.as<float>();
  write_back_cache();
  const SubGroup& sub_group = groups_[group];
  std::int64_t largest = 0;
  for (const SubGroup& g : groups_) largest = std::max(largest, g.count);
  if (cache_.empty()) {
    cache_ = swap_.allocate_buffer(static_cast<std::size_t>(largest) * sizeof(float),
                                   MemoryCategory::optimizer_states);
  }
  const std::uint64_t offset = swap_.slot(sub_group.name).offset + array * array_stride_bytes(sub_group);
  swap_.wait(swap_.read(offset, cache_.data(), static_cast<std::size_t>(sub_group.count) * sizeof(float)));
  cached_group_ = group;
  cached_array_ = array;
  return cache_.as<float>();
}

template <typename Copy>
void SwappedOptimizerStates::for_each_piece(std::size_t array, std::int64_t first, std::int64_t count,
                                            Copy&& copy) {
  ZT_CHECK(array < arrays_, "swapped optimizer states: array ", array, " of ", arrays_);
  ZT_CHECK(first >= 0 && count >= 0 &&
               (groups_.empty() ? first + count == 0
                                : first + count <= groups_.back().first + groups_.back().count),
           "swapped optimizer states: elements [", first, ", ", first + count, ") are outside the shard");
  std::int64_t done = 0;
  while (done < count) {
    const std::int64_t element = first + done;
    // Sub-groups are equal-sized except the last: the index is a division.
    const std::size_t group = static_cast<std::size_t>(element / groups_.front().count);
    const SubGroup& sub_group = groups_[group];
    const std::int64_t begin = element - sub_group.first;
    const std::int64_t take = std::min(count - done, sub_group.count - begin);
    copy(cached(group, array) + begin, done, take);
    done += take;
  }
}

void SwappedOptimizerStates::read(std::size_t array, std::int64_t first, std::int64_t count,
                                  float* destination) {
  for_each_piece(array, first, count, [&](float* cache, std::int64_t done, std::int64_t take) {
    std::copy_n(cache, take, destination + done);
  });
}

void SwappedOptimizerStates::write(std::size_t array, std::int64_t first, std::int64_t count,
                                   const float* source) {
  for_each_piece(array, first, count, [&](float* cache, std::int64_t done, std::int64_t take) {
    std::copy_n(source + done, take, cache);
    cache_dirty_ = true;
  });
}

void SwappedOptimizerStates::write_back_cache() {
  if (cache_dirty_ && cached_group_) {
    const SubGroup& group = groups_[*cached_group_];
    const std::uint64_t offset = swap_.slot(group.name).offset + cached_array_ * array_stride_bytes(group);
    swap_.wait(swap_.write(offset, cache_.data(), static_cast<std::size_t>(group.count) * sizeof(float)));
  }
  cache_dirty_ = false;
  cached_group_.reset();
}

void SwappedOptimizerStates::flush() {
  write_back_cache();
  cache_ = Buffer();
}

}  // namespace zt::engine_detail
