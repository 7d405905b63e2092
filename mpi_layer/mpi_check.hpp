// ZT_CHECK_MPI: turn an MPI return code into zt::CommError naming the call, the communicator,
// the rank and MPI's own error string. Communicators we create return errors (MPI_ERRORS_RETURN).
#pragma once

#include <mpi.h>

#include <string>
#include <string_view>

#include "zerotrain/error.hpp"

namespace zt::detail {

inline std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error code " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(length));
}

[[noreturn]] inline void raise_mpi_error(const char* file, int line, std::string_view call,
                                         std::string_view communicator, int code) {
  call = call.substr(0, call.find('('));  // the MPI function's name, not its argument list
  raise<CommError>(file, line, call, " failed on communicator '", communicator, "': ", mpi_error_string(code),
                   " (MPI error ", code, ")");
}

}  // namespace zt::detail

/// ZT_CHECK_MPI(MPI_Allreduce(...), "world") -> CommError with call text, communicator name, rank.
#define ZT_CHECK_MPI(call, communicator_name)                                                      \
  do {                                                                                             \
    const int zt_mpi_code_ = (call);                                                               \
    if (zt_mpi_code_ != MPI_SUCCESS)                                                               \
      ::zt::detail::raise_mpi_error(__FILE__, __LINE__, #call, (communicator_name), zt_mpi_code_); \
  } while (0)
