// The checkpoint directory as a place several jobs and people share (docs/checkpoint-format.md,
// "The directory lock", "Atomicity", "Permissions"): one job at a time holds it (an advisory lock
// that dies with its holder), temporaries are created exclusively under unique names with their
// final mode, and only temporaries whose writer is gone are removed. Internal to the engine; rank 0
// of a job does all of it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace zt::engine_detail {

/// The lock file in a checkpoint directory: DIR/.zerotrain.lock, holding "host pid" of its holder.
inline constexpr const char* kCheckpointLockFile = ".zerotrain.lock";

/// An exclusive flock(2) on DIR/.zerotrain.lock, held from acquire() until the last holder in this
/// process lets it go (or the process ends, however it ends: the kernel drops the lock of a dead
/// process, so a killed job never blocks the next one). Every holder in one process shares one lock
/// per directory (a trainer and its engine's checkpointer).
class CheckpointDirectoryLock {
 public:
  /// Lock `dir` (an existing directory) for this process. Throws zt::IoError naming the host and
  /// process that hold it when another process does. Where the file system has no locks (flock
  /// fails with ENOLCK, ENOSYS, EOPNOTSUPP: Lustre mounted without -o flock, some NFS setups),
  /// prints a warning once and returns an unheld lock: saves then remove only temporaries of dead
  /// processes of this host.
  static std::shared_ptr<CheckpointDirectoryLock> acquire(const std::filesystem::path& dir,
                                                          std::uint32_t file_mode);
  ~CheckpointDirectoryLock();
  CheckpointDirectoryLock(const CheckpointDirectoryLock&) = delete;
  CheckpointDirectoryLock& operator=(const CheckpointDirectoryLock&) = delete;

  /// Whether the lock is really held (false where the file system has no locks).
  bool held() const { return held_; }
  const std::filesystem::path& directory() const { return directory_; }

 private:
  CheckpointDirectoryLock(std::filesystem::path directory, int fd, bool held)
      : directory_(std::move(directory)), fd_(fd), held_(held) {}
  std::filesystem::path directory_;
  int fd_ = -1;
  bool held_ = false;
};

/// Create `dir` (and its parents) with `dir_mode` when missing; throw zt::IoError unless it is a
/// directory this process can create files in.
void prepare_checkpoint_directory(const std::filesystem::path& dir, std::uint32_t dir_mode);

/// Throw zt::ConfigError when `file_mode` or `dir_mode` is refused (base/permission_bits.hpp).
void check_checkpoint_modes(std::uint32_t file_mode, std::uint32_t dir_mode);

/// A new, empty temporary for the file `final_name` in `dir`: `.<final_name>.tmp-<host>-<pid>-<n>`,
/// created with O_CREAT | O_EXCL | O_NOFOLLOW (never an existing file, never through a link) and
/// given `mode` at once (fchmod: the umask does not apply), with the owner's write bit added while it
/// is written (a mode without it, 0440, is applied just before the rename).
std::filesystem::path create_temporary(const std::filesystem::path& dir, const std::string& final_name,
                                       std::uint32_t mode);

/// Remove the temporaries in `dir` whose writer is gone: those of this host whose process no longer
/// runs (or is this process: no save of it runs now), and, when `directory_locked` (this job holds
/// the directory, so no other job writes there), those of other hosts. Returns the names removed.
std::vector<std::string> remove_dead_temporaries(const std::filesystem::path& dir, bool directory_locked);

/// fsync(2) a file or directory.
void fsync_path(const std::filesystem::path& path, bool directory);

/// Write `text` to `path` atomically: a new temporary (create_temporary) synced and renamed over
/// it, then the directory synced.
void write_file_atomically(const std::filesystem::path& path, const std::string& text, std::uint32_t mode);

}  // namespace zt::engine_detail
