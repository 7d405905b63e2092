// The permission bits zerotrain gives the files and directories it writes (checkpoints): one rule
// for the config's checkpoint.file_mode / dir_mode and for zt::SaveOptions.
#pragma once

#include <cstdint>
#include <string>

namespace zt::base {

/// Why `mode` is refused for a file (or a directory) zerotrain creates, or "" when it is fine:
/// only the permission bits 0777; no setuid, setgid (files) or sticky bit; not writable by
/// others (anyone on the machine could then replace a checkpoint or plant a link in its place).
/// A directory may be setgid (its files inherit the group, a common project-directory setup).
inline std::string permission_bits_problem(std::uint32_t mode, bool directory) {
  if (mode > 07777) return "has bits beyond 07777";
  if (mode & 04000) return "sets the setuid bit (04000)";
  if (!directory && (mode & 02000)) return "sets the setgid bit (02000)";
  if (mode & 01000) return "sets the sticky bit (01000)";
  if (mode & 0002) return "is writable by others (0002)";
  return "";
}

}  // namespace zt::base
