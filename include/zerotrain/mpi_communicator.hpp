// The MPI backend of zt::Communicator: host buffers.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "zerotrain/communicator.hpp"

namespace zt {

/// A communicator over a duplicate of `comm` (so our traffic never mixes with the caller's);
/// the duplicate is freed with the object. Errors on it are returned, not fatal, and become
/// zt::CommError naming the operation, communicator, rank and MPI's error string.
std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, std::string name);

/// The MPI_Comm behind an MPI-backend communicator (throws for other backends).
MPI_Comm native_mpi_comm(const Communicator& communicator);

}  // namespace zt
