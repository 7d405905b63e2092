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

/// The shortest collective timeout accepted (0, "off", is accepted too). Below it the watchdog's
/// own granularity (100 ms ticks, replies awaited for at least 1 s) and the ordinary wait of one
/// rank for another (a page-fault storm, a slow first step) would end healthy jobs as hung: 0.001 s
/// did. 1e-300 would round every check to "not yet" and silently turn the watchdog off.
inline constexpr double kMinimumCollectiveTimeoutSeconds = 1.0;
/// The longest accepted (about 31 years): larger values are typos; 0 or "off" turns it off.
inline constexpr double kMaximumCollectiveTimeoutSeconds = 1e9;

/// Empty when `seconds` is a valid collective timeout: 0 (off) or kMinimumCollectiveTimeoutSeconds
/// to kMaximumCollectiveTimeoutSeconds. Otherwise what is wrong with it and what is expected, for a
/// message that names where the value came from (ZT_COLLECTIVE_TIMEOUT, comm.timeout_s,
/// RuntimeOptions::collective_timeout). Rejects NaN, infinities and negative values.
std::string collective_timeout_problem(double seconds);

/// Called on the rank that reports, on the watchdog's thread, with the report it printed and the
/// exit code, just before it ends the job (zt::train sends it to the metrics file as an alert).
/// It must return within a second or two and never block on MPI. An empty function removes it.
using WatchdogReportListener = std::function<void(const std::string& report, int exit_code)>;
void set_watchdog_report_listener(WatchdogReportListener listener);

}  // namespace zt
