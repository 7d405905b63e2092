// NVMe swap: asynchronous, O_DIRECT reads and writes of host buffers to one swap file per rank.
//
//   zt::SwapEngine swap({.nvme_path = "/local/nvme", .queue_depth = 16});
//   swap.register_tensor("adam.m.0", bytes);            // space reserved now: a full disk fails here
//   zt::Buffer m = swap.allocate_buffer(bytes);         // aligned for O_DIRECT
//   zt::SwapHandle out = swap.swap_out("adam.m.0", m.data());
//   ...                                                 // overlaps with the caller's work
//   swap.wait(out);                                     // throws zt::IoError naming file and offset
//
// The backend (io_uring, else libaio) is chosen at run time; `zerotrain report` shows which.
// SwapPipeline runs the optimizer's sub-groups double-buffered: it reads group i+1 and writes
// group i-1 while the caller works on group i.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zerotrain/device.hpp"

namespace zt {

namespace detail {
struct SwapRequest;
class SwapFile;
class SwapLane;
}  // namespace detail

/// How requests reach the kernel. `posix` runs pread/pwrite on the I/O threads (no kernel queue):
/// a fallback for kernels that refuse both io_uring and libaio, and a baseline.
enum class SwapBackend { automatic, io_uring, libaio, posix };
std::string_view to_string(SwapBackend backend);
/// "auto", "io_uring", "libaio", "posix"; anything else throws zt::ConfigError listing these.
SwapBackend swap_backend_from_string(std::string_view name);

/// The backend `automatic` resolves to on this machine and, when it is not io_uring, why
/// (e.g. "io_uring_queue_init failed: Operation not permitted"). Probes the kernel once per call.
struct SwapBackendProbe {
  SwapBackend backend = SwapBackend::posix;
  std::string note;
};
SwapBackendProbe probe_swap_backend();

struct SwapOptions {
  std::filesystem::path nvme_path;  // an existing, writable directory on a local disk
  SwapBackend backend = SwapBackend::automatic;
  std::size_t block_size = 1 << 20;      // bytes per kernel request (aio.block_size)
  std::size_t queue_depth = 8;           // requests in flight per I/O thread (aio.queue_depth)
  std::size_t intra_op_parallelism = 1;  // I/O threads, each with its own queue; a request is split
                                         // across them (aio.intra_op_parallelism)
  bool single_submit = false;            // one submission call per block instead of batches
  bool overlap_events = true;            // refill the queue as blocks complete (false: in waves)
  /// Without O_DIRECT support (tmpfs on old kernels, ramfs, some network file systems) the engine
  /// refuses to start unless this is set; then it uses the page cache. The engine sets it when
  /// ZT_SWAP_BUFFERED_IO=1 (src/engine/swap_options_from_config.cpp).
  bool allow_buffered_io = false;
  /// Page-lock the buffers of allocate_buffer() (offload_*.pin_memory) when a CUDA device is usable,
  /// so that copies between them and the device run asynchronously; pageable otherwise, and when
  /// the file system's alignment exceeds the page size that pinned allocations guarantee.
  bool pin_memory = false;
  /// In the file name; -1: this process's rank in MPI_COMM_WORLD as zt::Runtime recorded it (also
  /// under a runtime over a sub-communicator, so that trainings side by side never share a name),
  /// 0 without a runtime.
  int rank = -1;
  std::string job_id;  // in the file name; empty: host name, process id and a per-process counter
};

/// One asynchronous read or write. Copyable; wait on it through the engine that issued it.
class SwapHandle {
 public:
  SwapHandle() = default;
  bool valid() const { return request_ != nullptr; }
  /// True when every block completed (successfully or not); never blocks.
  bool ready() const;

 private:
  friend class SwapEngine;
  explicit SwapHandle(std::shared_ptr<detail::SwapRequest> request) : request_(std::move(request)) {}
  std::shared_ptr<detail::SwapRequest> request_;
};

/// A registered swap tensor: where it lives in the rank's swap file.
struct SwapSlot {
  std::uint64_t offset = 0;      // aligned to SwapEngine::alignment()
  std::size_t bytes = 0;         // the caller's size
  std::size_t padded_bytes = 0;  // bytes reserved on disk (a multiple of the alignment)
};

/// Owns one swap file per rank under nvme_path (created at construction with O_EXCL, removed at
/// destruction, also when construction fails half-way), its I/O threads and their kernel queues.
/// Methods may be called from one thread at a time; the I/O runs on the engine's own threads.
/// Buffers passed to reads and writes must start at a multiple of alignment() (zt::Buffer with
/// kDirectIoAlignment, or allocate_buffer()) and stay alive until the request is waited on; their
/// size need not be a multiple of anything (a partial last block goes through a bounce block).
class SwapEngine {
 public:
  explicit SwapEngine(SwapOptions options);
  SwapEngine(const SwapEngine&) = delete;
  SwapEngine& operator=(const SwapEngine&) = delete;
  /// Waits for requests still in flight (their errors are dropped: call wait_all() to see them),
  /// stops the I/O threads and removes the swap file.
  ~SwapEngine();

  // ---- swap tensors: name -> region of the swap file, reserved on disk at registration -------
  /// Reserve `bytes` for `name` (fallocate): a full disk fails here with zt::IoError, not mid-run.
  /// On failure nothing is registered and the file is as before.
  const SwapSlot& register_tensor(const std::string& name, std::size_t bytes);
  /// Register `tensors` (name, bytes) in order, one after the other, with one reservation for all of
  /// them: a disk too small fails with the size the whole set needs, not the size up to the tensor
  /// that did not fit. On failure none is registered and the file is as before.
  void register_tensors(const std::vector<std::pair<std::string, std::size_t>>& tensors);
  bool has_tensor(const std::string& name) const;
  const SwapSlot& slot(const std::string& name) const;
  SwapHandle swap_out(const std::string& name, const void* source);  // write slot(name).bytes
  SwapHandle swap_in(const std::string& name, void* destination);    // read slot(name).bytes

  // ---- raw regions of the swap file ------------------------------------------------------------
  /// Reserve `bytes` more at the end of the file and return their offset (as register_tensor).
  std::uint64_t reserve(std::size_t bytes);
  /// `offset` must be a multiple of alignment() and [offset, offset + bytes) reserved.
  SwapHandle write(std::uint64_t offset, const void* source, std::size_t bytes);
  SwapHandle read(std::uint64_t offset, void* destination, std::size_t bytes);

  /// Block until the request completed; throws zt::IoError (file, offset, what the kernel said)
  /// if any of its blocks failed or came back short.
  void wait(const SwapHandle& handle);
  /// Block until every request issued so far completed; throws the first error among those not
  /// yet waited on.
  void wait_all();

  /// A host buffer of `bytes` (rounded up to the alignment) fit for this engine's I/O.
  Buffer allocate_buffer(std::size_t bytes, MemoryCategory category = MemoryCategory::optimizer_states) const;

  SwapBackend backend() const { return backend_; }
  /// Why `automatic` did not pick io_uring (empty when it did or the backend was forced).
  const std::string& backend_note() const { return backend_note_; }
  bool direct_io() const { return direct_io_; }
  /// Offset and size granularity of O_DIRECT on this file system (at least 4096).
  std::size_t alignment() const { return alignment_; }
  const std::filesystem::path& file_path() const { return file_path_; }
  std::uint64_t reserved_bytes() const { return reserved_bytes_; }
  const SwapOptions& options() const { return options_; }

 private:
  std::uint64_t reserve_region(std::size_t bytes, std::string_view purpose);
  SwapHandle submit(bool is_write, std::uint64_t offset, void* data, std::size_t bytes);
  void check_region(std::uint64_t offset, std::size_t bytes, std::string_view what) const;

  SwapOptions options_;
  SwapBackend backend_ = SwapBackend::posix;
  std::string backend_note_;
  bool direct_io_ = true;
  std::size_t alignment_ = kDirectIoAlignment;
  std::filesystem::path file_path_;
  std::unique_ptr<detail::SwapFile> file_;                // before the lanes: closed after they stop
  std::vector<std::unique_ptr<detail::SwapLane>> lanes_;  // one I/O thread and kernel queue each
  std::uint64_t reserved_bytes_ = 0;
  std::map<std::string, SwapSlot, std::less<>> slots_;
  std::vector<std::shared_ptr<detail::SwapRequest>> unobserved_;  // issued, not yet waited on
};

/// Runs a function over sub-groups whose data lives in swap tensors, double-buffered: while the
/// caller works on group i (in a buffer of its own), group i+1 is being read and group i-1
/// written. With buffer_count >= 3 reading, working and writing all overlap; with 2 the read of
/// i+1 waits for the write of i-1. Buffers are allocated once, at the largest group's size.
class SwapPipeline {
 public:
  struct Stats {
    double wall_seconds = 0;     // the whole run
    double work_seconds = 0;     // inside the caller's function
    double stalled_seconds = 0;  // waiting for I/O the work could not overlap
  };
  using Work = std::function<void(std::size_t group, std::span<std::byte> data)>;

  SwapPipeline(SwapEngine& engine, std::vector<std::string> tensor_names, std::size_t buffer_count = 3,
               MemoryCategory category = MemoryCategory::optimizer_states);
  /// Calls work(group, data) for every group in order, data holding the tensor's bytes; when
  /// write_back, the buffer is swapped out afterwards. Returns after every write completed.
  Stats run(const Work& work, bool write_back = true);

 private:
  SwapEngine& engine_;
  std::vector<std::string> names_;
  std::vector<Buffer> buffers_;
};

/// Throws zt::IoError unless `directory` exists and is a directory; the message starts with `key`
/// (e.g. "zero_optimization.offload_param.nvme_path") and says what is wrong and what to do.
/// SwapEngine's constructor checks its nvme_path so; check_engine_supports does it before a model
/// is built.
void check_swap_directory(const std::filesystem::path& directory, std::string_view key = "nvme_path");

/// A swap file found in a directory: one a job left behind when it was killed (a signal or
/// MPI_Abort runs no destructors), or one in use.
struct SwapFileEntry {
  std::filesystem::path path;
  std::uint64_t bytes = 0;
  int rank = -1;
  std::string host;  // from the default job id <host>.<pid>.<n>; empty for a custom job_id
  long pid = -1;
  /// True only when the file was made on this machine by a process that no longer exists: then
  /// nobody can be using it. Files of other hosts or custom job ids are never called stale.
  bool stale = false;
};
/// The zerotrain swap files in `directory` (not recursive), sorted by name.
std::vector<SwapFileEntry> list_swap_files(const std::filesystem::path& directory);

/// The file system holding `path`, for messages ("ext2/3/4", "xfs", "tmpfs", "lustre", ...; from
/// statfs's magic number, "type 0x..." when unknown, "unknown" when statfs fails).
std::string file_system_name(const std::filesystem::path& path);

}  // namespace zt
