// The process grid as the engine sees it: data, pipeline and tensor groups, each with a
// communicator for host buffers (MPI) and one for buffers in the engine's device memory: the same
// MPI communicator when the engine computes on the host; for a group of one rank on a device, a
// single-rank communicator whose collectives are copies on the compute stream; else the emulated
// device's on that device, and on a GPU a NCCL communicator ordered with the execution context's
// compute stream by events
// (collectives wait on the device for the kernels queued before them, and kernels queued after a
// wait for them; the host never waits for a collective: nccl_communicator.hpp). Reductions name
// the groups they span.
// Internal to the engine (docs/architecture.md, "The engine's seams").
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "zerotrain/communicator.hpp"
#include "zerotrain/device.hpp"
#include "zerotrain/execution.hpp"
#include "zerotrain/process_grid.hpp"

namespace zt {
class Runtime;
}

namespace zt::engine_detail {

/// A set of groups a reduction spans.
enum class GroupSpan : std::uint8_t {
  none = 0,
  data = 1,
  tensor = 2,
  pipeline = 4,
};
constexpr GroupSpan operator|(GroupSpan a, GroupSpan b) {
  return static_cast<GroupSpan>(static_cast<std::uint8_t>(a) | static_cast<std::uint8_t>(b));
}
constexpr bool spans(GroupSpan set, GroupSpan group) {
  return (static_cast<std::uint8_t>(set) & static_cast<std::uint8_t>(group)) != 0;
}

class ParallelContext {
 public:
  struct Group {
    Communicator* host = nullptr;    // MPI: host buffers
    Communicator* device = nullptr;  // buffers in the engine's device memory
    int size() const { return host->size(); }
    int rank() const { return host->rank(); }
  };

  /// The groups of `grid`; without one, a data-parallel-only grid over `data_parallel`, or, when
  /// that is null too, a grid of `pipeline_stages` stages over the runtime's world (data: the rest).
  /// Device communicators are made for `execution`'s device (collectively over each group), and
  /// on a GPU ordered with its compute stream; `execution` must outlive the context.
  ParallelContext(Runtime& runtime, ProcessGrid* grid, Communicator* data_parallel,
                  const ExecutionContext& execution, int pipeline_stages = 1);
  ~ParallelContext();
  ParallelContext(const ParallelContext&) = delete;
  ParallelContext& operator=(const ParallelContext&) = delete;

  const Group& data() const { return data_; }
  const Group& tensor() const { return tensor_; }
  const Group& pipeline() const { return pipeline_; }
  /// Every rank of the grid, for collectives that involve them all (checkpoint files).
  Communicator& everyone() const { return *everyone_; }
  MPI_Comm everyone_comm() const;

  /// values[i] = sum over the ranks of the groups in `span` (one after another, data first), in
  /// place, on buffers in the engine's device memory. Groups of one rank are skipped.
  void sum(void* values, std::size_t count, DType type, GroupSpan span) const;

  /// A new group of the ranks that pass the same `color` (>= 0; a negative color: not a member,
  /// the result's communicators are null), owned by the context. Collective over everyone().
  Group split(int color, const std::string& name);

 private:
  Group group_of(Communicator& host, const char* name);

  std::unique_ptr<ProcessGrid> own_grid_;                 // when the engine made its own
  std::vector<std::unique_ptr<Communicator>> own_comms_;  // size-1 groups, device communicators
  const ExecutionContext& execution_;
  Group data_;
  Group tensor_;
  Group pipeline_;
  Communicator* everyone_ = nullptr;
};

}  // namespace zt::engine_detail
