// tests/cuda_on_host's stand-in for CUB's DeviceRadixSort::SortPairs, which layers.cu calls between its
// own kernels (the embedding gradient): the same contract on the host (a stable sort of (key, value)
// pairs by the key bits [begin_bit, end_bit), signed keys in numeric order; a first call with no
// temporary storage asks for its size), so the kernels around it run on what CUB would give them. It sorts as
// device work in the stream's order (cuda_fibers_streams.hpp).
// CUB itself is not under test here.
#pragma once

#include <cuda_runtime.h>

#include "cuda_fibers_streams.hpp"

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <type_traits>
#include <vector>

namespace cub {

struct DeviceRadixSort {
  template <typename Key, typename Value>
  static cudaError_t SortPairs(void* temporary, std::size_t& temporary_bytes, const Key* keys_in,
                               Key* keys_out, const Value* values_in, Value* values_out, int items,
                               int begin_bit = 0, int end_bit = static_cast<int>(sizeof(Key) * 8),
                               cudaStream_t stream = nullptr) {
    static_assert(std::is_integral_v<Key>, "the stand-in sorts integer keys");
    if (temporary == nullptr) {
      temporary_bytes = 1;
      return cudaSuccess;
    }
    if (begin_bit != 0 || end_bit != static_cast<int>(sizeof(Key) * 8)) return cudaErrorInvalidValue;
    // Device work in the stream's order, as CUB's kernels are.
    ::cuda_fibers::enqueue(stream, "cub::DeviceRadixSort::SortPairs",
                           [=] { sort_pairs(keys_in, keys_out, values_in, values_out, items); });
    return cudaSuccess;
  }

 private:
  template <typename Key, typename Value>
  static void sort_pairs(const Key* keys_in, Key* keys_out, const Value* values_in, Value* values_out,
                         int items) {
    std::vector<std::size_t> order(static_cast<std::size_t>(items));
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return keys_in[a] < keys_in[b]; });
    std::vector<Key> keys(order.size());
    std::vector<Value> values(order.size());
    for (std::size_t i = 0; i < order.size(); ++i) {
      keys[i] = keys_in[order[i]];
      values[i] = values_in[order[i]];
    }
    std::copy(keys.begin(), keys.end(), keys_out);
    std::copy(values.begin(), values.end(), values_out);
  }
};

}  // namespace cub
