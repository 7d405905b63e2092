// The watchdog's bookkeeping in normal runs: sequence numbers, in-flight registration, agreed
// communicator ids, and no report while every rank makes progress. The failure paths (hangs,
// killed ranks) are ctest harness.watchdog_* (tests/harness/watchdog_scenarios.cpp).
#include <gtest/gtest.h>
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/text.hpp"
#include "mpi_layer/op_tracker.hpp"
#include "mpi_layer/watchdog.hpp"
#include "mpi_test_main.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/mpi_communicator.hpp"
#include "zerotrain/runtime.hpp"

namespace {

std::shared_ptr<zt::detail::OpTracker> tracker_named(const std::string& name) {
  for (auto& tracker : zt::detail::live_trackers()) {
    if (tracker->name() == name) return tracker;
  }
  return nullptr;
}

template <typename T>
std::vector<T> gather(zt::Communicator& comm, T value) {
  std::vector<T> values(static_cast<std::size_t>(comm.size()));
  comm.all_gather(&value, values.data(), 1, zt::dtype_of_v<T>);
  return values;
}

TEST(Watchdog, RunsWithTheRuntime) {
  const zt::Runtime& runtime = zt::testing::runtime();
  if (std::getenv("ZT_COLLECTIVE_TIMEOUT") == nullptr) {
    EXPECT_EQ(runtime.collective_timeout().count(), zt::kDefaultCollectiveTimeoutSeconds);
  }
  EXPECT_EQ(runtime.watchdog_running(), runtime.thread_level() == MPI_THREAD_MULTIPLE);
}

TEST(Watchdog, CollectivesAreNumberedAlikeOnEveryRank) {
  zt::Runtime& runtime = zt::testing::runtime();
  auto comm = zt::make_mpi_communicator(runtime.world_comm(), "numbered");
  EXPECT_EQ(comm->collectives_started(), 0u);
  float value = 1.0f;
  comm->barrier();
  comm->all_reduce(&value, &value, 1, zt::DType::fp32, zt::ReduceOp::sum);
  // Point-to-point operations are not collectives: they do not advance the sequence.
  const int next = (comm->rank() + 1) % comm->size();
  const int previous = (comm->rank() + comm->size() - 1) % comm->size();
  zt::Work receive = comm->irecv(&value, 1, zt::DType::fp32, previous, 3);
  comm->send(&value, 1, zt::DType::fp32, next, 3);
  receive.wait();
  zt::Work reduce = comm->iall_reduce(&value, &value, 1, zt::DType::fp32, zt::ReduceOp::max);
  reduce.wait();
  EXPECT_EQ(comm->collectives_started(), 3u);
  const auto everyone =
      gather<std::int64_t>(runtime.world(), static_cast<std::int64_t>(comm->collectives_started()));
  for (std::int64_t seq : everyone) EXPECT_EQ(seq, 3);
}

TEST(Watchdog, OperationsAreInFlightUntilCompletionIsObserved) {
  zt::Runtime& runtime = zt::testing::runtime();
  auto comm = zt::make_mpi_communicator(runtime.world_comm(), "in flight");
  const auto tracker = tracker_named("in flight");
  ASSERT_NE(tracker, nullptr);
  std::vector<float> values(256, 1.0f);
  comm->all_reduce(values.data(), values.data(), values.size(), zt::DType::fp32, zt::ReduceOp::sum);
  EXPECT_TRUE(tracker->snapshot().in_flight.empty()) << "a blocking operation is done when it returns";

  zt::Work pending =
      comm->iall_reduce(values.data(), values.data(), values.size(), zt::DType::fp32, zt::ReduceOp::sum);
  auto snapshot = tracker->snapshot();
  ASSERT_EQ(snapshot.in_flight.size(), 1u);
  EXPECT_EQ(snapshot.in_flight[0].op, zt::CommOp::all_reduce);
  EXPECT_EQ(snapshot.in_flight[0].seq, 2u);
  EXPECT_EQ(snapshot.in_flight[0].bytes, values.size() * sizeof(float));
  EXPECT_EQ(snapshot.in_flight[0].type, zt::DType::fp32);
  EXPECT_EQ(snapshot.collectives_started, 2u);
  EXPECT_EQ(snapshot.collectives_completed, 1u);

  zt::Work moved = std::move(pending);  // the registration moves with the handle
  EXPECT_EQ(tracker->snapshot().in_flight.size(), 1u);
  while (!moved.test()) {
  }
  snapshot = tracker->snapshot();
  EXPECT_TRUE(snapshot.in_flight.empty());
  EXPECT_EQ(snapshot.collectives_completed, 2u);

  {  // a handle destroyed before wait() waits, and finishes the registration too
    zt::Work dropped = comm->ibroadcast(values.data(), values.size(), zt::DType::fp32, 0);
    EXPECT_EQ(tracker->snapshot().in_flight.size(), 1u);
  }
  EXPECT_TRUE(tracker->snapshot().in_flight.empty());
}

/// A NCCL operation ordered with a stream runs on after its call: its device-side copy of the record
/// (same sequence number) stays listed until the backend's retire hook finishes it, which the
/// watchdog calls each tick; the abort hook runs when the job is ended. Hooks are gone once cleared.
TEST(Watchdog, DeviceSideRecordsStayUntilTheDeviceCompletesThem) {
  auto tracker = std::make_shared<zt::detail::OpTracker>("device side", 0, 1, zt::detail::CommIdentity{});
  zt::detail::register_tracker(tracker);
  const std::uint64_t host = tracker->begin(zt::CommOp::all_reduce, 64, zt::DType::bf16, -1, -1);
  const std::uint64_t device = tracker->begin_device_side().front();
  auto snapshot = tracker->snapshot();
  ASSERT_EQ(snapshot.in_flight.size(), 2u);
  EXPECT_EQ(snapshot.in_flight[1].seq, snapshot.in_flight[0].seq);
  EXPECT_EQ(snapshot.in_flight[1].op, zt::CommOp::all_reduce);
  EXPECT_EQ(snapshot.in_flight[1].bytes, 64u);
  EXPECT_EQ(snapshot.in_flight[1].type, zt::DType::bf16);
  tracker->finish(host);  // the call returned: the collective still runs on the device
  snapshot = tracker->snapshot();
  ASSERT_EQ(snapshot.in_flight.size(), 1u);
  EXPECT_EQ(snapshot.collectives_completed, 0u);

  // The runtime's watchdog thread calls the hooks too (each tick).
  std::atomic<bool> reached{false};
  std::atomic<int> retired{0};
  std::atomic<int> aborted{0};
  tracker->set_device_hooks(
      [&] {
        ++retired;
        if (reached.load()) tracker->finish(device);
      },
      [&] { ++aborted; });
  zt::detail::retire_device_work_everywhere();  // not reached yet: still in flight
  EXPECT_EQ(tracker->snapshot().in_flight.size(), 1u);
  reached = true;
  zt::detail::retire_device_work_everywhere();
  snapshot = tracker->snapshot();
  EXPECT_TRUE(snapshot.in_flight.empty());
  EXPECT_EQ(snapshot.collectives_completed, 1u);
  EXPECT_GE(retired, 2);
  tracker->abort_device_work();
  EXPECT_EQ(aborted, 1);
  tracker->clear_device_hooks();
  const int retired_before = retired.load();
  zt::detail::retire_device_work_everywhere();
  zt::detail::abort_device_work_everywhere();
  EXPECT_EQ(retired, retired_before);
  EXPECT_EQ(aborted, 1);
}

/// An exchange (isend_irecv) is one NCCL group: both halves get a device-side copy, oldest first,
/// and all four records name the same exchange, so the watchdog reports the pair, not the receive.
TEST(Watchdog, AnExchangeKeepsBothHalvesOnTheDevice) {
  auto tracker = std::make_shared<zt::detail::OpTracker>("exchange", 0, 2, zt::detail::CommIdentity{});
  const std::uint64_t alone = tracker->begin(zt::CommOp::recv, 8, zt::DType::int32, 1, 3);
  const std::uint64_t send = tracker->begin(zt::CommOp::send, 4096, zt::DType::fp32, 1, 0);
  const std::uint64_t recv = tracker->begin(zt::CommOp::recv, 2048, zt::DType::bf16, 1, 0);
  tracker->link_exchange(send, recv);
  const std::vector<std::uint64_t> device = tracker->begin_device_side(2);
  ASSERT_EQ(device.size(), 2u);
  auto snapshot = tracker->snapshot();
  ASSERT_EQ(snapshot.in_flight.size(), 5u);
  EXPECT_EQ(snapshot.in_flight[0].exchange, 0u);  // the receive before, not part of it
  for (std::size_t i = 1; i < 5; ++i) EXPECT_EQ(snapshot.in_flight[i].exchange, send) << i;
  EXPECT_EQ(snapshot.in_flight[3].token, device[0]);
  EXPECT_EQ(snapshot.in_flight[3].op, zt::CommOp::send);
  EXPECT_EQ(snapshot.in_flight[3].seq, snapshot.in_flight[1].seq);
  EXPECT_EQ(snapshot.in_flight[4].token, device[1]);
  EXPECT_EQ(snapshot.in_flight[4].op, zt::CommOp::recv);
  EXPECT_EQ(snapshot.in_flight[4].bytes, 2048u);
  EXPECT_EQ(snapshot.in_flight[4].seq, snapshot.in_flight[2].seq);
  for (const std::uint64_t host : {alone, send, recv}) tracker->finish(host);
  snapshot = tracker->snapshot();
  ASSERT_EQ(snapshot.in_flight.size(), 2u);
  EXPECT_EQ(snapshot.in_flight[0].exchange, snapshot.in_flight[1].exchange);
}

TEST(Watchdog, CommunicatorIdsAgreeAndNameWorldRanks) {
  zt::Runtime& runtime = zt::testing::runtime();
  MPI_Comm halves = MPI_COMM_NULL;
  const int world_rank = runtime.world_rank();
  ASSERT_EQ(MPI_Comm_split(MPI_COMM_WORLD, world_rank % 2, -world_rank, &halves), MPI_SUCCESS);  // reversed
  auto comm = zt::make_mpi_communicator(halves, "half");
  MPI_Comm_free(&halves);
  const auto tracker = tracker_named("half");
  ASSERT_NE(tracker, nullptr);
  const zt::detail::CommIdentity& identity = tracker->identity();
  EXPECT_GT(identity.id, 0u);
  for (std::uint64_t id : gather<std::int64_t>(*comm, static_cast<std::int64_t>(identity.id))) {
    EXPECT_EQ(id, identity.id);
  }
  const auto world_ranks = gather<std::int32_t>(*comm, world_rank);
  ASSERT_EQ(identity.world_ranks.size(), world_ranks.size());
  for (std::size_t r = 0; r < world_ranks.size(); ++r) EXPECT_EQ(identity.world_ranks[r], world_ranks[r]);
  EXPECT_EQ(tracker->world_rank_of(comm->rank()), world_rank);
  // Ids are never reused by a rank while its communicators live.
  EXPECT_NE(identity.id, tracker_named("world")->identity().id);
}

TEST(Watchdog, SlowRankWithinTheTimeoutIsNotReported) {
  zt::Runtime& runtime = zt::testing::runtime();
  const double timeout = runtime.collective_timeout().count();
  // Under harness.watchdog_quiet_when_slow the timeout is short: wait for most of it.
  const double delay = timeout > 0.0 && timeout <= 10.0 ? 0.6 * timeout : 0.2;
  if (runtime.world_rank() == runtime.world_size() - 1) {
    std::this_thread::sleep_for(std::chrono::duration<double>(delay));
  }
  runtime.world().barrier();  // the others wait here; the watchdog must stay quiet
  SUCCEED();
}

TEST(Watchdog, ReadsTheTimeoutFromTheEnvironment) {
  const char* original = std::getenv("ZT_COLLECTIVE_TIMEOUT");
  const std::optional<std::string> saved = original ? std::optional<std::string>(original) : std::nullopt;
  setenv("ZT_COLLECTIVE_TIMEOUT", "2.5", 1);
  EXPECT_EQ(zt::detail::collective_timeout_from_environment(), 2.5);
  setenv("ZT_COLLECTIVE_TIMEOUT", "0", 1);
  EXPECT_EQ(zt::detail::collective_timeout_from_environment(), 0.0);
  for (const char* bad : {"ten", "-1", "5s"}) {
    setenv("ZT_COLLECTIVE_TIMEOUT", bad, 1);
    EXPECT_THROW(zt::detail::collective_timeout_from_environment(), zt::ConfigError) << bad;
  }
  setenv("ZT_COLLECTIVE_TIMEOUT", "off", 1);
  EXPECT_EQ(zt::detail::collective_timeout_from_environment(), 0.0);
  // Below the minimum (0.001 ended a healthy job; 1e-300 turned the watchdog off without a word),
  // not numbers, negative, above the maximum: refused, naming the variable and the bound.
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"0.001", "ZT_COLLECTIVE_TIMEOUT='0.001': 0.001 s is below the minimum of 1 s"},
      {"1e-300", "ZT_COLLECTIVE_TIMEOUT='1e-300': 1e-300 s is below the minimum of 1 s"},
      {"nan", "ZT_COLLECTIVE_TIMEOUT='nan': nan is not a number of seconds"},
      {"inf", "ZT_COLLECTIVE_TIMEOUT='inf': inf is not a number of seconds"},
      {"-5", "ZT_COLLECTIVE_TIMEOUT='-5': -5 s is negative"},
      {"1e300", "ZT_COLLECTIVE_TIMEOUT='1e300': 1e+300 s is above the maximum of 1e+09 s"},
  };
  for (const auto& [bad, message] : refused) {
    setenv("ZT_COLLECTIVE_TIMEOUT", bad.c_str(), 1);
    try {
      (void)zt::detail::collective_timeout_from_environment();
      ADD_FAILURE() << "no ConfigError for ZT_COLLECTIVE_TIMEOUT=" << bad;
    } catch (const zt::ConfigError& error) {
      EXPECT_NE(std::string(error.what()).find(message), std::string::npos) << error.what();
      EXPECT_NE(std::string(error.what()).find("expected 0 or \"off\" (no watchdog) or 1 to 1e+09 seconds"),
                std::string::npos)
          << error.what();
    }
  }
  unsetenv("ZT_COLLECTIVE_TIMEOUT");
  EXPECT_EQ(zt::detail::collective_timeout_from_environment(), std::nullopt);
  if (saved) setenv("ZT_COLLECTIVE_TIMEOUT", saved->c_str(), 1);
}

TEST(Watchdog, SettingsFollowTheTimeout) {
  const auto standard = zt::detail::WatchdogSettings::for_timeout(600.0);
  EXPECT_EQ(standard.heartbeat_timeout_seconds, 60.0);
  EXPECT_EQ(standard.heartbeat_interval_seconds, 1.0);
  EXPECT_EQ(standard.reply_wait_seconds, 5.0);
  const auto short_one = zt::detail::WatchdogSettings::for_timeout(2.0);
  EXPECT_EQ(short_one.heartbeat_timeout_seconds, 3.0);
  EXPECT_LT(short_one.heartbeat_interval_seconds, short_one.heartbeat_timeout_seconds / 4.0);
  EXPECT_EQ(short_one.reply_wait_seconds, 1.0);
}

TEST(Watchdog, FormatsBytes) {
  EXPECT_EQ(zt::base::byte_size_text(12), "12 B");
  EXPECT_EQ(zt::base::byte_size_text(4096), "4.0 KiB");
  EXPECT_EQ(zt::base::byte_size_text(std::uint64_t{3} << 29), "1.5 GiB");
}

}  // namespace
