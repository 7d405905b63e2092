// Swap files found in a directory, and whether their owner is gone (see swap.hpp).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>

#include "base/process.hpp"
#include "io/swap_naming.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/swap.hpp"

namespace zt {
namespace detail {

std::string swap_host_name() {
  return base::host_name();
}

}  // namespace detail

namespace {

/// Digits only, as a number; -1 otherwise.
long parse_number(std::string_view text) {
  if (text.empty() || text.size() > 18 ||
      !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return -1;
  return std::strtol(std::string(text).c_str(), nullptr, 10);
}

using base::process_runs;

}  // namespace

std::vector<SwapFileEntry> list_swap_files(const std::filesystem::path& directory) {
  check_swap_directory(directory, "swap directory");
  const std::string prefix = detail::kSwapFilePrefix;
  const std::string suffix = detail::kSwapFileSuffix;
  const std::string this_host = detail::swap_host_name();
  std::vector<SwapFileEntry> entries;
  for (const auto& item : std::filesystem::directory_iterator(directory)) {
    const std::string name = item.path().filename().string();
    if (!name.starts_with(prefix) || !name.ends_with(suffix) || !item.is_regular_file()) continue;
    SwapFileEntry entry;
    entry.path = item.path();
    std::error_code ignored;
    entry.bytes = item.file_size(ignored);
    // rank<R>.<job>: the job is <host>.<pid>.<n> by default, and the host may contain dots.
    const std::string_view rest =
        std::string_view(name).substr(prefix.size(), name.size() - prefix.size() - suffix.size());
    const std::size_t rank_end = rest.find('.');
    entry.rank = static_cast<int>(parse_number(rest.substr(0, rank_end)));
    if (rank_end != std::string_view::npos) {
      const std::string_view job = rest.substr(rank_end + 1);
      const std::size_t counter_dot = job.rfind('.');
      const std::size_t pid_dot = counter_dot == std::string_view::npos || counter_dot == 0
                                      ? std::string_view::npos
                                      : job.rfind('.', counter_dot - 1);
      if (pid_dot != std::string_view::npos && parse_number(job.substr(counter_dot + 1)) >= 0) {
        const long pid = parse_number(job.substr(pid_dot + 1, counter_dot - pid_dot - 1));
        if (pid > 0) {
          entry.host = std::string(job.substr(0, pid_dot));
          entry.pid = pid;
        }
      }
    }
    entry.stale = !entry.host.empty() && entry.host == this_host && !process_runs(entry.pid);
    entries.push_back(std::move(entry));
  }
  std::sort(entries.begin(), entries.end(),
            [](const SwapFileEntry& a, const SwapFileEntry& b) { return a.path < b.path; });
  return entries;
}

}  // namespace zt
