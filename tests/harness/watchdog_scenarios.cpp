// Hangs and lost ranks that the watchdog must turn into a report and a non-zero exit, run by ctest
// with a short ZT_COLLECTIVE_TIMEOUT through expect_failure.cmake. The last rank misbehaves, the
// others are in an all_reduce on 'world' (after two that completed, so it is #3):
//   skip-collective   the last rank skips the all_reduce and sleeps
//   sigkill           the last rank kills itself with SIGKILL
//   skip-nonblocking  like skip-collective, but the others wait in Work::wait of an iall_reduce
//   recv-no-sender    rank 0 waits in recv for a message the last rank never sends
//   exchange-no-peer  rank 0 waits for an exchange with the last rank (isend_irecv, 1 MiB each
//                     way, so that MPI cannot complete the send without a receive), which the last
//                     rank never joins: the report names both halves
//   nccl-skip-collective  like skip-collective, on a NCCL communicator 'nccl-world' over device
//                     buffers, ordered with a stream as the engine's are: the others' all_reduce
//                     is enqueued at once and they wait for the stream, so the watchdog sees the
//                     collective stuck on the device, reports it and ends the job with
//                     ncclCommAbort. It needs a GPU of its own per rank; without one, every rank
//                     agrees on it and rank 0 prints "SKIP: no usable GPU: <reason>", exit 0
//                     (ctest's SKIP_REGULAR_EXPRESSION shows the test as skipped).
//   nccl-exchange-skip  the same communicator; every rank exchanges with its neighbours in a ring
//                     (isend_irecv: one NCCL group, as the pipeline's), the last rank skips the
//                     third exchange: its neighbours' groups never end, and the report names both
//                     halves of the exchange. Skips alike without a GPU per rank.
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

/// False where the job has no GPU per rank, after rank 0 said why (every rank agrees).
bool each_rank_has_a_gpu(const zt::Runtime& runtime, zt::Communicator& world) {
  const std::string reason = missing_gpu_per_rank(runtime, world);
  if (!reason.empty() && world.rank() == 0)
    std::printf("watchdog_scenarios: SKIP: no usable GPU: %s\n", reason.c_str());
  std::fflush(stdout);
  return reason.empty();
}

/// The communicator 'nccl-world' over device buffers, ordered with a stream as the engine's are, and
/// a buffer of `count` floats on this rank's GPU.
struct NcclWorld {
  NcclWorld(const zt::Runtime& runtime, zt::Communicator& world, std::size_t count)
      : gpu(zt::Device::cuda(runtime.local_rank())),
        compute((zt::set_current_device(gpu), gpu)),
        comm(zt::make_nccl_communicator(world, gpu, "nccl-world", &compute)),
        values(gpu, count * sizeof(float), zt::MemoryCategory::comm_buffers, zt::kHostAlignment,
               zt::HostMemoryKind::pageable, &compute) {
    zt::zero_bytes(values.data(), gpu, values.size(), &compute);
  }
  zt::Device gpu;
  zt::Stream compute;
  std::unique_ptr<zt::Communicator> comm;
  zt::Buffer values;
};

/// The last rank skips the third all_reduce of 'nccl-world'; the others enqueue it and wait for the
/// stream on the host, which only the watchdog's ncclCommAbort ends.
void skip_nccl_collective(const zt::Runtime& runtime, zt::Communicator& world, bool culprit) {
  constexpr std::size_t count = 1024;
  NcclWorld nccl(runtime, world, count);
  for (int step = 0; step < 3; ++step) {
    if (step == 2 && culprit) sleep_until_ended();
    nccl.comm->all_reduce(nccl.values.data(), nccl.values.data(), count, zt::DType::fp32, zt::ReduceOp::sum);
    nccl.compute.synchronize();  // the third never returns normally: the last rank's part is missing
  }
}

/// Every rank exchanges with its ring neighbours (sends to the next, receives from the previous:
/// one NCCL group); the last rank skips the third exchange, so its neighbours' groups never end.
void skip_nccl_exchange(const zt::Runtime& runtime, zt::Communicator& world, bool culprit) {
  constexpr std::size_t count = 1024;
  NcclWorld nccl(runtime, world, 2 * count);
  float* const outgoing = static_cast<float*>(nccl.values.data());
  const int next = (world.rank() + 1) % world.size();
  const int previous = (world.rank() + world.size() - 1) % world.size();
  for (int step = 0; step < 3; ++step) {
    if (step == 2 && culprit) sleep_until_ended();
    nccl.comm
        ->isend_irecv({outgoing, count, zt::DType::fp32, next, 0},
                      {outgoing + count, count, zt::DType::fp32, previous, 0})
        .wait();
    nccl.compute.synchronize();  // the third never returns normally on the last rank's neighbours
  }
  sleep_until_ended();  // with the communicator alive, as the ranks that wait have theirs
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
    } else if (mode == "exchange-no-peer") {
      constexpr std::size_t count = 1 << 18;  // 1 MiB of fp32: beyond MPI's eager sends
      std::vector<float> outgoing(count, 1.0f);
      std::vector<float> incoming(count);
      if (world.rank() == 0) {
        const int last = world.size() - 1;
        world
            .isend_irecv({outgoing.data(), count, zt::DType::fp32, last, 7},
                         {incoming.data(), count, zt::DType::fp32, last, 7})
            .wait();
      }
      if (culprit) sleep_until_ended();
    } else if (mode == "nccl-skip-collective" || mode == "nccl-exchange-skip") {
      if (!each_rank_has_a_gpu(runtime, world)) return 0;
      if (mode == "nccl-skip-collective") skip_nccl_collective(runtime, world, culprit);
      if (mode == "nccl-exchange-skip") skip_nccl_exchange(runtime, world, culprit);
    } else {
      ZT_THROW("unknown mode '", mode,
               "'; expected skip-collective, sigkill, skip-nonblocking, recv-no-sender, exchange-no-peer, "
               "nccl-skip-collective or nccl-exchange-skip");
    }
    sleep_until_ended();
    return 0;
  });
}
