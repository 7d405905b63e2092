// For MPI tests that need a GPU of its own on every rank (NCCL refuses two ranks on one device):
// why this job cannot run them, the same on every rank (decided collectively, so that no rank waits
// in a collective that the others skipped), and the skip that says so. A job without a usable GPU
// skips with "no usable GPU: <reason>", which the tests' SKIP_REGULAR_EXPRESSION shows as skipped.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <string>

#include "mpi_test_main.hpp"
#include "zerotrain/build_info.hpp"
#include "zerotrain/device.hpp"

namespace zt::testing {

/// "" when every rank has a usable GPU of its own.
inline std::string gpu_per_rank_skip_reason() {
  std::string reason;
  const CudaStatus& status = cuda_status();
  if (!build_info::have_cuda) {
    reason = "no usable GPU: zerotrain was built without CUDA";
  } else if (!status.usable()) {
    reason = "no usable GPU: " + status.reason;
  } else if (runtime().local_size() > status.device_count) {
    reason = "more ranks on this node (" + std::to_string(runtime().local_size()) + ") than GPUs (" +
             std::to_string(status.device_count) + "); NCCL needs one GPU per rank";
  }
  int unable_here = reason.empty() ? 0 : 1;
  int unable_anywhere = 0;
  MPI_Allreduce(&unable_here, &unable_anywhere, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (unable_anywhere != 0 && reason.empty()) reason = "another rank has no usable GPU of its own";
  return reason;
}

/// This rank's GPU: one per local rank.
inline Device gpu_of_this_rank() {
  return Device::cuda(runtime().local_rank());
}

}  // namespace zt::testing

/// First statement of a test that needs a GPU per rank (collective: every rank must reach it).
#define ZT_SKIP_WITHOUT_GPU_PER_RANK()                                                           \
  do {                                                                                           \
    if (const std::string reason = ::zt::testing::gpu_per_rank_skip_reason(); !reason.empty()) { \
      GTEST_SKIP() << reason;                                                                    \
    }                                                                                            \
  } while (0)
