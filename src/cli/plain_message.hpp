// What the `zerotrain` commands print of an error: the what, not the where.
#pragma once

#include <exception>
#include <string>
#include <string_view>

namespace zt::cli {

/// An error's message without its "zerotrain error on rank R (file:line): " prefixes (a rethrown
/// error carries one per level): the command's users want the what, not the where.
inline std::string plain_message(const std::exception& error) {
  std::string_view text = error.what();
  while (text.starts_with("zerotrain error")) {
    const std::size_t end = text.find("): ");
    if (end == std::string_view::npos) break;
    text.remove_prefix(end + 3);
  }
  return std::string(text);
}

}  // namespace zt::cli
