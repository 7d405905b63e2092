// Hangs and lost ranks that the watchdog must turn into a report and a non-zero exit, run by ctest
// with a short ZT_COLLECTIVE_TIMEOUT through expect_failure.cmake. The last rank misbehaves, the
// others are in an all_reduce on 'world' (after two that completed, so it is #3):
//   skip-collective   the last rank skips the all_reduce and sleeps
//   sigkill           the last rank kills itself with SIGKILL
//   skip-nonblocking  like skip-collective, but the others wait in Work::wait of an iall_reduce
//   recv-no-sender    rank 0 waits in recv for a message the last rank never sends
//   nccl-skip-collective  like skip-collective, on a NCCL communicator 'nccl-world' over device
//                     buffers, ordered with a stream as the engine's are: the others' all_reduce
//                     is enqueued at once and they wait for the stream, so the watchdog sees the
//                     collective stuck on the device, reports it and ends the job with
//                     ncclCommAbort. It needs a GPU of its own per rank; without one, every rank
//                     agrees on it and rank 0 prints "SKIP: no usable GPU: <reason>", exit 0
//                     (ctest's SKIP_REGULAR_EXPRESSION shows the test as skipped).
// If the watchdog fails to end the job, the program ends by itself after kGiveUp (exit code 0, so
// that the test fails as "succeeded" rather than as a timeout).
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "zerotrain/device.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/nccl_communicator.hpp"
#include "zerotrain/runtime.hpp"

namespace {

constexpr auto kGiveUp = std::chrono::seconds(45);

void sleep_until_ended() {
  std::this_thread::sleep_for(kGiveUp);
  std::fprintf(stderr, "watchdog_scenarios: the watchdog did not end the job within %lld s\n",
               static_cast<long long>(kGiveUp.count()));
  std::fflush(stderr);
  std::_Exit(0);
}

/// Why this job cannot give every rank a GPU of its own ("" when it can), agreed over `world`, so that
/// every rank skips alike and none waits in a collective the others skipped.
std::string missing_gpu_per_rank(const zt::Runtime& runtime, zt::Communicator& world) {
  std::string reason;
  const zt::CudaStatus& status = zt::cuda_status();
  if (!zt::kHaveNccl) {
    reason = "zerotrain was built without CUDA";
  } else if (!status.usable()) {
    reason = status.reason;
  } else if (runtime.local_size() > status.device_count) {
    reason = std::to_string(runtime.local_size()) + " ranks on this node, " +
             std::to_string(status.device_count) + " GPU(s); NCCL needs one GPU per rank";
  }
  std::int32_t unable = reason.empty() ? 0 : 1;
  world.all_reduce(&unable, &unable, 1, zt::DType::int32, zt::ReduceOp::max);
  if (unable != 0 && reason.empty()) reason = "another rank has no GPU of its own";
  return reason;
}

/// The last rank skips the third all_reduce of a NCCL communicator ordered with a stream; the others
/// enqueue it and wait for the stream on the host, which only the watchdog's ncclCommAbort ends.
/// Returns false where the job has no GPU per rank (after saying so); otherwise the watchdog ends the
/// job inside it.
bool skip_nccl_collective(const zt::Runtime& runtime, zt::Communicator& world, bool culprit) {
  if (const std::string reason = missing_gpu_per_rank(runtime, world); !reason.empty()) {
    if (world.rank() == 0) std::printf("watchdog_scenarios: SKIP: no usable GPU: %s\n", reason.c_str());
    std::fflush(stdout);
    return false;
  }
  const zt::Device gpu = zt::Device::cuda(runtime.local_rank());
  zt::set_current_device(gpu);
  const zt::Stream compute(gpu);
  const std::unique_ptr<zt::Communicator> nccl =
      zt::make_nccl_communicator(world, gpu, "nccl-world", &compute);
  const std::size_t count = 1024;
  zt::Buffer values(gpu, count * sizeof(float), zt::MemoryCategory::comm_buffers, zt::kHostAlignment,
                    zt::HostMemoryKind::pageable, &compute);
  zt::zero_bytes(values.data(), gpu, values.size(), &compute);
  for (int step = 0; step < 2; ++step) {
    nccl->all_reduce(values.data(), values.data(), count, zt::DType::fp32, zt::ReduceOp::sum);
    compute.synchronize();
  }
  if (culprit) sleep_until_ended();
  nccl->all_reduce(values.data(), values.data(), count, zt::DType::fp32, zt::ReduceOp::sum);
  compute.synchronize();  // never returns normally: the last rank's part is missing
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  zt::Runtime runtime(&argc, &argv);
  const std::string mode = argc > 1 ? argv[1] : "skip-collective";
  return zt::run_and_report([&] {
    zt::Communicator& world = runtime.world();
    const bool culprit = world.rank() == world.size() - 1;
    std::vector<float> values(1024, 1.0f);
    for (int step = 0; step < 2; ++step) {
      world.all_reduce(values.data(), values.data(), values.size(), zt::DType::fp32, zt::ReduceOp::sum);
    }
    if (mode == "skip-collective") {
      if (culprit) sleep_until_ended();
      world.all_reduce(values.data(), values.data(), values.size(), zt::DType::fp32, zt::ReduceOp::sum);
    } else if (mode == "sigkill") {
      if (culprit) std::raise(SIGKILL);
      world.all_reduce(values.data(), values.data(), values.size(), zt::DType::fp32, zt::ReduceOp::sum);
    } else if (mode == "skip-nonblocking") {
      if (culprit) sleep_until_ended();
      zt::Work pending =
          world.iall_reduce(values.data(), values.data(), values.size(), zt::DType::fp32, zt::ReduceOp::sum);
      pending.wait();
    } else if (mode == "recv-no-sender") {
      if (world.rank() == 0) world.recv(values.data(), 16, zt::DType::fp32, world.size() - 1, 5);
      if (culprit) sleep_until_ended();
    } else if (mode == "nccl-skip-collective") {
      if (!skip_nccl_collective(runtime, world, culprit)) return 0;
    } else {
      ZT_THROW("unknown mode '", mode,
               "'; expected skip-collective, sigkill, skip-nonblocking, recv-no-sender or "
               "nccl-skip-collective");
    }
    sleep_until_ended();
    return 0;
  });
}
