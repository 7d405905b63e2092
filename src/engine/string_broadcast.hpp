// Strings across the ranks of an MPI-backend communicator: one from rank 0 to every rank (tags,
// paths, errors, the outcome of work rank 0 does alone), or every rank's to all (parameter names of pipeline
// stages). Internal to the engine.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include "zerotrain/error.hpp"
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

/// Every rank's `value`, in rank order, on every rank.
inline std::vector<std::string> all_gather_strings(Communicator& communicator, const std::string& value) {
  const MPI_Comm comm = native_mpi_comm(communicator);
  const int ranks = communicator.size();
  int length = static_cast<int>(value.size());
  std::vector<int> lengths(static_cast<std::size_t>(ranks));
  MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm);
  std::vector<int> offsets(static_cast<std::size_t>(ranks), 0);
  for (int r = 1; r < ranks; ++r) offsets[r] = offsets[r - 1] + lengths[r - 1];
  std::string all(static_cast<std::size_t>(offsets.back() + lengths.back()), '\0');
  MPI_Allgatherv(value.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR, comm);
  std::vector<std::string> values;
  for (int r = 0; r < ranks; ++r) values.push_back(all.substr(offsets[r], lengths[r]));
  return values;
}

/// Run `work` on rank 0 only; if it throws, every rank throws the same error (zt::IoError with its
/// message), so that no rank goes on into a collective the others left.
template <typename Work>
void on_rank0_everywhere(Communicator& communicator, Work&& work) {
  std::string failure;
  if (communicator.rank() == 0) {
    try {
      work();
    } catch (const std::exception& error) {
      failure = error.what();
      if (failure.empty()) failure = "unknown error";
    }
  }
  failure = broadcast_string(communicator, failure);
  if (!failure.empty()) ZT_THROW_AS(IoError, failure);
}

}  // namespace zt::engine_detail
