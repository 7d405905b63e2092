// The swap engine: one O_DIRECT file per rank, requests split into blocks, I/O threads that keep
// queue_depth blocks in flight each.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include "base/round_up.hpp"
#include "base/text.hpp"
#include "io/swap_naming.hpp"
#include "io/swap_queues.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/swap.hpp"

namespace zt {
namespace detail {

/// One read or write: its blocks, where a partial last block bounces, and how it ended.
struct SwapRequest {
  bool is_write = false;
  std::uint64_t offset = 0;
  std::size_t bytes = 0;
  std::string file;  // for messages
  std::vector<IoBlock> blocks;
  Buffer bounce;  // the partial last block, padded to the alignment
  std::byte* tail_destination = nullptr;
  std::size_t tail_bytes = 0;

  std::atomic<std::size_t> remaining{0};
  std::mutex mutex;
  std::condition_variable finished;
  bool done = false;
  std::string error;  // the first failed block, empty on success

  void complete_block(const IoBlock& block, long result) {
    if (result != static_cast<long>(block.bytes)) record_failure(block, result);
    if (remaining.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    std::lock_guard lock(mutex);
    if (!is_write && error.empty() && tail_bytes > 0)
      std::memcpy(tail_destination, bounce.data(), tail_bytes);
    done = true;
    finished.notify_all();
  }

  void record_failure(const IoBlock& block, long result) {
    const char* verb = block.is_write ? "write" : "read";
    std::string message =
        result < 0
            ? concat(verb, " of ", block.bytes, " bytes at offset ", block.offset, " of swap file '", file,
                     "' failed: ", base::errno_text(static_cast<int>(-result)))
            : concat("short ", verb, " at offset ", block.offset, " of swap file '", file, "': ", result,
                     " of ", block.bytes, " bytes",
                     block.is_write ? " (file system full or quota reached?)"
                                    : " (was the file truncated or replaced behind zerotrain's back?)");
    std::lock_guard lock(mutex);
    if (error.empty()) error = std::move(message);
  }

  void wait() {
    std::unique_lock lock(mutex);
    finished.wait(lock, [&] { return done; });
  }
  bool is_done() {
    std::lock_guard lock(mutex);
    return done;
  }
};

/// The rank's swap file: created exclusively, closed and removed on destruction.
class SwapFile {
 public:
  SwapFile(std::filesystem::path path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~SwapFile() {
    ::close(fd_);
    ::unlink(path_.c_str());
  }
  SwapFile(const SwapFile&) = delete;
  SwapFile& operator=(const SwapFile&) = delete;
  int fd() const { return fd_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  int fd_;
};

/// One I/O thread and its kernel queue. Blocks wait in `pending_` until the queue has room.
class SwapLane {
 public:
  SwapLane(std::unique_ptr<IoQueue> queue, bool overlap_events)
      : queue_(std::move(queue)), overlap_events_(overlap_events), slots_(queue_->depth()) {
    for (std::size_t i = 0; i < slots_.size(); ++i) free_slots_.push_back(i);
    thread_ = std::thread([this] { loop(); });
  }
  /// Finishes every block handed over, then stops.
  ~SwapLane() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_one();
    thread_.join();
  }
  SwapLane(const SwapLane&) = delete;
  SwapLane& operator=(const SwapLane&) = delete;

  void enqueue(const std::shared_ptr<SwapRequest>& request, std::size_t first_block, std::size_t end_block) {
    if (first_block == end_block) return;
    {
      std::lock_guard lock(mutex_);
      for (std::size_t block = first_block; block < end_block; ++block) pending_.push_back({request, block});
    }
    wake_.notify_one();
  }

 private:
  struct Work {
    std::shared_ptr<SwapRequest> request;  // keeps the request alive while its block is in flight
    std::size_t block = 0;
  };

  void loop() {
    std::vector<IoBlock*> batch;
    std::size_t in_flight = 0;
    const IoDone on_done = [&](IoBlock& block, long result) {
      const auto slot = reinterpret_cast<std::uintptr_t>(block.tag);
      Work finished = std::exchange(slots_[slot], {});
      free_slots_.push_back(slot);
      --in_flight;
      finished.request->complete_block(block, result);
    };
    while (true) {
      batch.clear();
      {
        std::unique_lock lock(mutex_);
        if (in_flight == 0) wake_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
        if (stopping_ && pending_.empty() && in_flight == 0) return;
        // overlap_events: refill as blocks complete; otherwise submit in waves of queue_depth.
        if (overlap_events_ || in_flight == 0) {
          while (!pending_.empty() && !free_slots_.empty()) {
            const std::size_t slot = free_slots_.back();
            free_slots_.pop_back();
            slots_[slot] = std::move(pending_.front());
            pending_.pop_front();
            IoBlock& block = slots_[slot].request->blocks[slots_[slot].block];
            block.tag = reinterpret_cast<void*>(static_cast<std::uintptr_t>(slot));
            batch.push_back(&block);
          }
        }
      }
      in_flight += batch.size();
      if (!broken_.empty()) {
        for (IoBlock* block : batch) fail(*block, on_done);
        continue;
      }
      try {
        if (!batch.empty()) queue_->submit(batch, on_done);
        if (in_flight > 0) queue_->reap(true, on_done);
      } catch (const Error& error) {
        // The kernel queue is unusable (it may hold entries it never took): fail what was handed
        // to it and everything after, so waiters get the reason instead of hanging.
        broken_ = error.what();
        for (std::size_t slot = 0; slot < slots_.size(); ++slot) {
          if (slots_[slot].request) fail(slots_[slot].request->blocks[slots_[slot].block], on_done);
        }
      }
    }
  }

  void fail(IoBlock& block, const IoDone& on_done) {
    Work& work = slots_[reinterpret_cast<std::uintptr_t>(block.tag)];
    {
      std::lock_guard lock(work.request->mutex);
      if (work.request->error.empty()) work.request->error = broken_;
    }
    on_done(block, -EIO);
  }

  std::unique_ptr<IoQueue> queue_;
  bool overlap_events_;
  std::vector<Work> slots_;  // blocks in the kernel, indexed by IoBlock::tag
  std::vector<std::size_t> free_slots_;
  std::string broken_;  // set once the kernel queue failed

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Work> pending_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace detail

namespace {

using detail::concat;

using base::errno_text;
using base::round_up;

}  // namespace

std::string file_system_name(const std::filesystem::path& path) {
  struct statfs info {};
  if (::statfs(path.c_str(), &info) != 0) return "unknown";
  switch (static_cast<unsigned long>(info.f_type)) {
    case 0xEF53:
      return "ext2/3/4";
    case 0x58465342:
      return "xfs";
    case 0x9123683E:
      return "btrfs";
    case 0x01021994:
      return "tmpfs";
    case 0x858458F6:
      return "ramfs";
    case 0x6969:
      return "nfs";
    case 0x794C7630:
      return "overlayfs";
    case 0x65735546:
      return "fuse";
    case 0x0BD00BD0:
      return "lustre";
    case 0x47504653:
      return "gpfs";
    default:
      return concat("type 0x", std::hex, info.f_type);
  }
}

namespace {

std::uint64_t free_bytes(const std::filesystem::path& path) {
  struct statvfs info {};
  if (::statvfs(path.c_str(), &info) != 0) return 0;
  return static_cast<std::uint64_t>(info.f_bavail) * info.f_frsize;
}

/// "8388608 bytes (8.0 MiB)": exact for scripts, readable for people.
std::string bytes_text(std::uint64_t bytes) {
  if (bytes < 1024) return concat(bytes, " bytes");
  return concat(bytes, " bytes (", base::byte_size_text(bytes), ")");
}

std::string default_job_id() {
  static std::atomic<unsigned> engines_in_process{0};
  return concat(detail::swap_host_name(), ".", ::getpid(), ".", engines_in_process.fetch_add(1));
}

/// The direct-I/O alignment the file system asks for (statx DIOALIGN, Linux 6.1+), at least 4 KiB.
std::size_t direct_io_alignment(int fd) {
  std::size_t alignment = kDirectIoAlignment;
#ifdef STATX_DIOALIGN
  struct statx info {};
  if (::statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &info) == 0 && (info.stx_mask & STATX_DIOALIGN) != 0) {
    alignment = std::max<std::size_t>({alignment, info.stx_dio_offset_align, info.stx_dio_mem_align});
  }
#else
  (void)fd;
#endif
  return alignment;
}

std::string buffered_io_hint() {
  return "use a directory on a local disk file system (ext4, xfs), or allow buffered I/O through the page "
         "cache (slower, uses host memory): SwapOptions::allow_buffered_io = true, or ZT_SWAP_BUFFERED_IO=1";
}

}  // namespace

void check_swap_directory(const std::filesystem::path& directory, std::string_view key) {
  ZT_CHECK_AS(IoError, !directory.empty(), key,
              " is empty; set offload_optimizer.nvme_path (or offload_param.nvme_path) to a directory on "
              "a local NVMe disk");
  struct stat info {};
  if (::stat(directory.c_str(), &info) != 0) {
    const int error = errno;
    ZT_THROW_AS(IoError, key, " '", directory.string(), "' is not usable: ", errno_text(error),
                error == ENOENT    ? " (create the directory first)"
                : error == ENOTDIR ? " (a component of the path is a file, not a directory)"
                                   : "");
  }
  ZT_CHECK_AS(IoError, S_ISDIR(info.st_mode), key, " '", directory.string(), "' is not a directory");
}

std::string_view to_string(SwapBackend backend) {
  switch (backend) {
    case SwapBackend::automatic:
      return "auto";
    case SwapBackend::io_uring:
      return "io_uring";
    case SwapBackend::libaio:
      return "libaio";
    case SwapBackend::posix:
      return "posix";
  }
  return "?";
}

SwapBackend swap_backend_from_string(std::string_view name) {
  for (SwapBackend backend :
       {SwapBackend::automatic, SwapBackend::io_uring, SwapBackend::libaio, SwapBackend::posix}) {
    if (name == to_string(backend)) return backend;
  }
  ZT_THROW_AS(ConfigError, "unknown swap backend '", name, "'; expected auto, io_uring, libaio or posix");
}

SwapBackendProbe probe_swap_backend() {
  std::string note;
  for (SwapBackend backend : {SwapBackend::io_uring, SwapBackend::libaio}) {
    try {
      detail::make_io_queue(backend, 1, false);
      return {backend, note};
    } catch (const IoError& error) {
      // Keep the reason without the "zerotrain error (file:line): " prefix.
      std::string_view reason = error.what();
      if (auto colon = reason.find("): "); colon != std::string_view::npos) reason.remove_prefix(colon + 3);
      if (!note.empty()) note += "; ";
      note += concat(to_string(backend), ": ", reason);
    }
  }
  return {SwapBackend::posix, note};
}

bool SwapHandle::ready() const {
  return request_ == nullptr || request_->is_done();
}

SwapEngine::SwapEngine(SwapOptions options) : options_(std::move(options)) {
  ZT_CHECK_AS(ConfigError, options_.block_size > 0, "aio.block_size must be positive");
  ZT_CHECK_AS(ConfigError, options_.queue_depth > 0 && options_.queue_depth <= 4096,
              "aio.queue_depth must be in [1, 4096], got ", options_.queue_depth);
  ZT_CHECK_AS(ConfigError, options_.intra_op_parallelism > 0 && options_.intra_op_parallelism <= 64,
              "aio.intra_op_parallelism must be in [1, 64], got ", options_.intra_op_parallelism);
  check_swap_directory(options_.nvme_path, "swap: nvme_path");

  const int rank = options_.rank >= 0 ? options_.rank : std::max(detail::error_rank(), 0);
  const std::string job = options_.job_id.empty() ? default_job_id() : options_.job_id;
  file_path_ = options_.nvme_path / concat(detail::kSwapFilePrefix, rank, ".", job, detail::kSwapFileSuffix);

  // O_EXCL: a file of another job (or engine) with this name is never reused or truncated.
  constexpr int kFlags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;
  int fd = ::open(file_path_.c_str(), kFlags | O_DIRECT, 0600);
  if (fd < 0 && errno == EINVAL) {
    // The file system refuses O_DIRECT. The failed open may still have created the file (ours: O_EXCL).
    ::unlink(file_path_.c_str());
    ZT_CHECK_AS(IoError, options_.allow_buffered_io, "swap: the file system of nvme_path '",
                options_.nvme_path.string(), "' (", file_system_name(options_.nvme_path),
                ") does not support O_DIRECT; ", buffered_io_hint());
    direct_io_ = false;
    fd = ::open(file_path_.c_str(), kFlags, 0600);
  }
  if (fd < 0) {
    const int error = errno;
    ZT_THROW_AS(IoError, "swap: cannot create the swap file '", file_path_.string(), "': ", errno_text(error),
                error == EACCES || error == EPERM || error == EROFS
                    ? " (nvme_path is not writable by this process)"
                    : "");
  }
  file_ = std::make_unique<detail::SwapFile>(file_path_, fd);  // from here on removed on any failure

  alignment_ = direct_io_ ? direct_io_alignment(fd) : kDirectIoAlignment;
  ZT_CHECK_AS(ConfigError, options_.block_size % alignment_ == 0, "aio.block_size (", options_.block_size,
              ") must be a multiple of ", alignment_, ", the direct-I/O alignment of nvme_path '",
              options_.nvme_path.string(), "'");

  // Some file systems accept O_DIRECT at open and refuse it at the first transfer: try one block.
  if (direct_io_) {
    Buffer probe(Device::host(), alignment_, MemoryCategory::other, alignment_);
    std::memset(probe.data(), 0, alignment_);
    const ssize_t written = ::pwrite(fd, probe.data(), alignment_, 0);
    const int error = errno;
    ZT_CHECK_AS(IoError, written == static_cast<ssize_t>(alignment_), "swap: a ", alignment_,
                "-byte O_DIRECT write to '", file_path_.string(), "' failed (",
                written < 0 ? errno_text(error) : concat("wrote ", written, " bytes"), ") on file system ",
                file_system_name(options_.nvme_path), "; ", buffered_io_hint());
    ZT_CHECK_AS(IoError, ::ftruncate(fd, 0) == 0, "swap: ftruncate of '", file_path_.string(),
                "' failed: ", errno_text(errno));
  }

  if (options_.backend == SwapBackend::automatic) {
    const SwapBackendProbe probe = probe_swap_backend();
    backend_ = probe.backend;
    backend_note_ = probe.note;
    ZT_CHECK_AS(IoError, backend_ != SwapBackend::posix,
                "swap: the kernel refuses both io_uring and libaio (", backend_note_,
                "); set the backend to posix (ZT_SWAP_BACKEND=posix) to use pread/pwrite");
  } else {
    backend_ = options_.backend;
  }
  for (std::size_t lane = 0; lane < options_.intra_op_parallelism; ++lane) {
    lanes_.push_back(std::make_unique<detail::SwapLane>(
        detail::make_io_queue(backend_, options_.queue_depth, options_.single_submit),
        options_.overlap_events));
  }
}

SwapEngine::~SwapEngine() {
  lanes_.clear();  // drains every block in flight: buffers must not be written after we return
  file_.reset();
}

std::uint64_t SwapEngine::reserve(std::size_t bytes) {
  return reserve_region(bytes, "a region");
}

std::uint64_t SwapEngine::reserve_region(std::size_t bytes, std::string_view purpose) {
  const std::uint64_t offset = reserved_bytes_;
  const std::size_t padded = round_up(std::max<std::size_t>(bytes, 1), alignment_);
  const int fd = file_->fd();
  if (::fallocate(fd, 0, static_cast<off_t>(offset), static_cast<off_t>(padded)) != 0) {
    const int error = errno;
    if (error == EOPNOTSUPP) {
      // No preallocation on this file system: the file grows sparse and a full disk shows up at
      // the first write that needs the space (named with its file and offset).
      ZT_CHECK_AS(IoError, ::ftruncate(fd, static_cast<off_t>(offset + padded)) == 0, "swap: cannot grow '",
                  file_path_.string(), "' to ", offset + padded, " bytes: ", errno_text(errno));
    } else {
      // Give back whatever fallocate took before it failed, so the engine stays as it was.
      [[maybe_unused]] const int rolled_back = ::ftruncate(fd, static_cast<off_t>(offset));
      ZT_THROW_AS(IoError, "swap: cannot reserve ", bytes_text(padded), " for ", purpose, " at offset ",
                  offset, " of '", file_path_.string(), "': ", errno_text(error),
                  error == ENOSPC
                      ? concat(" (nvme_path '", options_.nvme_path.string(), "' has ",
                               bytes_text(free_bytes(options_.nvme_path)), " free; the swap file needs ",
                               bytes_text(offset + padded), " in all on this rank)")
                      : std::string());
    }
  }
  reserved_bytes_ = offset + padded;
  return offset;
}

const SwapSlot& SwapEngine::register_tensor(const std::string& name, std::size_t bytes) {
  ZT_CHECK(!slots_.contains(name), "swap tensor '", name, "' is registered already");
  ZT_CHECK(bytes > 0, "swap tensor '", name, "' has no bytes");
  SwapSlot slot;
  slot.bytes = bytes;
  slot.padded_bytes = round_up(bytes, alignment_);
  slot.offset = reserve_region(bytes, concat("swap tensor '", name, "'"));
  return slots_.emplace(name, slot).first->second;
}

void SwapEngine::register_tensors(const std::vector<std::pair<std::string, std::size_t>>& tensors) {
  if (tensors.empty()) return;
  std::set<std::string_view> names;
  std::size_t total = 0;
  for (const auto& [name, bytes] : tensors) {
    ZT_CHECK(!slots_.contains(name) && names.insert(name).second, "swap tensor '", name,
             "' is registered already");
    ZT_CHECK(bytes > 0, "swap tensor '", name, "' has no bytes");
    total += round_up(bytes, alignment_);
  }
  std::uint64_t offset =
      reserve_region(total, concat(tensors.size(), " swap tensors ('", tensors.front().first, "' to '",
                                   tensors.back().first, "')"));
  for (const auto& [name, bytes] : tensors) {
    SwapSlot slot;
    slot.bytes = bytes;
    slot.padded_bytes = round_up(bytes, alignment_);
    slot.offset = offset;
    offset += slot.padded_bytes;
    slots_.emplace(name, slot);
  }
}

bool SwapEngine::has_tensor(const std::string& name) const {
  return slots_.contains(name);
}

const SwapSlot& SwapEngine::slot(const std::string& name) const {
  auto found = slots_.find(name);
  ZT_CHECK(found != slots_.end(), "no swap tensor '", name, "' is registered");
  return found->second;
}

SwapHandle SwapEngine::swap_out(const std::string& name, const void* source) {
  const SwapSlot& tensor = slot(name);
  return write(tensor.offset, source, tensor.bytes);
}

SwapHandle SwapEngine::swap_in(const std::string& name, void* destination) {
  const SwapSlot& tensor = slot(name);
  return read(tensor.offset, destination, tensor.bytes);
}

SwapHandle SwapEngine::write(std::uint64_t offset, const void* source, std::size_t bytes) {
  // The engine never writes into `source`; submit() takes one pointer type for both directions.
  return submit(true, offset, const_cast<void*>(source), bytes);
}

SwapHandle SwapEngine::read(std::uint64_t offset, void* destination, std::size_t bytes) {
  return submit(false, offset, destination, bytes);
}

void SwapEngine::check_region(std::uint64_t offset, std::size_t bytes, std::string_view what) const {
  ZT_CHECK(offset % alignment_ == 0, "swap ", what, " at offset ", offset, ": offsets must be multiples of ",
           alignment_);
  ZT_CHECK(offset + round_up(bytes, alignment_) <= reserved_bytes_, "swap ", what, " of ", bytes,
           " bytes at offset ", offset, " goes past the ", reserved_bytes_,
           " bytes reserved (register_tensor or reserve first)");
}

SwapHandle SwapEngine::submit(bool is_write, std::uint64_t offset, void* data, std::size_t bytes) {
  const char* what = is_write ? "write" : "read";
  check_region(offset, bytes, what);
  ZT_CHECK(bytes == 0 || data != nullptr, "swap ", what, " of ", bytes, " bytes with a null buffer");
  ZT_CHECK(!direct_io_ || reinterpret_cast<std::uintptr_t>(data) % alignment_ == 0, "swap ", what,
           ": the buffer at ", data, " is not aligned to ", alignment_,
           " bytes, as O_DIRECT needs (allocate it with SwapEngine::allocate_buffer or a zt::Buffer with "
           "kDirectIoAlignment)");

  // Requests that nobody will report on any more need not be kept.
  std::erase_if(unobserved_, [](const std::shared_ptr<detail::SwapRequest>& request) {
    std::lock_guard lock(request->mutex);
    return request->done && request->error.empty();
  });

  auto request = std::make_shared<detail::SwapRequest>();
  request->is_write = is_write;
  request->offset = offset;
  request->bytes = bytes;
  request->file = file_path_.string();
  const std::size_t whole = bytes / alignment_ * alignment_;
  const std::size_t tail = bytes - whole;
  auto* bytes_at = static_cast<std::byte*>(data);
  const int fd = file_->fd();
  request->blocks.reserve(whole / options_.block_size + 2);
  for (std::size_t done = 0; done < whole; done += options_.block_size) {
    request->blocks.push_back(
        {is_write, fd, bytes_at + done, std::min(options_.block_size, whole - done), offset + done, nullptr});
  }
  if (tail > 0) {
    // The partial last block goes through an aligned, zero-padded block of the engine's own.
    request->bounce = Buffer(Device::host(), alignment_, MemoryCategory::other, alignment_);
    auto* bounce = request->bounce.as<std::byte>();
    if (is_write) {
      std::memcpy(bounce, bytes_at + whole, tail);
      std::memset(bounce + tail, 0, alignment_ - tail);
    } else {
      request->tail_destination = bytes_at + whole;
      request->tail_bytes = tail;
    }
    request->blocks.push_back({is_write, fd, bounce, alignment_, offset + whole, nullptr});
  }
  if (request->blocks.empty()) {
    request->done = true;
    return SwapHandle(std::move(request));
  }
  request->remaining.store(request->blocks.size());
  unobserved_.push_back(request);

  // Consecutive runs of blocks per lane, as DeepSpeed splits one operation across its threads.
  const std::size_t count = request->blocks.size();
  const std::size_t lanes = lanes_.size();
  for (std::size_t lane = 0; lane < lanes; ++lane) {
    lanes_[lane]->enqueue(request, count * lane / lanes, count * (lane + 1) / lanes);
  }
  return SwapHandle(std::move(request));
}

void SwapEngine::wait(const SwapHandle& handle) {
  ZT_CHECK(handle.valid(), "SwapEngine::wait on an empty SwapHandle");
  detail::SwapRequest& request = *handle.request_;
  request.wait();
  std::erase(unobserved_, handle.request_);
  std::lock_guard lock(request.mutex);
  if (!request.error.empty()) ZT_THROW_AS(IoError, "swap: ", request.error);
}

void SwapEngine::wait_all() {
  std::string first_error;
  for (const auto& request : unobserved_) {
    request->wait();
    std::lock_guard lock(request->mutex);
    if (first_error.empty()) first_error = request->error;
  }
  unobserved_.clear();
  if (!first_error.empty()) ZT_THROW_AS(IoError, "swap: ", first_error);
}

Buffer SwapEngine::allocate_buffer(std::size_t bytes, MemoryCategory category) const {
  constexpr std::size_t kPinnedAlignment = 4096;  // cudaHostAlloc returns page-aligned memory
  const HostMemoryKind kind = options_.pin_memory && alignment_ <= kPinnedAlignment
                                  ? HostMemoryKind::pinned
                                  : HostMemoryKind::pageable;
  return Buffer(Device::host(), round_up(std::max<std::size_t>(bytes, 1), alignment_), category, alignment_,
                kind);
}

}  // namespace zt
