// The caching allocators' policy (kernels/block_cache.hpp).
#include "kernels/block_cache.hpp"

#include <bit>

namespace zt::detail {

std::size_t pinned_size_class(std::size_t bytes) {
  constexpr std::size_t kPage = 4096;
  constexpr std::size_t kLargeStep = std::size_t{2} << 20;
  constexpr std::size_t kLargeFrom = std::size_t{4} << 20;
  if (bytes <= kPage) return kPage;
  if (bytes <= kLargeFrom) return std::bit_ceil(bytes);
  return (bytes + kLargeStep - 1) / kLargeStep * kLargeStep;
}

std::optional<BlockCache::Block> BlockCache::take(std::size_t size, const FencePassed& passed) {
  const auto [first, last] = blocks_.equal_range(size);
  for (auto it = first; it != last; ++it) {
    if (it->second.fence != nullptr && !passed(it->second.fence)) continue;
    const Block block = it->second;
    blocks_.erase(it);
    cached_bytes_ -= block.size;
    return block;
  }
  return std::nullopt;
}

bool BlockCache::put(const Block& block) {
  if (block.size > capacity_ || cached_bytes_ > capacity_ - block.size) return false;
  blocks_.emplace(block.size, block);
  cached_bytes_ += block.size;
  return true;
}

std::vector<BlockCache::Block> BlockCache::take_all() {
  std::vector<Block> all;
  all.reserve(blocks_.size());
  for (const auto& [size, block] : blocks_) all.push_back(block);
  blocks_.clear();
  cached_bytes_ = 0;
  return all;
}

}  // namespace zt::detail
