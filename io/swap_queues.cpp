// The three kernel I/O queues of the swap engine.
#include "io/swap_queues.hpp"

#include <libaio.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <deque>
#include <vector>

#include "base/text.hpp"
#include "zerotrain/build_info.hpp"
#include "zerotrain/error.hpp"

#if ZT_HAVE_URING
#include <liburing.h>
#endif

namespace zt::detail {
namespace {

#if ZT_HAVE_URING
class UringQueue final : public IoQueue {
 public:
  UringQueue(std::size_t depth, bool single_submit) : depth_(depth), single_submit_(single_submit) {
    const int status = io_uring_queue_init(static_cast<unsigned>(depth), &ring_, 0);
    ZT_CHECK_AS(IoError, status >= 0, "io_uring_queue_init(", depth, ") failed: ", base::errno_text(-status),
                " (kernel too old, io_uring disabled by sysctl kernel.io_uring_disabled, or blocked by a "
                "container's seccomp profile)");
  }
  ~UringQueue() override { io_uring_queue_exit(&ring_); }
  UringQueue(const UringQueue&) = delete;
  UringQueue& operator=(const UringQueue&) = delete;

  std::size_t depth() const override { return depth_; }

  void submit(std::span<IoBlock* const> blocks, const IoDone& done) override {
    std::size_t prepared = 0;
    for (IoBlock* block : blocks) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) {  // more blocks than the ring holds: the caller broke the depth limit
        done(*block, -EBUSY);
        continue;
      }
      if (block->is_write) {
        io_uring_prep_write(sqe, block->fd, block->data, static_cast<unsigned>(block->bytes), block->offset);
      } else {
        io_uring_prep_read(sqe, block->fd, block->data, static_cast<unsigned>(block->bytes), block->offset);
      }
      io_uring_sqe_set_data(sqe, block);
      ++prepared;
      if (single_submit_) {
        flush();
        prepared = 0;
      }
    }
    if (prepared > 0) flush();
  }

  void reap(bool block, const IoDone& done) override {
    if (block) {
      io_uring_cqe* first = nullptr;
      int status;
      do {
        status = io_uring_wait_cqe(&ring_, &first);
      } while (status == -EINTR);
      ZT_CHECK_AS(IoError, status >= 0, "io_uring_wait_cqe failed: ", base::errno_text(-status));
    }
    std::array<io_uring_cqe*, 64> cqes{};
    while (true) {
      const unsigned count = io_uring_peek_batch_cqe(&ring_, cqes.data(), cqes.size());
      if (count == 0) break;
      for (unsigned i = 0; i < count; ++i) {
        auto* completed = static_cast<IoBlock*>(io_uring_cqe_get_data(cqes[i]));
        const long result = cqes[i]->res;
        io_uring_cqe_seen(&ring_, cqes[i]);
        done(*completed, result);
      }
    }
  }

 private:
  /// Hand the prepared entries to the kernel. A failure leaves them in the submission queue, so
  /// the caller must not use this queue again (the lane marks itself broken).
  void flush() {
    int status;
    do {
      status = io_uring_submit(&ring_);
    } while (status == -EINTR || status == -EAGAIN);
    ZT_CHECK_AS(IoError, status >= 0, "io_uring_submit failed: ", base::errno_text(-status));
  }

  io_uring ring_{};
  std::size_t depth_;
  bool single_submit_;
};
#endif

class AioQueue final : public IoQueue {
 public:
  AioQueue(std::size_t depth, bool single_submit)
      : depth_(depth), single_submit_(single_submit), control_blocks_(depth), events_(depth) {
    const int status = io_setup(static_cast<int>(depth), &context_);
    ZT_CHECK_AS(
        IoError, status >= 0, "io_setup(", depth, ") failed: ", base::errno_text(-status),
        status == -EAGAIN ? " (the system-wide limit fs.aio-max-nr is reached; raise it with sysctl)" : "");
    for (iocb& control : control_blocks_) free_.push_back(&control);
  }
  ~AioQueue() override { io_destroy(context_); }
  AioQueue(const AioQueue&) = delete;
  AioQueue& operator=(const AioQueue&) = delete;

  std::size_t depth() const override { return depth_; }

  void submit(std::span<IoBlock* const> blocks, const IoDone& done) override {
    std::vector<iocb*> batch;
    batch.reserve(blocks.size());
    for (IoBlock* block : blocks) {
      if (free_.empty()) {  // the caller broke the depth limit
        done(*block, -EBUSY);
        continue;
      }
      iocb* control = free_.back();
      free_.pop_back();
      if (block->is_write) {
        io_prep_pwrite(control, block->fd, block->data, block->bytes, static_cast<long long>(block->offset));
      } else {
        io_prep_pread(control, block->fd, block->data, block->bytes, static_cast<long long>(block->offset));
      }
      control->data = block;
      batch.push_back(control);
      if (single_submit_) {
        send(batch, done);
        batch.clear();
      }
    }
    send(batch, done);
  }

  void reap(bool block, const IoDone& done) override {
    timespec no_wait{0, 0};
    int count;
    do {
      count = io_getevents(context_, block ? 1 : 0, static_cast<long>(events_.size()), events_.data(),
                           block ? nullptr : &no_wait);
    } while (count == -EINTR);
    ZT_CHECK_AS(IoError, count >= 0, "io_getevents failed: ", base::errno_text(-count));
    for (int i = 0; i < count; ++i) {
      iocb* control = events_[i].obj;
      free_.push_back(control);
      // res carries the byte count, or -errno stored in an unsigned long.
      done(*static_cast<IoBlock*>(control->data), static_cast<long>(events_[i].res));
    }
  }

 private:
  void send(std::vector<iocb*>& batch, const IoDone& done) {
    std::size_t sent = 0;
    while (sent < batch.size()) {
      const int status = io_submit(context_, static_cast<long>(batch.size() - sent), batch.data() + sent);
      if (status == -EINTR || status == -EAGAIN) continue;
      if (status < 0) {  // the first remaining block was refused: fail it and go on with the rest
        free_.push_back(batch[sent]);
        done(*static_cast<IoBlock*>(batch[sent]->data), status);
        ++sent;
        continue;
      }
      sent += static_cast<std::size_t>(status);
    }
  }

  io_context_t context_{};
  std::size_t depth_;
  bool single_submit_;
  std::vector<iocb> control_blocks_;
  std::vector<iocb*> free_;
  std::vector<io_event> events_;
};

/// pread/pwrite on the calling thread: submit() queues, reap() runs them.
class PosixQueue final : public IoQueue {
 public:
  explicit PosixQueue(std::size_t depth) : depth_(depth) {}
  std::size_t depth() const override { return depth_; }

  void submit(std::span<IoBlock* const> blocks, const IoDone&) override {
    queued_.insert(queued_.end(), blocks.begin(), blocks.end());
  }

  void reap(bool, const IoDone& done) override {
    while (!queued_.empty()) {
      IoBlock* block = queued_.front();
      queued_.pop_front();
      done(*block, transfer(*block));
    }
  }

 private:
  /// One call, like the asynchronous backends: a short count is reported, not retried.
  static long transfer(const IoBlock& block) {
    ssize_t count;
    do {
      count = block.is_write ? ::pwrite(block.fd, block.data, block.bytes, static_cast<off_t>(block.offset))
                             : ::pread(block.fd, block.data, block.bytes, static_cast<off_t>(block.offset));
    } while (count < 0 && errno == EINTR);
    return count < 0 ? -errno : static_cast<long>(count);
  }

  std::size_t depth_;
  std::deque<IoBlock*> queued_;
};

}  // namespace

std::unique_ptr<IoQueue> make_io_queue(SwapBackend backend, std::size_t depth, bool single_submit) {
  switch (backend) {
    case SwapBackend::io_uring:
#if ZT_HAVE_URING
      return std::make_unique<UringQueue>(depth, single_submit);
#else
      ZT_THROW_AS(IoError, "this build of zerotrain has no io_uring (configure with liburing-dev installed)");
#endif
    case SwapBackend::libaio:
      return std::make_unique<AioQueue>(depth, single_submit);
    case SwapBackend::posix:
      return std::make_unique<PosixQueue>(depth);
    case SwapBackend::automatic:
      break;
  }
  ZT_THROW_AS(IoError, "make_io_queue: resolve SwapBackend::automatic before making a queue");
}

}  // namespace zt::detail
