// The operations in flight on each communicator, for the watchdog (mpi_layer/watchdog.cpp).
//
// The communicator's public methods register every operation here before calling the backend and
// finish it when it completes (blocking: on return; non-blocking: when Work::wait/test observes
// completion). The owning thread writes, the watchdog thread reads a snapshot; one uncontended
// mutex per communicator and a coarse clock keep this to about 25 ns per operation.
//
// A NCCL operation ordered with a compute stream runs on the device after its call (and its
// Work::wait) have returned: the backend keeps a device-side copy of its record listed until the
// operation's completion event is reached, and gives the tracker two hooks, one that retires the
// records whose events were reached (the watchdog calls it before it looks) and one that aborts the
// communicator (ncclCommAbort, called when the job is ended).
#pragma once

#include <time.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
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

/// Who a communicator is across processes, for the watchdog: an id that every member agreed on
/// when it was created (0: none) and the MPI_COMM_WORLD rank of each member, in communicator rank
/// order (the watchdog talks to the other processes by these ranks).
struct CommIdentity {
  std::uint64_t id = 0;
  std::vector<int> world_ranks;
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
  /// Nonzero for the send and the receive of one exchange (Communicator::isend_irecv), the same in
  /// both (and in their device-side copies): NCCL runs the two as one group, which completes only
  /// when both peers have taken part, so a hang of one half is a hang of the exchange.
  std::uint64_t exchange = 0;
};

class OpTracker {
 public:
  OpTracker(std::string name, int rank, int size, CommIdentity identity);

  std::uint64_t begin(CommOp op, std::uint64_t bytes, std::optional<DType> type, int peer, int tag);
  void finish(std::uint64_t token);
  /// Marks the records of a send and a receive begun as one exchange (their `exchange`).
  void link_exchange(std::uint64_t send_token, std::uint64_t recv_token);
  /// Copies of the records of the `operations` operations begun last (the one the owner thread is
  /// in: a communicator's operations start on one thread; an exchange's send and receive are two),
  /// each under a token of its own, with the same sequence number and start; they stay listed until
  /// finish(token), after the call has returned. Returns their tokens, oldest first.
  std::vector<std::uint64_t> begin_device_side(std::size_t operations = 1);

  /// Hooks of a backend whose operations complete on a device after their call returns (NCCL).
  /// `retire` finishes the device-side records of completed operations; `abort` ends every
  /// operation of the communicator for good. Both run on the watchdog's thread, must be
  /// thread-safe and must not block on MPI.
  void set_device_hooks(std::function<void()> retire, std::function<void()> abort);
  /// Removes the hooks, waiting for a call of one that is in progress: the backend calls it before
  /// it destroys what the hooks use.
  void clear_device_hooks();
  /// Calls the hooks, if any.
  void retire_device_work();
  void abort_device_work();

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
  std::mutex hooks_mutex_;  // held while a hook runs
  std::function<void()> retire_;
  std::function<void()> abort_;
};

/// One operation registered as in flight; destroying (or finish()ing) it marks it complete.
class InFlightOp {
 public:
  InFlightOp() = default;
  InFlightOp(OpTracker* tracker, std::uint64_t token) : tracker_(tracker), token_(token) {}
  InFlightOp(InFlightOp&& other) noexcept
      : tracker_(std::exchange(other.tracker_, nullptr)), token_(other.token_) {}
  InFlightOp& operator=(InFlightOp&& other) noexcept {
    if (this != &other) {
      finish();
      tracker_ = std::exchange(other.tracker_, nullptr);
      token_ = other.token_;
    }
    return *this;
  }
  InFlightOp(const InFlightOp&) = delete;
  InFlightOp& operator=(const InFlightOp&) = delete;
  ~InFlightOp() { finish(); }
  void finish() noexcept;

  /// Hand the registration to a zt::Work, which keeps it as (list, token) because the public
  /// header cannot name this class's definition; InFlightOp(list, token) takes it back.
  std::pair<OpTracker*, std::uint64_t> release() noexcept {
    return {std::exchange(tracker_, nullptr), token_};
  }
  std::uint64_t token() const { return token_; }

 private:
  OpTracker* tracker_ = nullptr;
  std::uint64_t token_ = 0;
};

/// The trackers of all live communicators of this process, for the watchdog.
void register_tracker(const std::shared_ptr<OpTracker>& tracker);
std::vector<std::shared_ptr<OpTracker>> live_trackers();
/// The live tracker with this agreed id, or null.
std::shared_ptr<OpTracker> find_tracker(std::uint64_t id);
/// retire_device_work() / abort_device_work() of every live tracker.
void retire_device_work_everywhere();
void abort_device_work_everywhere();

}  // namespace zt::detail
