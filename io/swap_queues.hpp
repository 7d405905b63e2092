// Kernel I/O queues behind the swap engine: io_uring, libaio, and plain pread/pwrite. Internal.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "zerotrain/swap.hpp"

namespace zt::detail {

/// One kernel request: a block of a swap request.
struct IoBlock {
  bool is_write = false;
  int fd = -1;
  std::byte* data = nullptr;
  std::size_t bytes = 0;
  std::uint64_t offset = 0;
  void* tag = nullptr;  // handed back on completion
};

/// result: bytes transferred, or -errno.
using IoDone = std::function<void(IoBlock& block, long result)>;

/// A queue of at most depth() blocks in flight. Used by one thread.
class IoQueue {
 public:
  virtual ~IoQueue() = default;
  virtual std::size_t depth() const = 0;
  /// Hand blocks to the kernel (one call per block when single_submit). Blocks the kernel refused
  /// complete at once through `done` with the error.
  virtual void submit(std::span<IoBlock* const> blocks, const IoDone& done) = 0;
  /// Report completed blocks through `done`; with `block`, wait until there is at least one.
  virtual void reap(bool block, const IoDone& done) = 0;
};

/// A queue of the given backend (not `automatic`); throws zt::IoError saying why the kernel
/// refused it (e.g. io_uring blocked by seccomp, aio-max-nr exhausted).
std::unique_ptr<IoQueue> make_io_queue(SwapBackend backend, std::size_t depth, bool single_submit);

}  // namespace zt::detail
