// zt::ProcessGrid: data x pipeline x tensor sub-communicators.
#include "zerotrain/process_grid.hpp"

#include "mpi_layer/mpi_check.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/mpi_communicator.hpp"
#include "zerotrain/runtime.hpp"

namespace zt {
namespace {

/// Split the runtime's world by `color` (ranks sharing it form one group), ordered by world rank,
/// and wrap the result; the temporary split is freed once the communicator holds its own duplicate.
std::unique_ptr<Communicator> split_world(MPI_Comm world, int color, int world_rank,
                                          const std::string& name) {
  MPI_Comm split = MPI_COMM_NULL;
  ZT_CHECK_MPI(MPI_Comm_split(world, color, world_rank, &split), "world");
  auto communicator = make_mpi_communicator(split, name);
  MPI_Comm_free(&split);
  return communicator;
}

}  // namespace

GridCoordinates ProcessGrid::coordinates_of(int world_rank, const GridShape& shape) {
  return {.data = (world_rank / shape.tensor) % shape.data,
          .pipeline = world_rank / (shape.tensor * shape.data),
          .tensor = world_rank % shape.tensor};
}

int ProcessGrid::world_rank_of(GridCoordinates at) const {
  return at.pipeline * (shape_.data * shape_.tensor) + at.data * shape_.tensor + at.tensor;
}

ProcessGrid::ProcessGrid(Runtime& runtime, GridShape shape) : shape_(shape) {
  const int world = runtime.world_size();
  ZT_CHECK_AS(Error, shape_.pipeline >= 1 && shape_.tensor >= 1, "process grid: pipeline (", shape_.pipeline,
              ") and tensor (", shape_.tensor, ") sizes must be at least 1");
  if (shape_.data <= 0) {
    ZT_CHECK_AS(Error, world % (shape_.pipeline * shape_.tensor) == 0, "process grid: world size ", world,
                " is not divisible by pipeline (", shape_.pipeline, ") x tensor (", shape_.tensor,
                ") = ", shape_.pipeline * shape_.tensor);
    shape_.data = world / (shape_.pipeline * shape_.tensor);
  }
  ZT_CHECK_AS(Error, shape_.product() == world, "process grid: data (", shape_.data, ") x pipeline (",
              shape_.pipeline, ") x tensor (", shape_.tensor, ") = ", shape_.product(),
              " ranks, but the job has ", world, " ranks; choose sizes whose product is the world size");

  const int rank = runtime.world_rank();
  coordinates_ = coordinates_of(rank, shape_);
  const auto& c = coordinates_;
  // Ranks in one group share every coordinate but the one that varies inside the group.
  const MPI_Comm world_comm = runtime.world_comm();
  data_ = split_world(world_comm, c.pipeline * shape_.tensor + c.tensor, rank, "data");
  pipeline_ = split_world(world_comm, c.data * shape_.tensor + c.tensor, rank, "pipeline");
  tensor_ = split_world(world_comm, c.pipeline * shape_.data + c.data, rank, "tensor");
}

ProcessGrid::~ProcessGrid() = default;

}  // namespace zt
