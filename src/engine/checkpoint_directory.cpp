// The checkpoint directory: its lock, its temporaries (see checkpoint_directory.hpp).
#include "src/engine/checkpoint_directory.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
#include <mutex>

#include "base/permission_bits.hpp"
#include "base/process.hpp"
#include "base/text.hpp"
#include "zerotrain/error.hpp"

namespace zt::engine_detail {
namespace fs = std::filesystem;

namespace {

constexpr const char* kTemporaryMarker = ".tmp-";

/// The locks this process holds, by canonical directory: a second holder shares the first's.
struct ProcessLocks {
  std::mutex mutex;
  std::map<std::string, std::weak_ptr<CheckpointDirectoryLock>> by_directory;
};

ProcessLocks& process_locks() {
  static ProcessLocks locks;
  return locks;
}

/// Up to 200 characters of `text` with control characters written as \xNN: a lock file or `latest`
/// of any content prints as one readable line.
std::string printable(const std::string& text) {
  std::string out;
  for (char c : text.substr(0, 200)) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7f) {
      out += c;
    } else {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", byte);
      out += escaped;
    }
  }
  return out;
}

std::string read_small_file(int fd) {
  std::string text(512, '\0');
  const ssize_t got = ::pread(fd, text.data(), text.size(), 0);
  text.resize(got > 0 ? static_cast<std::size_t>(got) : 0);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\0')) text.pop_back();
  return text;
}

}  // namespace

std::shared_ptr<CheckpointDirectoryLock> CheckpointDirectoryLock::acquire(const fs::path& dir,
                                                                          std::uint32_t file_mode) {
  std::error_code error;
  const fs::path directory = fs::canonical(dir, error);
  ZT_CHECK_AS(IoError, !error, "checkpoint directory '", dir.string(), "': ", error.message());
  ProcessLocks& locks = process_locks();
  const std::lock_guard guard(locks.mutex);
  if (auto held = locks.by_directory[directory.string()].lock()) return held;

  const fs::path path = directory / kCheckpointLockFile;
  // The owner may always write it; another user of the group (a shared project directory) opens
  // it read-only, which flock(2) accepts: the lock works, only the holder's name is not written.
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, file_mode | 0200);
  bool writable = fd >= 0;
  if (fd < 0 && errno == EACCES) fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  ZT_CHECK_AS(IoError, fd >= 0, "cannot open the checkpoint directory's lock file '", path.string(),
              "': ", base::errno_text(errno),
              errno == ELOOP ? " (it is a symbolic link; remove it)" : " (is the directory writable?)");
  struct stat status {};
  if (::fstat(fd, &status) != 0 || !S_ISREG(status.st_mode)) {
    ::close(fd);
    ZT_THROW_AS(IoError, "the checkpoint directory's lock file '", path.string(), "' is not a regular file");
  }
  bool held = true;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int saved = errno;
    if (saved == EWOULDBLOCK || saved == EAGAIN || saved == EINTR) {
      const std::string holder = read_small_file(fd);
      ::close(fd);
      ZT_THROW_AS(
          IoError, "checkpoint directory '", directory.string(), "' is in use by another job: its lock ",
          path.string(), " is held by ",
          holder.empty() ? std::string("a process that has not written its name yet") : printable(holder),
          ". Two jobs saving into one directory would overwrite and delete each other's "
          "checkpoints: give this job its own --save-dir (checkpoint.save_dir), or wait for that "
          "job to end (a job that died holds no lock)");
    }
    if (saved != ENOLCK && saved != ENOSYS && saved != EOPNOTSUPP && saved != EINVAL) {
      ::close(fd);
      ZT_THROW_AS(IoError, "cannot lock the checkpoint directory '", directory.string(), "' (flock of ",
                  path.string(), "): ", base::errno_text(saved));
    }
    held = false;
    static std::once_flag warned;
    std::call_once(warned, [&] {
      std::fprintf(stderr,
                   "zerotrain: warning: the file system of '%s' has no file locks (flock: %s); nothing stops "
                   "a second job from saving into this directory. Saves remove only temporaries of dead "
                   "processes of this host (docs/checkpoint-format.md, \"The directory lock\")\n",
                   directory.c_str(), base::errno_text(saved).c_str());
    });
  }
  if (held && writable) {
    // Who holds it, for the message of the next job that tries; the lock, not this text, decides.
    const std::string owner = "host " + base::host_name() + " pid " + std::to_string(::getpid()) +
                              " (since " + base::utc_timestamp_text() + ")\n";
    if (::ftruncate(fd, 0) != 0 ||
        ::pwrite(fd, owner.data(), owner.size(), 0) != static_cast<ssize_t>(owner.size())) {
      const int saved = errno;
      ::close(fd);
      ZT_THROW_AS(IoError, "cannot write the checkpoint directory's lock file '", path.string(),
                  "': ", base::errno_text(saved));
    }
  }
  std::shared_ptr<CheckpointDirectoryLock> lock(new CheckpointDirectoryLock(directory, fd, held));
  locks.by_directory[directory.string()] = lock;
  return lock;
}

CheckpointDirectoryLock::~CheckpointDirectoryLock() {
  // Closing the descriptor drops the flock. The file stays: removing it would race with a job that
  // has just opened it (two jobs could then hold locks on two different files).
  if (fd_ >= 0) ::close(fd_);
  ProcessLocks& locks = process_locks();
  const std::lock_guard guard(locks.mutex);
  const auto found = locks.by_directory.find(directory_.string());
  if (found != locks.by_directory.end() && found->second.expired()) locks.by_directory.erase(found);
}

void prepare_checkpoint_directory(const fs::path& dir, std::uint32_t dir_mode) {
  std::error_code error;
  if (!fs::exists(dir, error)) {
    fs::create_directories(dir, error);
    ZT_CHECK_AS(IoError, !error, "cannot create checkpoint directory '", dir.string(),
                "': ", error.message());
    ::chmod(dir.c_str(), dir_mode);
  }
  ZT_CHECK_AS(IoError, fs::is_directory(dir), "checkpoint directory '", dir.string(), "' is not a directory");
  // access(2) answers yes to root whatever the mode bits say (and some file systems refuse files
  // it allows): the real test is creating one there.
  ZT_CHECK_AS(IoError, ::access(dir.c_str(), W_OK | X_OK) == 0, "checkpoint directory '", dir.string(),
              "' is not writable: ", base::errno_text(errno));
  const fs::path probe = create_temporary(dir, "write-test", 0600);
  fs::remove(probe, error);
}

void check_checkpoint_modes(std::uint32_t file_mode, std::uint32_t dir_mode) {
  const std::string file_problem = base::permission_bits_problem(file_mode, false);
  const std::string dir_problem = base::permission_bits_problem(dir_mode, true);
  char text[16];
  std::snprintf(text, sizeof text, "%04o", file_mode);
  ZT_CHECK_AS(ConfigError, file_problem.empty(), "checkpoint file mode ", text, " ", file_problem,
              "; expected permission bits such as 0640");
  std::snprintf(text, sizeof text, "%04o", dir_mode);
  ZT_CHECK_AS(ConfigError, dir_problem.empty(), "checkpoint directory mode ", text, " ", dir_problem,
              "; expected permission bits such as 0750");
}

fs::path create_temporary(const fs::path& dir, const std::string& final_name, std::uint32_t mode) {
  static std::atomic<std::uint64_t> counter{0};
  const std::string stem =
      "." + final_name + kTemporaryMarker + base::host_name() + "-" + std::to_string(::getpid()) + "-";
  for (int attempt = 0;; ++attempt) {
    const fs::path path = dir / (stem + std::to_string(counter.fetch_add(1)));
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode & 0777);
    if (fd < 0 && errno == EEXIST && attempt < 100) continue;  // a name left by an earlier process
    ZT_CHECK_AS(IoError, fd >= 0, "cannot create the temporary file '", path.string(),
                "': ", base::errno_text(errno));
    const int status = ::fchmod(fd, mode | 0200);
    const int saved = errno;
    ::close(fd);
    if (status != 0) {
      std::error_code ignored;
      fs::remove(path, ignored);
      ZT_THROW_AS(IoError, "cannot set mode of '", path.string(), "': ", base::errno_text(saved));
    }
    return path;
  }
}

std::vector<std::string> remove_dead_temporaries(const fs::path& dir, bool directory_locked) {
  const std::string this_host = base::host_name();
  std::vector<std::string> removed;
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    const std::size_t marker = name.rfind(kTemporaryMarker);
    if (name.front() != '.' || marker == std::string::npos) continue;
    // <host>-<pid>-<n> (this version) or <pid> (before the lock existed).
    const std::string writer = name.substr(marker + std::string_view(kTemporaryMarker).size());
    const auto is_number = [](const std::string& text) {
      return !text.empty() && text.size() < 19 && text.find_first_not_of("0123456789") == std::string::npos;
    };
    std::string host;
    long pid = -1;
    const std::size_t last = writer.rfind('-');
    const std::size_t before =
        last == std::string::npos || last == 0 ? std::string::npos : writer.rfind('-', last - 1);
    if (before != std::string::npos && is_number(writer.substr(last + 1)) &&
        is_number(writer.substr(before + 1, last - before - 1))) {
      host = writer.substr(0, before);
      pid = std::stol(writer.substr(before + 1, last - before - 1));
    } else if (is_number(writer)) {
      pid = std::stol(writer);
    } else {
      continue;  // not a temporary of ours
    }
    bool gone = false;
    if (host == this_host) {
      gone = pid == ::getpid() || !base::process_runs(pid);
    } else if (host.empty()) {
      // An older zerotrain's temporary (no host in its name): gone unless a process of that
      // number runs here (it may be that job's, on this host).
      gone = directory_locked && !base::process_runs(pid);
    } else {
      gone = directory_locked;  // another host's writer: the lock says no job of it writes here
    }
    if (gone && fs::remove(entry.path(), error)) removed.push_back(name);
  }
  return removed;
}

void fsync_path(const fs::path& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  ZT_CHECK_AS(IoError, fd >= 0, "cannot open '", path.string(), "' to sync it: ", base::errno_text(errno));
  const int status = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  ZT_CHECK_AS(IoError, status == 0, "fsync of '", path.string(), "' failed: ", base::errno_text(saved));
}

void write_file_atomically(const fs::path& path, const std::string& text, std::uint32_t mode) {
  const fs::path temporary = create_temporary(path.parent_path(), path.filename().string(), mode);
  try {
    const int fd = ::open(temporary.c_str(), O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
    ZT_CHECK_AS(IoError, fd >= 0, "cannot open '", temporary.string(), "': ", base::errno_text(errno));
    const ssize_t written = ::write(fd, text.data(), text.size());
    const int saved = errno;
    const int synced = ::fsync(fd);
    if ((mode & 0200) == 0) ::fchmod(fd, mode);
    ::close(fd);
    ZT_CHECK_AS(IoError, written == static_cast<ssize_t>(text.size()) && synced == 0, "cannot write '",
                temporary.string(), "': ", base::errno_text(saved));
    fs::rename(temporary, path);
  } catch (...) {
    std::error_code ignored;
    fs::remove(temporary, ignored);
    throw;
  }
  fsync_path(path.parent_path(), true);
}

}  // namespace zt::engine_detail
