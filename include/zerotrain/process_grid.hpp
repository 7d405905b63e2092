// Data x pipeline x tensor parallel process grid.
//
// Rank order (tensor fastest, then data, then pipeline):
//   world_rank = pipeline_index * (data * tensor) + data_index * tensor + tensor_index
// so tensor-parallel groups are consecutive ranks (same node when possible) and each pipeline
// stage is a contiguous block of data x tensor ranks.
#pragma once

#include <mpi.h>

#include <memory>

#include "zerotrain/communicator.hpp"

namespace zt {

class Runtime;

struct GridShape {
  int data = 1;
  int pipeline = 1;
  int tensor = 1;
  int product() const { return data * pipeline * tensor; }
};

struct GridCoordinates {
  int data = 0;
  int pipeline = 0;
  int tensor = 0;
};

class ProcessGrid {
 public:
  /// Split the runtime's world (all of MPI_COMM_WORLD, or the communicator of a runtime over a
  /// sub-communicator; world ranks are ranks in it) into the grid. data <= 0 means "what is left": world /
  /// (pipeline * tensor). A shape whose product is not the world size is an error that names the sizes.
  ProcessGrid(Runtime& runtime, GridShape shape);
  ProcessGrid(const ProcessGrid&) = delete;
  ProcessGrid& operator=(const ProcessGrid&) = delete;
  ~ProcessGrid();

  const GridShape& shape() const { return shape_; }
  const GridCoordinates& coordinates() const { return coordinates_; }
  /// World rank of the process at the given coordinates.
  int world_rank_of(GridCoordinates at) const;
  static GridCoordinates coordinates_of(int world_rank, const GridShape& shape);

  /// Ranks that differ only in their data index (ZeRO partitions across these).
  Communicator& data() { return *data_; }
  Communicator& pipeline() { return *pipeline_; }
  Communicator& tensor() { return *tensor_; }

 private:
  GridShape shape_;
  GridCoordinates coordinates_;
  std::unique_ptr<Communicator> data_;
  std::unique_ptr<Communicator> pipeline_;
  std::unique_ptr<Communicator> tensor_;
};

}  // namespace zt
