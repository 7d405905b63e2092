// Software prefetch for the streaming host kernels (the fused AdamW update, and its bytes-moved anchor
// in bench/adamw_anchor.hpp).
//
// They walk each span in chunks of kPrefetchChunk elements and, before a chunk's vector loop, prefetch
// every stream kPrefetchDistance elements ahead. Two cores of the development machine's EPYC do not keep
// enough misses in flight from the hardware prefetchers alone: with AdamW's four streams, 2 KiB of
// fp32 ahead made it 1.13-1.18x faster than the same loop without (interleaved in one process,
// docs/benchmarks.md "Host AdamW"). A prefetch only moves data into the caches: the results are the
// same bits with or without it.
#pragma once

#include <cstddef>

namespace zt::kernels::host {

inline constexpr std::size_t kPrefetchChunk = 64;
inline constexpr std::size_t kPrefetchDistance = 512;

/// Prefetch the kPrefetchChunk elements of `data` that start kPrefetchDistance after `index`, when they
/// lie inside [0, count) (so no pointer past the array is formed). Non-temporal hint: the data streams
/// through once and should not push the rest of the working set out of the outer caches.
template <typename T>
[[gnu::always_inline]] inline void prefetch_ahead(const T* data, std::size_t index, std::size_t count) {
  constexpr std::size_t kLine = 64;
  const std::size_t first = index + kPrefetchDistance;
  if (first + kPrefetchChunk > count) return;
  const char* bytes = reinterpret_cast<const char*>(data + first);
  for (std::size_t offset = 0; offset < kPrefetchChunk * sizeof(T); offset += kLine)
    __builtin_prefetch(bytes + offset, 0, 0);
}

}  // namespace zt::kernels::host
