// Hang and failure detection (docs/fault-detection.md).
//
// zt::Runtime runs a watchdog thread. Every operation on a zt::Communicator is registered as in
// flight, with a per-communicator sequence number, until it completes. An operation still in
// flight after the collective timeout (RuntimeOptions::collective_timeout, environment variable
// ZT_COLLECTIVE_TIMEOUT in seconds, 0 = off) ends the job with a report naming the operation and
// the ranks that have not arrived; a rank that stops sending heartbeats (killed, crashed, node
// lost) ends it with a report naming that rank. These are the job's exit codes then:
#pragma once

#include <functional>
#include <string>

namespace zt {

/// An operation did not complete within the collective timeout.
inline constexpr int kWatchdogTimeoutExitCode = 86;
/// A rank stopped answering (no heartbeat within the heartbeat timeout): it died or froze.
inline constexpr int kWatchdogRankLostExitCode = 87;

/// Default collective timeout in seconds. Long enough for a checkpoint write or a slow first
/// step on the other ranks, short enough that a hung job does not burn an allocation for hours
/// (PyTorch's default NCCL timeout is 30 minutes).
inline constexpr double kDefaultCollectiveTimeoutSeconds = 600.0;

/// Called on the rank that reports, on the watchdog's thread, with the report it printed and the
/// exit code, just before it ends the job (zt::train sends it to the metrics file as an alert).
/// It must return within a second or two and never block on MPI. An empty function removes it.
using WatchdogReportListener = std::function<void(const std::string& report, int exit_code)>;
void set_watchdog_report_listener(WatchdogReportListener listener);

}  // namespace zt
