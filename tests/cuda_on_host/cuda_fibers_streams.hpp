// The streams of tests/cuda_on_host's CUDA runtime (cuda_fibers.cpp), for the stand-in libraries that
// enqueue device work of their own (cuBLASLt's matmul, CUB's sort, NCCL's operations).
//
// Two orders (CUDA_FIBERS_STREAMS):
//   async     the default in the CUDA-on-host build: a device thread of its own runs the work later
//             than it is issued, in an order CUDA allows and chosen to break what is not ordered
//             (docs/gpu.md, "Streams run late"). A copy to pageable memory, a synchronize or an
//             event query sees only what the device reached.
//   at_issue  the default of unit.cuda_on_host: every copy, memset and launch runs at the call, so
//             every stream and event is complete (one valid schedule).
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <string>

namespace cuda_fibers {

/// Whether the device runs work later than it is issued (CUDA_FIBERS_STREAMS=async).
bool streams_run_late();

/// `work` runs on the device in `stream`'s order (nullptr: the legacy default stream), after what
/// the stream waits for; at the call in the at_issue order. `what` names it in faults. An exception
/// from `work` becomes the device's sticky error (cudaErrorLaunchFailure, naming `what`).
void enqueue(cudaStream_t stream, std::string what, std::function<void()> work);

/// An NCCL operation: as enqueue, and after every NCCL operation this process enqueued before it,
/// on any stream. (NCCL requires every rank to issue a communicator's operations in one order; run
/// in issue order, one rank's device never waits in a collective that its peers' devices have not
/// reached because they wait in a later one.)
void enqueue_collective(cudaStream_t stream, std::string what, std::function<void()> work);

/// The host waits for every work issued so far (cudaDeviceSynchronize without its error).
void synchronize_device();

}  // namespace cuda_fibers
