// Bad conditions for the NVMe swap, made on purpose: a file system mounted for one test (ramfs has
// no O_DIRECT, a small tmpfs fills up), a directory this process cannot write to, and whether a
// directory supports O_DIRECT; and a fresh directory for one test's swap files. Shared by the swap
// engine's tests (tests/unit/test_swap.cpp, test_parameter_store.cpp) and the training engine's
// (tests/mpi/test_offload_errors.cpp).
#pragma once

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <optional>
#include <string>
#include <system_error>

namespace zt::testing {

/// A directory of the test's own under ZT_TEST_SWAP_DIR (default: the temporary directory, a disk
/// file system here), removed with everything in it. One process (MPI tests: JobDirectory).
class TestDirectory {
 public:
  TestDirectory() {
    static std::atomic<int> counter{0};
    const char* base = std::getenv("ZT_TEST_SWAP_DIR");
    std::string name = "zt_test_swap.";  // appended, not "literal" + string: GCC 12 warns falsely
    name += std::to_string(::getpid());
    name += ".";
    name += std::to_string(counter++);
    path_ = (base != nullptr ? std::filesystem::path(base) : std::filesystem::temp_directory_path()) / name;
    std::filesystem::create_directories(path_);
  }
  ~TestDirectory() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TestDirectory(const TestDirectory&) = delete;
  TestDirectory& operator=(const TestDirectory&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::size_t file_count() const {
    return static_cast<std::size_t>(
        std::distance(std::filesystem::directory_iterator(path_), std::filesystem::directory_iterator()));
  }

 private:
  std::filesystem::path path_;
};

/// A file system mounted for one test (needs root and a kernel that lets this process mount);
/// detached at the end of the scope.
class ScopedMount {
 public:
  ScopedMount(const std::filesystem::path& target, const char* type, const char* data) : target_(target) {
    std::filesystem::create_directories(target);
    mounted_ = ::mount(type, target.c_str(), type, 0, data) == 0;
    if (!mounted_) reason_ = std::string("mount -t ") + type + " failed: " + std::strerror(errno);
  }
  ~ScopedMount() {
    if (mounted_) ::umount2(target_.c_str(), MNT_DETACH);
  }
  ScopedMount(const ScopedMount&) = delete;
  ScopedMount& operator=(const ScopedMount&) = delete;
  bool mounted() const { return mounted_; }
  /// Why the mount failed (empty when it did not).
  const std::string& reason() const { return reason_; }

 private:
  std::filesystem::path target_;
  bool mounted_ = false;
  std::string reason_;
};

/// Makes an existing directory unwritable to this process for the scope's duration: as root, which
/// ignores permission bits, with the immutable flag (chattr +i; the file system must have it);
/// otherwise by taking away the write permission.
class UnwritableDirectory {
 public:
  explicit UnwritableDirectory(const std::filesystem::path& path) : path_(path) {
    if (::geteuid() != 0) {
      std::error_code error;
      std::filesystem::permissions(
          path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec, error);
      by_permissions_ = !error;
      if (error) reason_ = "chmod 0500 failed: " + error.message();
      return;
    }
    fd_ = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd_ < 0 || ::ioctl(fd_, FS_IOC_GETFLAGS, &flags_) != 0) {
      reason_ = std::string("running as root and the file system has no chattr +i: ") + std::strerror(errno);
      return;
    }
    int immutable = flags_ | FS_IMMUTABLE_FL;
    immutable_ = ::ioctl(fd_, FS_IOC_SETFLAGS, &immutable) == 0;
    if (!immutable_) reason_ = std::string("running as root and chattr +i failed: ") + std::strerror(errno);
  }
  ~UnwritableDirectory() {
    if (immutable_) ::ioctl(fd_, FS_IOC_SETFLAGS, &flags_);
    if (fd_ >= 0) ::close(fd_);
    if (by_permissions_) {
      std::error_code ignored;
      std::filesystem::permissions(path_, std::filesystem::perms::owner_all, ignored);
    }
  }
  UnwritableDirectory(const UnwritableDirectory&) = delete;
  UnwritableDirectory& operator=(const UnwritableDirectory&) = delete;
  bool applied() const { return immutable_ || by_permissions_; }
  /// Why it could not be made unwritable (empty when it was).
  const std::string& reason() const { return reason_; }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  int flags_ = 0;
  bool immutable_ = false;
  bool by_permissions_ = false;
  std::string reason_;
};

/// Whether files in `directory` can be opened with O_DIRECT (tmpfs: since Linux 6.6; ramfs: never).
/// Probes with a file of its own, removed again.
inline bool supports_direct_io(const std::filesystem::path& directory) {
  const std::filesystem::path probe = directory / ".zt-direct-io-probe";
  const int fd = ::open(probe.c_str(), O_CREAT | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
  if (fd >= 0) ::close(fd);
  std::error_code ignored;
  std::filesystem::remove(probe, ignored);  // a refused O_DIRECT open may have created it
  return fd >= 0;
}

/// Sets (or, with nullopt, unsets) an environment variable for the scope's duration.
class ScopedEnvironment {
 public:
  ScopedEnvironment(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnvironment() {
    if (old_) {
      ::setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  ScopedEnvironment(const ScopedEnvironment&) = delete;
  ScopedEnvironment& operator=(const ScopedEnvironment&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

}  // namespace zt::testing
