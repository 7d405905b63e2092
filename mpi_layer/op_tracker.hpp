// The operations in flight on each communicator, for the watchdog (mpi_layer/watchdog.cpp).
//
// The communicator's public methods register every operation here before calling the backend and
// finish it when it completes (blocking: on return; non-blocking: when Work::wait/test observes
// completion). The owning thread writes, the watchdog thread reads a snapshot; one uncontended
// mutex per communicator and a coarse clock keep this to about 25 ns per operation.
#pragma once

#include <time.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "zerotrain/communicator.hpp"

namespace zt::detail {

/// CLOCK_MONOTONIC_COARSE: about 5 ns per reading instead of 20-40 ns for steady_clock, at a
/// resolution of 1-4 ms, which is plenty for timeouts of seconds. Read once per operation.
struct WatchdogClock {
  using duration = std::chrono::nanoseconds;
  using rep = duration::rep;
  using period = duration::period;
  using time_point = std::chrono::time_point<WatchdogClock>;
  static constexpr bool is_steady = true;
  static time_point now() noexcept {
#ifdef CLOCK_MONOTONIC_COARSE
    timespec now{};
    clock_gettime(CLOCK_MONOTONIC_COARSE, &now);
    return time_point(std::chrono::seconds(now.tv_sec) + std::chrono::nanoseconds(now.tv_nsec));
#else
    return time_point(
        std::chrono::duration_cast<duration>(std::chrono::steady_clock::now().time_since_epoch()));
#endif
  }
};

/// Collectives are numbered per communicator (every member numbers alike); send and recv are
/// matched pairwise, so they have a count of their own.
bool is_collective(CommOp op);

struct OpRecord {
  std::uint64_t token = 0;
  CommOp op = CommOp::barrier;
  std::uint64_t seq = 0;
  std::uint64_t bytes = 0;
  std::optional<DType> type;
  int peer = -1;  // send/recv: the peer's rank in the communicator
  int tag = -1;
  WatchdogClock::time_point start;
};

class OpTracker {
 public:
  OpTracker(std::string name, int rank, int size, CommIdentity identity);

  std::uint64_t begin(CommOp op, std::uint64_t bytes, std::optional<DType> type, int peer, int tag);
  void finish(std::uint64_t token);

  struct Snapshot {
    std::uint64_t collectives_started = 0;
    /// Every collective up to this sequence number has completed here.
    std::uint64_t collectives_completed = 0;
    std::vector<OpRecord> in_flight;
  };
  Snapshot snapshot() const;
  std::uint64_t collectives_started() const;

  const std::string& name() const { return name_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  const CommIdentity& identity() const { return identity_; }
  /// World rank of communicator rank `rank`, or -1 when the identity does not say.
  int world_rank_of(int rank) const;

 private:
  const std::string name_;
  const int rank_;
  const int size_;
  const CommIdentity identity_;
  mutable std::mutex mutex_;
  std::uint64_t next_token_ = 1;
  std::uint64_t collectives_started_ = 0;
  std::uint64_t point_to_point_started_ = 0;
  std::vector<OpRecord> in_flight_;
};

/// The trackers of all live communicators of this process, for the watchdog.
void register_tracker(const std::shared_ptr<OpTracker>& tracker);
std::vector<std::shared_ptr<OpTracker>> live_trackers();
/// The live tracker with this agreed id, or null.
std::shared_ptr<OpTracker> find_tracker(std::uint64_t id);

}  // namespace zt::detail
