// Test hooks of the MPI communicator (private; not installed).
#pragma once

#include <cstddef>

#include "zerotrain/communicator.hpp"

namespace zt::detail {

/// The largest element count the MPI backend passes to one MPI call (INT_MAX by default: MPI's
/// counts are int). Larger operations are split into chunks, or for all_gather and all_gather_v fall
/// back to per-root broadcasts (reduce_scatter takes its ring). Lowering it lets tests exercise
/// those paths with small buffers. Every rank of the communicator must set the same value.
void set_mpi_max_chunk_elements(Communicator& communicator, std::size_t elements);

/// When reduce_scatter runs as zerotrain's ring over point-to-point messages instead of
/// MPI_(I)reduce_scatter_block, and how the ring pipelines (mpi_communicator.cpp, docs/communication.md).
struct RingReduceScatterSettings {
  /// Inputs (size() * recv_count elements) of at least this many bytes take the ring; so does every
  /// input beyond the chunk limit above. Below it MPI's temporaries (up to twice the input) stay
  /// under 2 MiB, and MPI was as fast or faster there (docs/benchmarks.md, "reduce-scatter ring").
  std::size_t min_bytes = std::size_t{1} << 20;
  /// Bytes per message (a column of every block); never more than the chunk limit's elements.
  std::size_t chunk_bytes = std::size_t{1} << 20;
  /// Columns in flight at once; scratch is at most 2 x lanes x chunk_bytes per operation (one slot
  /// per lane at 2 ranks).
  int lanes = 4;
};

/// Replace the defaults above (tests lower min_bytes and chunk_bytes to run the ring on small
/// buffers). Every rank of the communicator must set the same values.
void set_mpi_ring_reduce_scatter(Communicator& communicator, const RingReduceScatterSettings& settings);

}  // namespace zt::detail
