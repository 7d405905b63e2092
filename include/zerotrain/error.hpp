// Errors: one exception hierarchy, messages that say where (rank, file:line) and what.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace zt {

/// Base of every exception zerotrain throws. what() reads
/// "zerotrain error on rank R (file:line): message".
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

/// A configuration value is missing, has the wrong type or is out of range.
class ConfigError : public Error {
 public:
  using Error::Error;
};

/// A communication call failed (MPI or NCCL error, bad arguments, timeout).
class CommError : public Error {
 public:
  using Error::Error;
};

/// An I/O call failed (files, checkpoints, swap).
class IoError : public Error {
 public:
  using Error::Error;
};

/// A CUDA runtime or library call failed.
class CudaError : public Error {
 public:
  using Error::Error;
};

namespace detail {

/// World rank put into error messages; -1 before the runtime knows it.
/// Set by zt::Runtime so that errors raised in any layer name their rank.
inline int& error_rank() {
  static int rank = -1;
  return rank;
}

template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}

inline std::string location_prefix(const char* file, int line) {
  std::string_view path(file);
  // Keep the path from the project's top-level directory on, not the build machine's.
  for (std::string_view top :
       {"include/", "src/", "mpi_layer/", "kernels/", "io/", "tests/", "bench/", "examples/"}) {
    if (auto pos = path.rfind(top); pos != std::string_view::npos) {
      path = path.substr(pos);
      break;
    }
  }
  std::string prefix = "zerotrain error";
  if (error_rank() >= 0) prefix += concat(" on rank ", error_rank());
  return concat(prefix, " (", path, ":", line, "): ");
}

template <typename ErrorType = Error, typename... Args>
[[noreturn]] void raise(const char* file, int line, Args&&... args) {
  throw ErrorType(location_prefix(file, line) + concat(std::forward<Args>(args)...));
}

}  // namespace detail
}  // namespace zt

/// Throw zt::Error with the call site and the streamed message parts.
#define ZT_THROW(...) ::zt::detail::raise<::zt::Error>(__FILE__, __LINE__, __VA_ARGS__)
/// Throw a specific zt error type (ConfigError, CommError, ...).
#define ZT_THROW_AS(type, ...) ::zt::detail::raise<type>(__FILE__, __LINE__, __VA_ARGS__)

/// Check a precondition at an API boundary; the message parts say what was expected.
#define ZT_CHECK(condition, ...)                                                                            \
  do {                                                                                                      \
    if (!(condition))                                                                                       \
      ::zt::detail::raise<::zt::Error>(__FILE__, __LINE__, "check '" #condition "' failed: ", __VA_ARGS__); \
  } while (0)

/// Check with a specific zt error type; the message is the caller's alone.
#define ZT_CHECK_AS(type, condition, ...)                                         \
  do {                                                                            \
    if (!(condition)) ::zt::detail::raise<type>(__FILE__, __LINE__, __VA_ARGS__); \
  } while (0)
