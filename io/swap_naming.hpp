// How swap files are named, in one place: <nvme_path>/zerotrain-swap.rank<R>.<job>.bin, where the
// default job is <host>.<pid>.<n> (n counts the engines of the process). Internal to io/.
#pragma once

#include <string>

namespace zt::detail {

inline constexpr const char* kSwapFilePrefix = "zerotrain-swap.rank";
inline constexpr const char* kSwapFileSuffix = ".bin";

/// This machine's host name (gethostname; "host" when it fails).
std::string swap_host_name();

}  // namespace zt::detail
