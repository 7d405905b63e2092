// The watchdog thread behind zt::Runtime (docs/fault-detection.md).
//
// It owns a duplicate of MPI_COMM_WORLD that only it uses, after construction, for small
// non-blocking messages: heartbeats around a ring (rank r to r+1), queries about a communicator's
// progress and their replies. It never blocks in MPI: every request is polled with MPI_Test
// against a deadline, so a dead or stuck peer shows up as "not responding" instead of hanging the
// watchdog too.
#pragma once

#include <mpi.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mpi_layer/op_tracker.hpp"

namespace zt::detail {

struct WatchdogSettings {
  double timeout_seconds = 0.0;             // an operation in flight longer than this is a hang
  double poll_seconds = 0.1;                // how often the thread looks
  double heartbeat_interval_seconds = 1.0;  // how often a rank tells its successor it lives
  double heartbeat_timeout_seconds = 60.0;  // no heartbeat for this long: the predecessor is lost
  double reply_wait_seconds = 5.0;          // how long a report waits for the other ranks' answers
  std::string source = "RuntimeOptions::collective_timeout";  // where timeout_seconds came from

  /// The settings derived from one collective timeout: heartbeat timeout min(timeout, 60 s) but at
  /// least 3 s, five heartbeats per heartbeat timeout at most one second apart, replies awaited
  /// for min(5 s, max(1 s, timeout / 2)).
  static WatchdogSettings for_timeout(double timeout_seconds, std::string source = {});
};

/// ZT_COLLECTIVE_TIMEOUT in seconds, if set (0 or "off": no watchdog); a malformed value or one
/// that collective_timeout_problem() refuses is a ConfigError naming the variable.
std::optional<double> collective_timeout_from_environment();

class Watchdog {
 public:
  /// Collective over MPI_COMM_WORLD (duplicates it). `host_of_rank[r]` names world rank r's host.
  Watchdog(WatchdogSettings settings, std::vector<std::string> host_of_rank);
  /// Stops and joins the thread and frees its communicator. After begin_shutdown() and a barrier
  /// of all ranks, every message has been received and the communicator is freed clean.
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  /// This rank is shutting down: tell the successor (no more heartbeats will come) and stop
  /// judging the predecessor's heartbeats. Operations still time out as before.
  void begin_shutdown();
  const WatchdogSettings& settings() const;

 private:
  class Loop;
  std::unique_ptr<Loop> loop_;
};

/// Agree on an id for a new communicator among its members (one MPI_Allreduce over `comm`) and
/// list its members' world ranks. Collective over `comm`.
CommIdentity agree_comm_identity(MPI_Comm comm, const std::string& name);

}  // namespace zt::detail
