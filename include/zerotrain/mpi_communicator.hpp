// The MPI backend of zt::Communicator: host buffers, or buffers on the emulated test device.
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

/// The device communicator of the emulated test device (include/zerotrain/device.hpp): the MPI
/// backend over a duplicate of `comm` for buffers in emulated memory of `device`. device() is
/// `device`; backend() is mpi; traffic accounting and the watchdog see it as an MPI communicator.
/// It behaves as a device backend does (nccl_communicator.hpp): each operation runs inside the
/// device API's access, a receive posted before the matching send waits there (order a ring: even
/// ranks send first, odd ranks receive first), and send/recv with the rank itself is refused with
/// zt::CommError. With `ordered_with` (a stream of `device`, outliving the communicator: the engine's
/// compute stream) every operation starts after the work queued on that stream, as NCCL's does (the
/// emulated device's streams queue their work until it is needed: kernels run lazily, see
/// device.hpp). A non-blocking operation's result lands in its output on the communicator's own
/// stream, as NCCL's kernel writes it on NCCL's: Work::wait() orders `ordered_with` after the landing
/// (no host wait), or waits on the host without `ordered_with`; Work::test() says done once it
/// landed (under the eager stream order it lands it). Work on `ordered_with` that reads the output
/// before the wait reads it unwritten (the lazy stream order), and a write into an operation's
/// input or output before it landed is a zt::CommError at the landing (a race on a GPU).
std::unique_ptr<Communicator> make_emulated_device_communicator(MPI_Comm comm, std::string name,
                                                                Device device = Device::emulated(),
                                                                const Stream* ordered_with = nullptr);

/// The MPI_Comm behind an MPI-backend communicator (throws for other backends).
MPI_Comm native_mpi_comm(const Communicator& communicator);

}  // namespace zt
