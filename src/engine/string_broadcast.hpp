// One string from rank 0 to every rank of an MPI-backend communicator (tags, paths, errors).
// Internal to the engine.
#pragma once

#include <mpi.h>

#include <string>

#include "zerotrain/mpi_communicator.hpp"

namespace zt::engine_detail {

inline std::string broadcast_string(Communicator& communicator, std::string value) {
  const MPI_Comm comm = native_mpi_comm(communicator);
  int length = static_cast<int>(value.size());
  MPI_Bcast(&length, 1, MPI_INT, 0, comm);
  value.resize(static_cast<std::size_t>(length));
  if (length > 0) MPI_Bcast(value.data(), length, MPI_CHAR, 0, comm);
  return value;
}

}  // namespace zt::engine_detail
