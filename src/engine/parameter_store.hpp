// ZeRO-3's parameter shard: this rank's piece of every parameter, in the compute dtype. Internal
// to the engine (docs/offload.md, "Parameters on NVMe").
//
// In memory (no offload_param, or device "cpu" with the engine on the host), the store wraps the
// engine's contiguous shard on the engine's device. offload_param "cpu" with the engine on a device
// keeps every piece in host memory instead (no swap file: the options' swap unset), as below. With
// offload_param "nvme" the pieces live in the rank's parameter swap file, except those kept in host memory up
// to offload_param.max_in_cpu elements (whole pieces, in layout order, as DeepSpeed keeps its first
// max_in_cpu elements on the host). Swapped pieces pass through a pool of offload_param.buffer_count buffers,
// each the size of the largest swapped piece (at most offload_param.buffer_size elements):
//   - gathering reads a piece (acquire/release); prefetch() starts the reads of pieces the
//     gatherer will need next, so that they overlap the modules computing before them;
//   - the optimizer step writes new pieces (update_target/commit): a piece is only written, never
//     read, since the update computes every element from the fp32 master;
//   - a buffer keeps its piece after use, as a cache, until the pool needs it (the refresh of
//     persistent parameters after a step reads pieces the step has just written).
// Reads never pass writes of the same piece: a piece being written is served from its buffer.
// With the engine on a device (CUDA, the emulated device) the swapped and kept pieces are still in
// host memory: gathers take them to the device with copy_to_device(), on the engine's transfer
// stream, which only the gather's collective waits for: from a pool buffer, or from the kept pieces
// when they are page-locked (offload_param.pin_memory, DeepSpeed's default; pageable kept pieces,
// pin_memory false or a page-locked allocation refused, are copied at once on its compute stream).
// A buffer whose piece is on its way there takes no new bytes (a read, new values) before that copy
// is done, nor does a page-locked kept piece (an event, waited for only then: the optimizer step
// comes long after the gathers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "src/engine/partition_plan.hpp"
#include "zerotrain/device.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/execution.hpp"
#include "zerotrain/swap.hpp"

namespace zt::engine_detail {

struct ParameterStoreOptions {
  DType dtype = DType::fp32;
  /// offload_param "nvme": the swap file's settings. Unset (offload_param "cpu" with the engine on a
  /// device): no swap file, every piece in host memory (max_in_cpu must then be the int64 maximum).
  std::optional<SwapOptions> swap;
  std::int64_t max_in_cpu = 1'000'000'000;     // offload_param.max_in_cpu (elements)
  std::int64_t buffer_elements = 100'000'000;  // offload_param.buffer_size
  std::size_t buffer_count = 5;                // offload_param.buffer_count
  /// offload_param.pin_memory: with the engine on a device, the kept pieces are page-locked (the
  /// pool's buffers follow swap->pin_memory), so that gathers copy them asynchronously.
  bool pin_memory = false;
};

/// Counters of the NVMe traffic (zero in host memory).
struct ParameterStoreStats {
  std::uint64_t bytes_read = 0;
  std::uint64_t bytes_written = 0;
  std::uint64_t reads = 0;          // pieces read from the swap file
  std::uint64_t reads_waited = 0;   // ... of which a caller had to wait for (not prefetched in time)
  std::uint64_t cache_hits = 0;     // acquires served by a buffer that still held the piece
  double read_wait_seconds = 0.0;   // blocked in acquire() for reads
  double write_wait_seconds = 0.0;  // blocked for writes (a buffer needed, or finish_updates())
  double copy_wait_seconds = 0.0;   // blocked for a buffer's copy to the device (engine on a device)
};

class ParameterStore {
 public:
  /// All pieces in `shard` (the engine's shard buffer in the memory of `execution`'s device,
  /// layout[i].shard_offset; not owned).
  ParameterStore(const std::vector<FlatParameter>& layout, DType dtype, std::byte* shard,
                 const ExecutionContext& execution = ExecutionContext::host());
  /// offload_param "nvme": creates the swap file and reserves the swapped pieces on disk (a bad
  /// nvme_path or a disk too small fails here); `initial_shard` holds every piece's first value, in
  /// the memory of `engine`'s device, the device the gathers copy pieces to.
  ParameterStore(const std::vector<FlatParameter>& layout, const ParameterStoreOptions& options,
                 const std::byte* initial_shard, const ExecutionContext& engine = ExecutionContext::host());
  ~ParameterStore();  // finishes the I/O in flight
  ParameterStore(const ParameterStore&) = delete;
  ParameterStore& operator=(const ParameterStore&) = delete;

  bool on_nvme(std::size_t index) const { return pieces_[index].host == nullptr; }
  std::int64_t host_elements() const { return host_elements_; }
  /// The kept pieces are page-locked host memory, copied to the engine's device on its transfer
  /// stream (pin_memory with the engine on a device, unless the allocation was refused).
  bool kept_pieces_pinned() const { return kept_pinned_; }
  std::int64_t nvme_elements() const { return nvme_elements_; }
  /// Where acquire(), update_target() and read()/write() pointers are: the engine's device in
  /// memory, the host with offload_param "nvme".
  Device device() const { return execution_.device(); }
  /// Host bytes of the pool's buffers (0 without swapped pieces).
  std::uint64_t buffer_bytes() const;
  std::size_t buffer_count() const { return pool_.size(); }
  const SwapEngine* swap() const { return swap_.get(); }
  const ParameterStoreStats& stats() const { return stats_; }

  // ---- reading (gathering) ------------------------------------------------------------------
  /// Start reading piece `index` into a free buffer. False when no buffer is free (the caller
  /// stops looking ahead); true when the piece is in host memory, cached, or now on its way.
  /// `speculative` reads (pieces that may be needed later) leave one buffer free, so that a piece
  /// needed now never has to evict them.
  bool prefetch(std::size_t index, bool speculative = false);
  /// True when acquire(index) would not wait: the piece is in host memory or a buffer holds it.
  bool ready(std::size_t index);
  /// Piece `index`'s bytes, valid until release(index); waits for its read (or reads it now).
  const std::byte* acquire(std::size_t index);
  void release(std::size_t index);
  /// Piece `index` into `destination`, in the memory of the engine's device (a gather's staging,
  /// allocated in its compute stream's order): acquire, a copy, release. No host wait beyond
  /// acquire's for the read. A piece in a pool buffer, or kept in page-locked memory, goes on the
  /// engine's transfer stream (from_host_async: after the compute work queued so far) and true is
  /// returned: whatever reads `destination` next waits for engine.transfers_queued() (the gather's
  /// collective: Communicator::order_after); the piece's bytes stay as they are until the copy is
  /// done. Other pieces are copied on the compute stream (false).
  [[nodiscard]] bool copy_to_device(std::size_t index, void* destination);

  // ---- writing (optimizer step, checkpoint load) --------------------------------------------
  /// Where the new value of piece `index` goes (every element must be written before commit).
  std::byte* update_target(std::size_t index);
  /// The new value is complete: a swapped piece starts its write.
  void commit(std::size_t index);
  /// Wait for every write; throws zt::IoError naming the file and offset of a failed one.
  void finish_updates();
  /// Synchronous copies of a whole piece (checkpoints, tests).
  void write(std::size_t index, const void* source);
  void read(std::size_t index, void* destination);

 private:
  enum class BufferState : std::uint8_t { free, reading, ready, held, writing };
  struct PoolBuffer {
    Buffer memory;
    BufferState state = BufferState::free;
    std::size_t piece = 0;
    bool used = false;        // ready: its piece was acquired since it was read (evict first)
    std::uint64_t stamp = 0;  // when it last changed state (oldest first)
    SwapHandle io;
    Event copied;               // on the engine's compute stream, after the last copy_to_device
    bool copy_pending = false;  // ... which may still read the buffer
  };
  struct Piece {
    std::byte* host = nullptr;  // in memory (the context's device), or nullptr: on NVMe
    std::string swap_name;
    std::size_t bytes = 0;
  };

  PoolBuffer* buffer_of(std::size_t index);
  /// The buffer's I/O completed: reading -> ready, writing -> ready (used).
  void complete(PoolBuffer& buffer);
  /// A buffer for a new piece: free, else the oldest used cache, else the oldest write, else the
  /// oldest prefetched piece. Never a held one.
  PoolBuffer& take_buffer();
  /// Before new bytes go into `buffer` (a read, new values): its copy to the device is done.
  void wait_for_device_copy(PoolBuffer& buffer);
  /// Before new values go into a page-locked kept piece: the copies to the device from them are done.
  void wait_for_kept_copies();
  void set_state(PoolBuffer& buffer, BufferState state);
  void check_index(std::size_t index, const char* what) const;

  const std::vector<FlatParameter>& layout_;
  const ExecutionContext& execution_;  // where the pieces in memory are (the host's with NVMe)
  const ExecutionContext& engine_;     // the engine's: copy_to_device's destination and stream
  DType dtype_;
  std::vector<Piece> pieces_;
  Buffer host_;  // the pieces kept in host memory (offload_param), pinned when kept_pinned_
  bool kept_pinned_ = false;
  Event kept_copied_;               // on the engine's transfer stream, after the last kept piece's copy
  bool kept_copy_pending_ = false;  // ... which may still read host_
  std::unique_ptr<SwapEngine> swap_;
  std::vector<PoolBuffer> pool_;
  std::int64_t host_elements_ = 0;
  std::int64_t nvme_elements_ = 0;
  std::uint64_t clock_ = 0;
  ParameterStoreStats stats_;
};

}  // namespace zt::engine_detail
