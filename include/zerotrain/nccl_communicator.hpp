// The NCCL backend of zt::Communicator: buffers on one CUDA device, operations on the
// communicator's own stream.
//
// Semantics differ from the MPI backend where NCCL differs from MPI:
//   - Operations are ordered on the communicator's stream (a non-blocking CUDA stream it owns).
//     Blocking calls enqueue and then synchronize that stream; non-blocking calls enqueue and return
//     a Work that waits for (or polls) a CUDA event recorded after the operation.
//   - Buffers must be memory of `device()` (cudaMalloc'd, or managed). They are not checked per call.
//   - bf16/fp16 are reduced by NCCL natively (16-bit on the wire). avg is ncclAvg: floating types
//     are pre-multiplied by 1/n before the sum (so 16-bit results may differ from the MPI backend's
//     sum-then-divide in the last bit unless n is a power of two); integers are summed then divided,
//     truncating, as in the MPI backend.
//   - NCCL has no tags: messages between two ranks match in the order they were posted, and `tag`
//     is ignored. A receive cannot check the length of what was sent; both sides must agree.
//     Operations run in posting order on one stream, so a rank that posts a receive before its own
//     send waits there until the peer's send arrives (order a ring even ranks send first, odd ranks
//     receive first); send/recv with the rank itself is refused with zt::CommError.
//   - barrier() is a one-element all_reduce followed by a stream synchronize.
//   - Ordered with a stream (the `ordered_with` argument; the engine passes its compute stream),
//     the communicator never blocks the host: each operation first waits on the device for the
//     work queued on that stream so far (an event, cudaStreamWaitEvent), a blocking call returns
//     once the operation is enqueued and that stream waits for its completion, and Work::wait()
//     makes that stream wait for it (Work::test() still polls). The results are then ready for
//     anything queued on that stream afterwards, as host results are after a blocking MPI call;
//     the host sees them through that stream (a device-to-host copy synchronizes it). barrier()
//     still synchronizes the host. traffic() seconds then count the host's time to enqueue.
//   - Every operation stays registered with the watchdog until its completion event is reached
//     on the device, also after its call has returned (the watchdog polls the events each tick,
//     and NCCL's asynchronous error); when the watchdog ends the job it aborts every NCCL
//     communicator of the process (ncclCommAbort) first, so that a collective waiting for a
//     late peer ends. A thread that then reaches the aborted communicator waits for the job to
//     end (docs/fault-detection.md, "NCCL").
//
// Built only with CUDA (ZT_HAVE_CUDA, see zerotrain/build_info.hpp). Without it the function still
// exists and throws zt::CommError "zerotrain was built without CUDA", so callers need no #if.
#pragma once

#include <memory>
#include <string>

#include "zerotrain/build_info.hpp"
#include "zerotrain/communicator.hpp"
#include "zerotrain/device.hpp"

namespace zt {

/// Whether this build contains the NCCL backend.
inline constexpr bool kHaveNccl = ZT_HAVE_CUDA != 0;

/// A NCCL communicator over the ranks of `bootstrap_mpi` (an MPI-backend communicator; a collective
/// call over it): rank 0 creates the NCCL unique id and broadcasts it, then every rank joins with
/// ncclCommInitRank on `cuda_device`, which must be usable in this process. Each rank passes its own
/// device; ranks may not share one. With `ordered_with` (a stream on `cuda_device` that outlives
/// the communicator), operations are ordered with that stream by events instead of host waits
/// (see the top of this header).
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap_mpi, Device cuda_device,
                                                     std::string name, const Stream* ordered_with = nullptr);

/// The cudaStream_t (as an opaque pointer) on which a NCCL-backend communicator runs its operations,
/// so that callers can order their own kernels against it. Throws for other backends.
void* nccl_stream(const Communicator& communicator);

}  // namespace zt
