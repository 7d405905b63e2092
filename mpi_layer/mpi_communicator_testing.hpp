// Test hooks of the MPI communicator (private; not installed).
#pragma once

#include <cstddef>

#include "zerotrain/communicator.hpp"

namespace zt::detail {

/// The largest element count the MPI backend passes to one MPI call (INT_MAX by default: MPI's
/// counts are int). Larger operations are split into chunks, or for reduce_scatter, all_gather
/// and all_gather_v fall back to per-root reduces/broadcasts. Lowering it lets tests exercise
/// those paths with small buffers. Every rank of the communicator must set the same value.
void set_mpi_max_chunk_elements(Communicator& communicator, std::size_t elements);

}  // namespace zt::detail
