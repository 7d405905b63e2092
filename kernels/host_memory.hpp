// Host memory blocks of the device layer (kernels/device.cpp): how pageable host Buffers and the
// activation cache get their memory.
//
// Blocks of kHostHugePageMinimumBytes and more (parameters, gradients, optimizer states, flat
// partitions, large activations) are aligned to 2 MiB and their whole 2 MiB pages advised as
// transparent huge pages (madvise(MADV_HUGEPAGE)), so that on a kernel whose THP mode is `madvise`
// (the usual default) or `always` they are backed by 2 MiB pages. Streaming kernels walk several
// arrays at once, and on 4 KiB pages every 4 KiB of each costs a TLB miss and a page walk
// (two-dimensional under a hypervisor), and the hardware prefetchers of many x86 cores stop at 4 KiB
// boundaries: the fused AdamW update ran 1.1-1.4x faster on huge pages on the avx512 path, 1.8-2.5x
// on the avx2 and baseline paths (docs/benchmarks.md, "Host AdamW"). The tail past the last whole
// 2 MiB page stays on 4 KiB pages (no rounding: a page faulted in whole that the block does not fill
// would be resident for nothing), and freeing withdraws the advice (MADV_NOHUGEPAGE), since the heap
// keeps the range and reuses it in small pieces (free_host_block). ZT_HOST_HUGE_PAGES=0
// turns it off (read at every such allocation); under THP `never` the advice does nothing.
// Workspace (MemoryCategory::workspace: one kernel call's temporaries) never takes huge pages: its
// blocks live for one call and are often touched in part (oneDNN's scratchpads), so a 2 MiB page
// faulted in whole would be resident for nothing.
#pragma once

#include <cstddef>
#include <string>

namespace zt {

inline constexpr std::size_t kHostHugePageBytes = std::size_t{2} << 20;
inline constexpr std::size_t kHostHugePageMinimumBytes = std::size_t{4} << 20;

/// False when ZT_HOST_HUGE_PAGES=0.
bool host_huge_pages_enabled();

/// The policy and what this kernel makes of it, for `zerotrain report` and the benchmarks.
std::string host_huge_pages_description();

/// aligned_alloc(alignment, bytes rounded up to the alignment), with the huge-page alignment and
/// advice above for blocks of kHostHugePageMinimumBytes and more unless huge_pages is false; null when
/// out of memory. Free it with free_host_block.
void* allocate_host_block(std::size_t bytes, std::size_t alignment, bool huge_pages = true);

/// Withdraw the huge-page advice of a block of `bytes` (the size it was allocated with, and the same
/// huge_pages) and free it. Under THP `always` the range then stays on 4 KiB pages until a block is
/// advised there again.
void free_host_block(void* pointer, std::size_t bytes, bool huge_pages = true) noexcept;

}  // namespace zt
