// This machine and its processes, as files left by a process name them (swap files, checkpoint
// temporaries, the checkpoint directory's lock): the host name, and whether a process still runs.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <string>

namespace zt::base {

/// This machine's host name (gethostname; "host" when it fails).
inline std::string host_name() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) return "host";
  return host;
}

/// Whether process `pid` runs on this machine (EPERM: it does, owned by someone else). A zombie
/// (exited, not yet reaped: common in containers without an init process) does not run.
inline bool process_runs(long pid) {
  if (pid <= 0) return true;  // not a process we can reason about
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno != EPERM) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  // pid (comm) state ...: the state follows the last ')', comm may hold spaces and parentheses.
  const std::size_t close = line.rfind(')');
  const char state = close != std::string::npos && close + 2 < line.size() ? line[close + 2] : 'R';
  return state != 'Z' && state != 'X';
}

}  // namespace zt::base
