// Hangs and lost ranks that the watchdog must turn into a report and a non-zero exit, run by ctest
// with a short ZT_COLLECTIVE_TIMEOUT through expect_failure.cmake. The last rank misbehaves, the
// others are in an all_reduce on 'world' (after two that completed, so it is #3):
//   skip-collective   the last rank skips the all_reduce and sleeps
//   sigkill           the last rank kills itself with SIGKILL
//   skip-nonblocking  like skip-collective, but the others wait in Work::wait of an iall_reduce
//   recv-no-sender    rank 0 waits in recv for a message the last rank never sends
// If the watchdog fails to end the job, the program ends by itself after kGiveUp (exit code 0, so
// that the test fails as "succeeded" rather than as a timeout).
#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "zerotrain/error.hpp"
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
    } else {
      ZT_THROW("unknown mode '", mode,
               "'; expected skip-collective, sigkill, skip-nonblocking or recv-no-sender");
    }
    sleep_until_ended();
    return 0;
  });
}
