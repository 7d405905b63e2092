// The caching policy of zerotrain's caching allocators, apart from the memory it caches, so that it
// is tested without a GPU (tests/unit/test_device.cpp): free blocks by size, each reusable once its
// fence (a CUDA event recorded where the last work on the block was queued, or none) is passed, up to
// a capacity. Not thread-safe: the allocator around it locks.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <vector>

namespace zt::detail {

/// The size a pinned host block is allocated with for a request of `bytes`: at least a page, powers
/// of two up to 4 MiB, then multiples of 2 MiB. Staging buffers come back with the same sizes, and
/// nearby sizes share a class, so that a cached block fits the next request; the rounding wastes at
/// most half a small block and 2 MiB of a large one (offload buffers are hundreds of MiB).
std::size_t pinned_size_class(std::size_t bytes);

class BlockCache {
 public:
  struct Block {
    void* pointer = nullptr;
    std::size_t size = 0;   // the size class it was allocated with
    void* fence = nullptr;  // must be passed before reuse; nullptr: reusable at once
  };
  /// Tells whether a fence is passed (cudaEventQuery); never called with nullptr.
  using FencePassed = std::function<bool(void* fence)>;

  explicit BlockCache(std::size_t capacity) : capacity_(capacity) {}

  /// A cached block of exactly `size` that can be reused now: the oldest without a fence or whose
  /// fence `passed` says is passed; its fence, if any, is returned with it for the caller to recycle.
  std::optional<Block> take(std::size_t size, const FencePassed& passed);
  /// Keeps `block` for reuse; false (nothing kept) when it would take the cache past its capacity,
  /// and then the caller frees the block (after its fence).
  bool put(const Block& block);
  /// Every cached block, which the cache forgets: for the caller to free (an allocation that failed
  /// retries after this; destruction).
  std::vector<Block> take_all();

  std::size_t cached_bytes() const { return cached_bytes_; }
  std::size_t capacity() const { return capacity_; }

 private:
  std::size_t capacity_;
  std::size_t cached_bytes_ = 0;
  std::multimap<std::size_t, Block> blocks_;  // by size; equal sizes in the order they were put
};

}  // namespace zt::detail
