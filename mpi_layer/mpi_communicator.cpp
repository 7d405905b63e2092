// The MPI backend of zt::Communicator.
//
// Blocking operations call the blocking MPI collective directly (no copies, no extra
// synchronization) so that they run at the speed of raw MPI; non-blocking ones start MPI_I* calls
// and hand back a Request that completes them. MPI counts are int: larger operations are split into
// chunks where the operation allows it (all_reduce, broadcast, send/recv) and otherwise run as a
// sequence of per-root reduces or broadcasts (reduce_scatter, all_gather, all_gather_v).
#include "zerotrain/mpi_communicator.hpp"

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "base/seconds_since.hpp"
#include "kernels/emulated_device.hpp"
#include "mpi_layer/device_buffers.hpp"
#include "mpi_layer/mpi_check.hpp"
#include "mpi_layer/mpi_communicator_testing.hpp"
#include "mpi_layer/mpi_datatypes.hpp"
#include "mpi_layer/watchdog.hpp"

namespace zt {
namespace {

using base::Clock;
using base::seconds_since;

bool mpi_finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

std::byte* at(void* pointer, std::size_t bytes) {
  return static_cast<std::byte*>(pointer) + bytes;
}
const std::byte* at(const void* pointer, std::size_t bytes) {
  return static_cast<const std::byte*>(pointer) + bytes;
}

/// Owns a duplicated MPI_Comm. MPI objects cannot be freed after MPI_Finalize, so a communicator
/// that outlives MPI (a static, say) leaves its handle to MPI's own teardown.
class OwnedMpiComm {
 public:
  explicit OwnedMpiComm(MPI_Comm comm) : comm_(comm) {}
  OwnedMpiComm(OwnedMpiComm&& other) noexcept : comm_(std::exchange(other.comm_, MPI_COMM_NULL)) {}
  OwnedMpiComm& operator=(OwnedMpiComm&&) = delete;
  OwnedMpiComm(const OwnedMpiComm&) = delete;
  OwnedMpiComm& operator=(const OwnedMpiComm&) = delete;
  ~OwnedMpiComm() {
    if (comm_ != MPI_COMM_NULL && !mpi_finalized()) MPI_Comm_free(&comm_);
  }
  MPI_Comm get() const { return comm_; }

 private:
  MPI_Comm comm_;
};

}  // namespace

// Errors raised by the backend itself use the same prefix as the argument checks.
#define ZT_MPI_COMM_CHECK(op, condition, ...)                                                         \
  ZT_CHECK_AS(::zt::CommError, condition, comm_op_name(op), " on communicator '", name(), "' (rank ", \
              rank(), " of ", size(), "): ", __VA_ARGS__)

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator(OwnedMpiComm comm, int rank, int size, int tag_upper_bound, std::string name,
                  detail::CommIdentity identity)
      : Communicator(rank, size, std::move(name), std::move(identity)),
        comm_(std::move(comm)),
        tag_upper_bound_(tag_upper_bound) {}

  CommBackend backend() const override { return CommBackend::mpi; }
  Device device() const override { return Device::host(); }
  MPI_Comm comm() const { return comm_.get(); }
  void set_max_chunk_elements(std::size_t elements) {
    max_chunk_ = std::clamp<std::size_t>(elements, 1, static_cast<std::size_t>(INT_MAX));
  }
  void set_ring(const detail::RingReduceScatterSettings& settings) {
    ring_ = settings;
    ring_.chunk_bytes = std::max<std::size_t>(ring_.chunk_bytes, 1);
    ring_.lanes = std::max(ring_.lanes, 1);
  }

 protected:
  void do_all_reduce(const void* send, void* recv, std::size_t count, DType type, ReduceOp op) override;
  void do_reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType type,
                         ReduceOp op) override;
  void do_all_gather(const void* send, void* recv, std::size_t send_count, DType type) override;
  void do_all_gather_v(const void* send, std::size_t send_count, void* recv,
                       std::span<const std::size_t> recv_counts, DType type) override;
  void do_broadcast(void* buffer, std::size_t count, DType type, int root) override;
  void do_send(const void* buffer, std::size_t count, DType type, int peer, int tag) override;
  void do_recv(void* buffer, std::size_t count, DType type, int peer, int tag) override;
  void do_barrier() override;

  Work do_iall_reduce(const void* send, void* recv, std::size_t count, DType type, ReduceOp op) override;
  Work do_ireduce_scatter(const void* send, void* recv, std::size_t recv_count, DType type,
                          ReduceOp op) override;
  Work do_iall_gather(const void* send, void* recv, std::size_t send_count, DType type) override;
  Work do_iall_gather_v(const void* send, std::size_t send_count, void* recv,
                        std::span<const std::size_t> recv_counts, DType type) override;
  Work do_ibroadcast(void* buffer, std::size_t count, DType type, int root) override;
  Work do_isend(const void* buffer, std::size_t count, DType type, int peer, int tag) override;
  Work do_irecv(void* buffer, std::size_t count, DType type, int peer, int tag) override;

 private:
  class Request;
  class RingReduceScatter;

  /// f(offset, n) for consecutive pieces of at most max_chunk_ elements; nothing for count 0
  /// (every rank of a collective passes the same count, so every rank skips alike).
  template <typename Function>
  void for_each_chunk(std::size_t count, Function&& function) const {
    for (std::size_t offset = 0; offset < count; offset += max_chunk_) {
      function(offset, static_cast<int>(std::min(max_chunk_, count - offset)));
    }
  }
  /// Like for_each_chunk, but at least one (possibly empty) message: a zero-length send still has
  /// to match its receive.
  template <typename Function>
  void for_each_message(std::size_t count, Function&& function) const {
    std::size_t offset = 0;
    do {
      const std::size_t length = std::min(max_chunk_, count - offset);
      function(offset, static_cast<int>(length));
      offset += length;
    } while (offset < count);
  }

  std::unique_ptr<Request> start_request(CommOp op, std::size_t payload_bytes);
  /// Whether reduce_scatter runs as zerotrain's ring rather than MPI's (large or beyond int counts).
  bool takes_ring(std::size_t recv_count, DType type) const;
  std::unique_ptr<RingReduceScatter> start_ring_reduce_scatter(const void* send, void* recv,
                                                               std::size_t recv_count, DType type,
                                                               ReduceOp op);
  std::unique_ptr<Request> start_gather_by_broadcasts(CommOp op, const void* send, std::size_t send_count,
                                                      void* recv, std::span<const std::size_t> recv_counts,
                                                      DType type);
  void check_tag_bound(CommOp op, int tag) const {
    ZT_MPI_COMM_CHECK(op, tag <= tag_upper_bound_, "tag ", tag,
                      " exceeds this MPI's MPI_TAG_UB; expected 0 <= tag <= ", tag_upper_bound_);
  }
  void check_received(const MPI_Status& status, int expected, MPI_Datatype datatype, int peer, int tag) const;

  OwnedMpiComm comm_;
  int tag_upper_bound_;
  std::size_t max_chunk_ = static_cast<std::size_t>(INT_MAX);
  detail::RingReduceScatterSettings ring_;
  std::optional<OwnedMpiComm> ring_comm_;  // the ring's messages, made by the first ring operation
  std::uint64_t ring_operations_ = 0;      // started, numbered alike on every rank (for their tags)
};

// ---- non-blocking operations ---------------------------------------------------------------

/// The MPI requests of one non-blocking operation, plus what must happen once they complete
/// (the division of an average, a copy out of scratch space, checking received counts) and the
/// memory MPI reads until then (count/displacement arrays, scratch buffers).
class MpiCommunicator::Request final : public Work::State {
 public:
  using Completion = std::function<void(Request&)>;

  Request(MpiCommunicator& comm, CommOp op, std::size_t payload_bytes)
      : comm_(comm), op_(op), payload_bytes_(payload_bytes), start_(Clock::now()) {}
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  /// Only reached with requests pending when starting or completing the operation threw: wait
  /// for what was started, so MPI never writes into buffers the caller believes are free.
  ~Request() override {
    if (finished_ || mpi_finalized()) return;
    for (MPI_Request& request : requests_) {
      if (request != MPI_REQUEST_NULL) MPI_Wait(&request, MPI_STATUS_IGNORE);
    }
  }

  /// A new slot for the next MPI_I* call to fill.
  MPI_Request* add() {
    requests_.push_back(MPI_REQUEST_NULL);
    statuses_.emplace_back();
    return &requests_.back();
  }
  void on_completion(Completion completion) { completion_ = std::move(completion); }
  std::vector<std::byte>& scratch() { return scratch_; }
  std::vector<int>& int_scratch() { return int_scratch_; }
  std::span<const MPI_Status> statuses() const { return statuses_; }

  // One MPI_Wait/MPI_Test per request rather than MPI_Waitall/MPI_Testall: Open MPI 4.1 with
  // MPI_THREAD_MULTIPLE hangs in MPI_Waitall when a request fails (e.g. MPI_ERR_TRUNCATE on a
  // self-message), and completing the requests one by one is otherwise equivalent. A request
  // completed here becomes MPI_REQUEST_NULL; its status is kept for the completion step.
  void wait() override {
    for (std::size_t i = 0; i < requests_.size(); ++i) {
      if (requests_[i] != MPI_REQUEST_NULL) check(MPI_Wait(&requests_[i], &statuses_[i]), "MPI_Wait");
    }
    complete();
  }

  bool test() override {
    bool all_done = true;
    for (std::size_t i = 0; i < requests_.size(); ++i) {
      if (requests_[i] == MPI_REQUEST_NULL) continue;
      int done = 0;
      check(MPI_Test(&requests_[i], &done, &statuses_[i]), "MPI_Test");
      all_done = all_done && done != 0;
    }
    if (!all_done) return false;
    complete();
    return true;
  }

 private:
  void check(int code, std::string_view call) const {
    if (code == MPI_SUCCESS) return;
    detail::raise_mpi_error(__FILE__, __LINE__,
                            std::string(call) + " completing " + std::string(comm_op_name(op_)), comm_.name(),
                            code);
  }

  void complete() {
    finished_ = true;
    if (completion_) completion_(*this);
    comm_.record(op_, payload_bytes_, seconds_since(start_));
  }

  MpiCommunicator& comm_;
  CommOp op_;
  std::size_t payload_bytes_;
  Clock::time_point start_;
  bool finished_ = false;
  std::vector<MPI_Request> requests_;
  std::vector<MPI_Status> statuses_;
  Completion completion_;
  std::vector<std::byte> scratch_;
  std::vector<int> int_scratch_;
};

std::unique_ptr<MpiCommunicator::Request> MpiCommunicator::start_request(CommOp op,
                                                                         std::size_t payload_bytes) {
  return std::make_unique<Request>(*this, op, payload_bytes);
}

void MpiCommunicator::check_received(const MPI_Status& status, int expected, MPI_Datatype datatype, int peer,
                                     int tag) const {
  int received = 0;
  ZT_CHECK_MPI(MPI_Get_count(&status, datatype, &received), name());
  ZT_MPI_COMM_CHECK(CommOp::recv, received == expected, "expected ", expected, " elements from peer ", peer,
                    " with tag ", tag, " but the message had ", received,
                    "; send and recv must pass the same count");
}

namespace {

/// MPI_IN_PLACE when the caller passed the documented in-place form.
const void* send_or_in_place(const void* send, const void* in_place_position) {
  return send == in_place_position ? MPI_IN_PLACE : send;
}

/// [counts..., displacements...] as MPI's int arrays; the caller checked that the total fits.
void int_counts_and_displacements(std::span<const std::size_t> counts, std::vector<int>& out) {
  out.resize(2 * counts.size());
  std::size_t offset = 0;
  for (std::size_t r = 0; r < counts.size(); ++r) {
    out[r] = static_cast<int>(counts[r]);
    out[counts.size() + r] = static_cast<int>(offset);
    offset += counts[r];
  }
}

std::size_t sum_of(std::span<const std::size_t> counts) {
  std::size_t total = 0;
  for (std::size_t count : counts) total += count;
  return total;
}

std::size_t offset_of_rank(std::span<const std::size_t> counts, int rank) {
  std::size_t offset = 0;
  for (int r = 0; r < rank; ++r) offset += counts[static_cast<std::size_t>(r)];
  return offset;
}

}  // namespace

// ---- all_reduce ------------------------------------------------------------------------------

void MpiCommunicator::do_all_reduce(const void* send, void* recv, std::size_t count, DType type,
                                    ReduceOp op) {
  const auto start = Clock::now();
  const MPI_Datatype datatype = detail::mpi_datatype(type);
  const MPI_Op reduction = detail::mpi_reduce_op(type, op);
  const std::size_t element = dtype_size(type);
  const bool in_place = send == recv;
  for_each_chunk(count, [&](std::size_t offset, int length) {
    ZT_CHECK_MPI(MPI_Allreduce(in_place ? MPI_IN_PLACE : at(send, offset * element),
                               at(recv, offset * element), length, datatype, reduction, comm()),
                 name());
  });
  if (op == ReduceOp::avg) detail::divide_for_average(recv, count, type, size());
  record(CommOp::all_reduce, count * element, seconds_since(start));
}

Work MpiCommunicator::do_iall_reduce(const void* send, void* recv, std::size_t count, DType type,
                                     ReduceOp op) {
  const MPI_Datatype datatype = detail::mpi_datatype(type);
  const MPI_Op reduction = detail::mpi_reduce_op(type, op);
  const std::size_t element = dtype_size(type);
  const bool in_place = send == recv;
  auto request = start_request(CommOp::all_reduce, count * element);
  for_each_chunk(count, [&](std::size_t offset, int length) {
    ZT_CHECK_MPI(
        MPI_Iallreduce(in_place ? MPI_IN_PLACE : at(send, offset * element), at(recv, offset * element),
                       length, datatype, reduction, comm(), request->add()),
        name());
  });
  if (op == ReduceOp::avg) {
    request->on_completion([recv, count, type, ranks = size()](Request&) {
      detail::divide_for_average(recv, count, type, ranks);
    });
  }
  return Work(std::move(request));
}

// ---- reduce_scatter --------------------------------------------------------------------------
// Small buffers go to MPI_(I)reduce_scatter_block. Large ones (and any whose total exceeds MPI's
// int counts) run as zerotrain's own ring over MPI_Isend/MPI_Irecv (RingReduceScatter below): Open
// MPI's libnbc and its tuned blocking algorithms allocate temporaries of one to two times the whole
// buffer for the collective's life, memory that no accounting above the communicator can see; the
// ring's scratch is a fixed few MiB whatever the buffer's size.

bool MpiCommunicator::takes_ring(std::size_t recv_count, DType type) const {
  const std::size_t total = recv_count * static_cast<std::size_t>(size());
  return total > max_chunk_ || total * dtype_size(type) >= ring_.min_bytes;
}

/// The ring reduce-scatter (bandwidth-optimal: each rank sends and receives (n-1)/n of the buffer).
/// Block b's partial result travels b+1 -> b+2 -> ... -> b: at step s (0 <= s < n-1) rank r sends
/// the partial of block r-1-s to rank r+1 and receives the partial of block r-2-s from rank r-1,
/// which it combines with its own part of that block (MPI_Reduce_local with the collective's MPI_Op,
/// so every dtype and op of MPI_Reduce_scatter_block works alike) and sends on at the next step; after
/// step n-2 the received partial is of block r, whose combination is the result. The order in which a
/// block's contributions combine is fixed (x_b op (x_{b-1} op (... op x_{b+1}))), so results are
/// deterministic; they can differ from MPI's own algorithms by summation order only.
///
/// The blocks are cut into columns of at most `chunk` elements (at most max_chunk_, MPI's int
/// counts), and `lanes` columns run at once, each through the n-1 steps on two scratch slots of one
/// chunk (one receives while the other, combined, is sent; one slot at 2 ranks): at most 2 x lanes x
/// chunk bytes of scratch (8 MiB with the defaults), not the buffer. The messages travel on a duplicate of
/// the communicator (no user message can match them) with a tag of their own per operation (operations in
/// flight at once do not mix). In place, the result of column c is written to the start of the buffer once
/// column c is done: by then this rank's own contribution there has been read, and no other column reads that
/// range.
class MpiCommunicator::RingReduceScatter final : public Work::State {
 public:
  /// Lane l's messages carry tag first_tag + l.
  RingReduceScatter(MpiCommunicator& comm, MPI_Comm ring_comm, int first_tag, const void* send, void* recv,
                    std::size_t recv_count, DType type, ReduceOp op)
      : comm_(comm),
        ring_comm_(ring_comm),
        send_(static_cast<const std::byte*>(send)),
        recv_(static_cast<std::byte*>(recv)),
        recv_count_(recv_count),
        type_(type),
        op_(op),
        datatype_(detail::mpi_datatype(type)),
        reduction_(detail::mpi_reduce_op(type, op)),
        element_(dtype_size(type)),
        ranks_(comm.size()),
        rank_(comm.rank()),
        chunk_(std::max<std::size_t>(1, std::min(comm.ring_.chunk_bytes / element_, comm.max_chunk_))),
        start_(Clock::now()) {
    if (ranks_ == 1 || recv_count_ == 0) {
      if (send_ != recv_ && recv_count_ > 0) std::memcpy(recv_, send_, recv_count_ * element_);
      columns_ = 0;
    } else {
      columns_ = (recv_count_ + chunk_ - 1) / chunk_;
    }
    const std::size_t lanes = std::min<std::size_t>(comm.ring_.lanes, columns_);
    lanes_.resize(lanes);
    // Two slots per lane; with two ranks the one step never sends from a slot, so one is enough.
    const std::size_t slots = ranks_ > 2 ? 2 : 1;
    const std::size_t slot_bytes = std::min(chunk_, recv_count_) * element_;
    scratch_ = std::make_unique_for_overwrite<std::byte[]>(slots * lanes * slot_bytes);
    for (std::size_t l = 0; l < lanes; ++l) {
      Lane& lane = lanes_[l];
      lane.tag = first_tag + static_cast<int>(l);
      lane.slots[0] = scratch_.get() + slots * l * slot_bytes;
      lane.slots[1] = lane.slots[0] + (slots - 1) * slot_bytes;
      lane.column = l;
      start_column(lane);
    }
  }
  RingReduceScatter(const RingReduceScatter&) = delete;
  RingReduceScatter& operator=(const RingReduceScatter&) = delete;
  /// Only reached unfinished when a step threw: wait for what was posted, so MPI never writes into
  /// scratch that is freed or reads buffers the caller believes are free.
  ~RingReduceScatter() override {
    if (finished_ || mpi_finalized()) return;
    for (Lane& lane : lanes_) {
      for (MPI_Request& request : lane.requests) {
        if (request != MPI_REQUEST_NULL) MPI_Wait(&request, MPI_STATUS_IGNORE);
      }
    }
  }

  bool test() override {
    if (!sweep()) return false;
    complete();
    return true;
  }

  /// Sweeps the lanes; when none moved, blocks in MPI_Wait on the oldest column's first pending
  /// request (MPI's own waiting, which also progresses every other message).
  void wait() override {
    while (!sweep()) {
      Lane* oldest = nullptr;
      for (Lane& lane : lanes_) {
        if (lane.active && (oldest == nullptr || lane.column < oldest->column)) oldest = &lane;
      }
      for (MPI_Request& request : oldest->requests) {
        if (request != MPI_REQUEST_NULL) {
          check(MPI_Wait(&request, MPI_STATUS_IGNORE), "MPI_Wait");
          break;
        }
      }
    }
    complete();
  }

 private:
  /// One column in flight: its step, the step's receive and send, and the lane's two scratch slots.
  /// Lane l runs columns l, l + lanes, l + 2 lanes, ... in order, on a tag of its own: every rank
  /// posts a lane's messages in the same order, which MPI's non-overtaking rule then matches.
  struct Lane {
    bool active = false;
    int tag = 0;
    std::size_t column = 0;  // the current one, or the first while not started
    std::size_t offset = 0;  // of the column in every block, elements
    int length = 0;
    int step = 0;
    std::array<MPI_Request, 2> requests = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    std::array<std::byte*, 2> slots = {nullptr, nullptr};
  };

  int block_at(int shift) const { return ((rank_ - shift) % ranks_ + ranks_) % ranks_; }
  const std::byte* own(int block, const Lane& lane) const {
    return send_ + (static_cast<std::size_t>(block) * recv_count_ + lane.offset) * element_;
  }

  void start_column(Lane& lane) {
    lane.active = lane.column < columns_;
    if (!lane.active) return;
    lane.offset = lane.column * chunk_;
    lane.length = static_cast<int>(std::min(chunk_, recv_count_ - lane.offset));
    post(lane, 0);
  }

  /// Step s: receive the partial of block r-2-s into slot s%2; send block r-1-s's (own data at step 0,
  /// else the slot received and combined at step s-1).
  void post(Lane& lane, int step) {
    lane.step = step;
    const int left = (rank_ + ranks_ - 1) % ranks_;
    const int right = (rank_ + 1) % ranks_;
    const void* outgoing = step == 0 ? own(block_at(1), lane) : lane.slots[(step - 1) % 2];
    check(MPI_Irecv(lane.slots[step % 2], lane.length, datatype_, left, lane.tag, ring_comm_,
                    &lane.requests[0]),
          "MPI_Irecv");
    check(MPI_Isend(outgoing, lane.length, datatype_, right, lane.tag, ring_comm_, &lane.requests[1]),
          "MPI_Isend");
  }

  /// Tests the lane's requests; when both are done combines and posts the next step (or finishes the
  /// column and starts the next one). Returns whether the lane moved.
  bool advance(Lane& lane) {
    for (MPI_Request& request : lane.requests) {
      if (request == MPI_REQUEST_NULL) continue;
      int done = 0;
      check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done == 0) return false;
    }
    std::byte* received = lane.slots[lane.step % 2];
    const int block = block_at(2 + lane.step);
    check(MPI_Reduce_local(own(block, lane), received, lane.length, datatype_, reduction_),
          "MPI_Reduce_local");
    if (lane.step + 1 < ranks_ - 1) {
      post(lane, lane.step + 1);
      return true;
    }
    std::byte* result = recv_ + lane.offset * element_;
    const auto length = static_cast<std::size_t>(lane.length);
    std::memcpy(result, received, length * element_);
    if (op_ == ReduceOp::avg) detail::divide_for_average(result, length, type_, ranks_);
    ++columns_done_;
    lane.column += lanes_.size();
    start_column(lane);
    return true;
  }

  /// Moves every lane as far as its messages allow; true when every column is done.
  bool sweep() {
    for (Lane& lane : lanes_) {
      while (lane.active && advance(lane)) {
      }
    }
    return columns_done_ == columns_;
  }

  void complete() {
    finished_ = true;
    comm_.record(CommOp::reduce_scatter, recv_count_ * static_cast<std::size_t>(ranks_) * element_,
                 seconds_since(start_));
  }

  void check(int code, std::string_view call) const {
    if (code == MPI_SUCCESS) return;
    detail::raise_mpi_error(__FILE__, __LINE__, std::string(call) + " in the ring reduce_scatter",
                            comm_.name(), code);
  }

  MpiCommunicator& comm_;
  MPI_Comm ring_comm_;
  const std::byte* send_;
  std::byte* recv_;
  std::size_t recv_count_;
  DType type_;
  ReduceOp op_;
  MPI_Datatype datatype_;
  MPI_Op reduction_;
  std::size_t element_;
  int ranks_;
  int rank_;
  std::size_t chunk_;  // elements per column
  std::size_t columns_ = 0;
  std::size_t columns_done_ = 0;
  std::vector<Lane> lanes_;
  std::unique_ptr<std::byte[]> scratch_;
  Clock::time_point start_;
  bool finished_ = false;
};

std::unique_ptr<MpiCommunicator::RingReduceScatter> MpiCommunicator::start_ring_reduce_scatter(
    const void* send, void* recv, std::size_t recv_count, DType type, ReduceOp op) {
  if (!ring_comm_) {
    // Collective over the communicator, reached by every rank at the same call: the first ring
    // reduce_scatter (every rank takes the ring for the same counts).
    MPI_Comm duplicate = MPI_COMM_NULL;
    ZT_CHECK_MPI(MPI_Comm_dup(comm(), &duplicate), name());
    ring_comm_.emplace(duplicate);
    ZT_CHECK_MPI(MPI_Comm_set_errhandler(duplicate, MPI_ERRORS_RETURN), name());
  }
  // Tags [first, first + lanes) for this operation; they repeat only after MPI_TAG_UB / lanes
  // operations, far more than are ever in flight at once.
  const auto operations_per_cycle = static_cast<std::uint64_t>(tag_upper_bound_ / ring_.lanes);
  const int first_tag = static_cast<int>(ring_operations_++ % operations_per_cycle) * ring_.lanes;
  return std::make_unique<RingReduceScatter>(*this, ring_comm_->get(), first_tag, send, recv, recv_count,
                                             type, op);
}

void MpiCommunicator::do_reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType type,
                                        ReduceOp op) {
  if (takes_ring(recv_count, type)) {
    start_ring_reduce_scatter(send, recv, recv_count, type, op)->wait();
    return;
  }
  const auto start = Clock::now();
  const std::size_t total = recv_count * static_cast<std::size_t>(size());
  ZT_CHECK_MPI(MPI_Reduce_scatter_block(send_or_in_place(send, recv), recv, static_cast<int>(recv_count),
                                        detail::mpi_datatype(type), detail::mpi_reduce_op(type, op), comm()),
               name());
  if (op == ReduceOp::avg) detail::divide_for_average(recv, recv_count, type, size());
  record(CommOp::reduce_scatter, total * dtype_size(type), seconds_since(start));
}

Work MpiCommunicator::do_ireduce_scatter(const void* send, void* recv, std::size_t recv_count, DType type,
                                         ReduceOp op) {
  if (takes_ring(recv_count, type)) return Work(start_ring_reduce_scatter(send, recv, recv_count, type, op));
  const std::size_t total = recv_count * static_cast<std::size_t>(size());
  auto request = start_request(CommOp::reduce_scatter, total * dtype_size(type));
  ZT_CHECK_MPI(MPI_Ireduce_scatter_block(send_or_in_place(send, recv), recv, static_cast<int>(recv_count),
                                         detail::mpi_datatype(type), detail::mpi_reduce_op(type, op), comm(),
                                         request->add()),
               name());
  if (op == ReduceOp::avg) {
    request->on_completion([recv, recv_count, type, ranks = size()](Request&) {
      detail::divide_for_average(recv, recv_count, type, ranks);
    });
  }
  return Work(std::move(request));
}

// ---- all_gather and all_gather_v -------------------------------------------------------------

void MpiCommunicator::do_all_gather(const void* send, void* recv, std::size_t send_count, DType type) {
  const std::size_t total = send_count * static_cast<std::size_t>(size());
  const std::size_t element = dtype_size(type);
  if (total > max_chunk_) {
    const std::vector<std::size_t> counts(static_cast<std::size_t>(size()), send_count);
    start_gather_by_broadcasts(CommOp::all_gather, send, send_count, recv, counts, type)->wait();
    return;
  }
  const auto start = Clock::now();
  const MPI_Datatype datatype = detail::mpi_datatype(type);
  const int count = static_cast<int>(send_count);
  ZT_CHECK_MPI(
      MPI_Allgather(send_or_in_place(send, at(recv, static_cast<std::size_t>(rank()) * send_count * element)),
                    count, datatype, recv, count, datatype, comm()),
      name());
  record(CommOp::all_gather, total * element, seconds_since(start));
}

Work MpiCommunicator::do_iall_gather(const void* send, void* recv, std::size_t send_count, DType type) {
  const std::size_t total = send_count * static_cast<std::size_t>(size());
  const std::size_t element = dtype_size(type);
  if (total > max_chunk_) {
    const std::vector<std::size_t> counts(static_cast<std::size_t>(size()), send_count);
    return Work(start_gather_by_broadcasts(CommOp::all_gather, send, send_count, recv, counts, type));
  }
  auto request = start_request(CommOp::all_gather, total * element);
  const MPI_Datatype datatype = detail::mpi_datatype(type);
  const int count = static_cast<int>(send_count);
  ZT_CHECK_MPI(MPI_Iallgather(
                   send_or_in_place(send, at(recv, static_cast<std::size_t>(rank()) * send_count * element)),
                   count, datatype, recv, count, datatype, comm(), request->add()),
               name());
  return Work(std::move(request));
}

void MpiCommunicator::do_all_gather_v(const void* send, std::size_t send_count, void* recv,
                                      std::span<const std::size_t> recv_counts, DType type) {
  const std::size_t total = sum_of(recv_counts);
  if (total > max_chunk_) {  // some count or displacement would not fit MPI's int
    start_gather_by_broadcasts(CommOp::all_gather_v, send, send_count, recv, recv_counts, type)->wait();
    return;
  }
  const auto start = Clock::now();
  const std::size_t element = dtype_size(type);
  const MPI_Datatype datatype = detail::mpi_datatype(type);
  std::vector<int> layout;
  int_counts_and_displacements(recv_counts, layout);
  const void* in_place_position = at(recv, offset_of_rank(recv_counts, rank()) * element);
  ZT_CHECK_MPI(MPI_Allgatherv(send_or_in_place(send, in_place_position), static_cast<int>(send_count),
                              datatype, recv, layout.data(), layout.data() + size(), datatype, comm()),
               name());
  record(CommOp::all_gather_v, total * element, seconds_since(start));
}

Work MpiCommunicator::do_iall_gather_v(const void* send, std::size_t send_count, void* recv,
                                       std::span<const std::size_t> recv_counts, DType type) {
  const std::size_t total = sum_of(recv_counts);
  if (total > max_chunk_) {
    return Work(start_gather_by_broadcasts(CommOp::all_gather_v, send, send_count, recv, recv_counts, type));
  }
  const std::size_t element = dtype_size(type);
  const MPI_Datatype datatype = detail::mpi_datatype(type);
  auto request = start_request(CommOp::all_gather_v, total * element);
  std::vector<int>& layout = request->int_scratch();  // MPI reads it until completion
  int_counts_and_displacements(recv_counts, layout);
  const void* in_place_position = at(recv, offset_of_rank(recv_counts, rank()) * element);
  ZT_CHECK_MPI(
      MPI_Iallgatherv(send_or_in_place(send, in_place_position), static_cast<int>(send_count), datatype, recv,
                      layout.data(), layout.data() + size(), datatype, comm(), request->add()),
      name());
  return Work(std::move(request));
}

/// all_gather(_v) beyond MPI's int counts and displacements: each rank broadcasts its block,
/// in chunks, straight into its place in recv.
std::unique_ptr<MpiCommunicator::Request> MpiCommunicator::start_gather_by_broadcasts(
    CommOp op, const void* send, std::size_t send_count, void* recv, std::span<const std::size_t> recv_counts,
    DType type) {
  const std::size_t element = dtype_size(type);
  const MPI_Datatype datatype = detail::mpi_datatype(type);
  auto request = start_request(op, sum_of(recv_counts) * element);
  std::size_t offset = 0;
  for (int root = 0; root < size(); ++root) {
    std::byte* block = at(recv, offset * element);
    if (root == rank() && send != block && send_count > 0) std::memcpy(block, send, send_count * element);
    const std::size_t count = recv_counts[static_cast<std::size_t>(root)];
    for_each_chunk(count, [&](std::size_t chunk_offset, int length) {
      ZT_CHECK_MPI(
          MPI_Ibcast(at(block, chunk_offset * element), length, datatype, root, comm(), request->add()),
          name());
    });
    offset += count;
  }
  return request;
}

// ---- broadcast -------------------------------------------------------------------------------

void MpiCommunicator::do_broadcast(void* buffer, std::size_t count, DType type, int root) {
  const auto start = Clock::now();
  const MPI_Datatype datatype = detail::mpi_datatype(type);
  const std::size_t element = dtype_size(type);
  for_each_chunk(count, [&](std::size_t offset, int length) {
    ZT_CHECK_MPI(MPI_Bcast(at(buffer, offset * element), length, datatype, root, comm()), name());
  });
  record(CommOp::broadcast, count * element, seconds_since(start));
}

Work MpiCommunicator::do_ibroadcast(void* buffer, std::size_t count, DType type, int root) {
  const MPI_Datatype datatype = detail::mpi_datatype(type);
  const std::size_t element = dtype_size(type);
  auto request = start_request(CommOp::broadcast, count * element);
  for_each_chunk(count, [&](std::size_t offset, int length) {
    ZT_CHECK_MPI(MPI_Ibcast(at(buffer, offset * element), length, datatype, root, comm(), request->add()),
                 name());
  });
  return Work(std::move(request));
}

// ---- send and recv ---------------------------------------------------------------------------
// Messages above the chunk size travel as several messages with the same tag; MPI keeps their
// order (non-overtaking), and both sides must pass the same count. A receive checks that the
// message had exactly the count it asked for.

void MpiCommunicator::do_send(const void* buffer, std::size_t count, DType type, int peer, int tag) {
  check_tag_bound(CommOp::send, tag);
  const auto start = Clock::now();
  const MPI_Datatype datatype = detail::mpi_datatype(type);
  const std::size_t element = dtype_size(type);
  for_each_message(count, [&](std::size_t offset, int length) {
    ZT_CHECK_MPI(MPI_Send(at(buffer, offset * element), length, datatype, peer, tag, comm()), name());
  });
  record(CommOp::send, count * element, seconds_since(start));
}

void MpiCommunicator::do_recv(void* buffer, std::size_t count, DType type, int peer, int tag) {
  check_tag_bound(CommOp::recv, tag);
  const auto start = Clock::now();
  const MPI_Datatype datatype = detail::mpi_datatype(type);
  const std::size_t element = dtype_size(type);
  for_each_message(count, [&](std::size_t offset, int length) {
    MPI_Status status;
    ZT_CHECK_MPI(MPI_Recv(at(buffer, offset * element), length, datatype, peer, tag, comm(), &status),
                 name());
    check_received(status, length, datatype, peer, tag);
  });
  record(CommOp::recv, count * element, seconds_since(start));
}

Work MpiCommunicator::do_isend(const void* buffer, std::size_t count, DType type, int peer, int tag) {
  check_tag_bound(CommOp::send, tag);
  const MPI_Datatype datatype = detail::mpi_datatype(type);
  const std::size_t element = dtype_size(type);
  auto request = start_request(CommOp::send, count * element);
  for_each_message(count, [&](std::size_t offset, int length) {
    ZT_CHECK_MPI(MPI_Isend(at(buffer, offset * element), length, datatype, peer, tag, comm(), request->add()),
                 name());
  });
  return Work(std::move(request));
}

Work MpiCommunicator::do_irecv(void* buffer, std::size_t count, DType type, int peer, int tag) {
  check_tag_bound(CommOp::recv, tag);
  const MPI_Datatype datatype = detail::mpi_datatype(type);
  const std::size_t element = dtype_size(type);
  auto request = start_request(CommOp::recv, count * element);
  std::vector<int>& expected = request->int_scratch();
  for_each_message(count, [&](std::size_t offset, int length) {
    expected.push_back(length);
    ZT_CHECK_MPI(MPI_Irecv(at(buffer, offset * element), length, datatype, peer, tag, comm(), request->add()),
                 name());
  });
  request->on_completion([this, datatype, peer, tag](Request& self) {
    for (std::size_t i = 0; i < self.statuses().size(); ++i) {
      check_received(self.statuses()[i], self.int_scratch()[i], datatype, peer, tag);
    }
  });
  return Work(std::move(request));
}

void MpiCommunicator::do_barrier() {
  const auto start = Clock::now();
  ZT_CHECK_MPI(MPI_Barrier(comm()), name());
  record(CommOp::barrier, 0, seconds_since(start));
}

// ---- the emulated device's communicator ---------------------------------------------------
// The MPI backend on buffers in emulated device memory: every operation runs inside the device
// API's access (kernels/emulated_device.hpp). Point-to-point follows the device backend's rules
// (include/zerotrain/nccl_communicator.hpp): operations complete in posting order, so a rank that
// receives first waits for its peer's send, and the rank itself is no peer. Ordered with a stream,
// each operation first runs the work queued on it (kernels/emulated_device.hpp), as NCCL's stream
// waits for it: the collective reads what that stream's kernels wrote, and nothing that another
// stream queued without an event recorded before it.
//
// A non-blocking operation's result lands as NCCL's does, on a stream of its own: MPI moves the
// data at the call (the inputs read then, after this communicator's earlier operations landed, as
// NCCL runs them in order), into a copy of the output in host memory, and the copy into the output
// itself is queued on the communicator's result stream, which runs it only when something waits
// for it. Work::wait() orders the ordering stream after it (NCCL's cudaStreamWaitEvent), or waits
// on the host where the communicator is ordered with no stream; Work::test() is done only once it
// landed (the eager order lands it at the test). So under the lazy stream order a kernel that
// reads a collective's output without its Work waited for reads it unwritten, every time, where
// on GPUs it would read it half written now and then. Until it lands the operation is in flight:
// the landing first checks that its input and output (a send's message) hold what they held at
// the call, and fails with a CommError naming the operation and the buffer where something wrote
// into them, a race with NCCL's kernel on a GPU. The blocking operations complete at the call.

class EmulatedDeviceCommunicator final : public MpiCommunicator {
 public:
  EmulatedDeviceCommunicator(OwnedMpiComm comm, int rank, int size, int tag_upper_bound, std::string name,
                             detail::CommIdentity identity, Device device, const Stream* ordered_with)
      : MpiCommunicator(std::move(comm), rank, size, tag_upper_bound, std::move(name), std::move(identity)),
        device_(device),
        ordered_with_(ordered_with) {}

  Device device() const override { return device_; }

 protected:
  void do_all_reduce(const void* send, void* recv, std::size_t count, DType type, ReduceOp op) override {
    check_on_device(CommOp::all_reduce, {send, recv}, count);
    const detail::EmulatedDeviceAccess access;
    MpiCommunicator::do_all_reduce(send, recv, count, type, op);
  }
  void do_reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType type,
                         ReduceOp op) override {
    check_on_device(CommOp::reduce_scatter, {send, recv}, recv_count);
    const detail::EmulatedDeviceAccess access;
    MpiCommunicator::do_reduce_scatter(send, recv, recv_count, type, op);
  }
  void do_all_gather(const void* send, void* recv, std::size_t send_count, DType type) override {
    check_on_device(CommOp::all_gather, {send, recv}, send_count);
    const detail::EmulatedDeviceAccess access;
    MpiCommunicator::do_all_gather(send, recv, send_count, type);
  }
  void do_all_gather_v(const void* send, std::size_t send_count, void* recv,
                       std::span<const std::size_t> recv_counts, DType type) override {
    check_on_device(CommOp::all_gather_v, {send}, send_count);
    check_on_device(CommOp::all_gather_v, {recv}, total_of(recv_counts));
    const detail::EmulatedDeviceAccess access;
    MpiCommunicator::do_all_gather_v(send, send_count, recv, recv_counts, type);
  }
  void do_broadcast(void* buffer, std::size_t count, DType type, int root) override {
    check_on_device(CommOp::broadcast, {buffer}, count);
    const detail::EmulatedDeviceAccess access;
    MpiCommunicator::do_broadcast(buffer, count, type, root);
  }
  void do_send(const void* buffer, std::size_t count, DType type, int peer, int tag) override {
    check_not_self(CommOp::send, peer);
    check_on_device(CommOp::send, {buffer}, count);
    const detail::EmulatedDeviceAccess access;
    MpiCommunicator::do_send(buffer, count, type, peer, tag);
  }
  void do_recv(void* buffer, std::size_t count, DType type, int peer, int tag) override {
    check_not_self(CommOp::recv, peer);
    check_on_device(CommOp::recv, {buffer}, count);
    const detail::EmulatedDeviceAccess access;
    MpiCommunicator::do_recv(buffer, count, type, peer, tag);
  }

  void do_barrier() override {
    if (ordered_with_ != nullptr) ordered_with_->synchronize();
    MpiCommunicator::do_barrier();
  }

  Work do_iall_reduce(const void* send, void* recv, std::size_t count, DType type, ReduceOp op) override {
    check_on_device(CommOp::all_reduce, {send, recv}, count);
    const std::size_t bytes = count * dtype_size(type);
    return landing_later(CommOp::all_reduce, {recv, bytes}, {send, bytes}, [&](void* result) {
      return MpiCommunicator::do_iall_reduce(send, result, count, type, op);
    });
  }
  Work do_ireduce_scatter(const void* send, void* recv, std::size_t recv_count, DType type,
                          ReduceOp op) override {
    check_on_device(CommOp::reduce_scatter, {send, recv}, recv_count);
    const std::size_t bytes = recv_count * dtype_size(type);
    return landing_later(CommOp::reduce_scatter, {recv, bytes},
                         {send, bytes * static_cast<std::size_t>(size())}, [&](void* result) {
                           return MpiCommunicator::do_ireduce_scatter(send, result, recv_count, type, op);
                         });
  }
  Work do_iall_gather(const void* send, void* recv, std::size_t send_count, DType type) override {
    check_on_device(CommOp::all_gather, {send, recv}, send_count);
    const std::size_t bytes = send_count * dtype_size(type);
    return landing_later(
        CommOp::all_gather, {recv, bytes * static_cast<std::size_t>(size())}, {send, bytes},
        [&](void* result) { return MpiCommunicator::do_iall_gather(send, result, send_count, type); });
  }
  Work do_iall_gather_v(const void* send, std::size_t send_count, void* recv,
                        std::span<const std::size_t> recv_counts, DType type) override {
    check_on_device(CommOp::all_gather_v, {send}, send_count);
    check_on_device(CommOp::all_gather_v, {recv}, total_of(recv_counts));
    const std::size_t element = dtype_size(type);
    return landing_later(CommOp::all_gather_v, {recv, total_of(recv_counts) * element},
                         {send, send_count * element}, [&](void* result) {
                           return MpiCommunicator::do_iall_gather_v(send, send_count, result, recv_counts,
                                                                    type);
                         });
  }
  Work do_ibroadcast(void* buffer, std::size_t count, DType type, int root) override {
    check_on_device(CommOp::broadcast, {buffer}, count);
    const std::size_t bytes = count * dtype_size(type);
    return landing_later(CommOp::broadcast, {buffer, bytes}, {}, [&](void* result) {
      std::memcpy(result, buffer, bytes);  // the root's data, sent from the copy
      return MpiCommunicator::do_ibroadcast(result, count, type, root);
    });
  }
  Work do_isend(const void* buffer, std::size_t count, DType type, int peer, int tag) override {
    check_not_self(CommOp::send, peer);
    check_on_device(CommOp::send, {buffer}, count);
    return landing_later(CommOp::send, {}, {buffer, count * dtype_size(type)},
                         [&](void*) { return MpiCommunicator::do_isend(buffer, count, type, peer, tag); });
  }
  Work do_irecv(void* buffer, std::size_t count, DType type, int peer, int tag) override {
    check_not_self(CommOp::recv, peer);
    check_on_device(CommOp::recv, {buffer}, count);
    return landing_later(CommOp::recv, {buffer, count * dtype_size(type)}, {}, [&](void* result) {
      return MpiCommunicator::do_irecv(result, count, type, peer, tag);
    });
  }
  /// Both started before either is waited for: the one operation a device backend offers whose
  /// send does not wait alone for its receive (NCCL's group).
  std::pair<Work, Work> do_isend_irecv(const OutgoingMessage& send, const IncomingMessage& recv) override {
    check_not_self(CommOp::send, send.peer);
    check_not_self(CommOp::recv, recv.peer);
    check_on_device(CommOp::send, {send.buffer}, send.count);
    check_on_device(CommOp::recv, {recv.buffer}, recv.count);
    // The MPI backend's own operations, both started before either is waited for.
    Work received = landing_later(
        CommOp::recv, {recv.buffer, recv.count * dtype_size(recv.type)},
        {send.buffer, send.count * dtype_size(send.type)}, [&](void* result) {
          Work sent = MpiCommunicator::do_isend(send.buffer, send.count, send.type, send.peer, send.tag);
          Work into_result = MpiCommunicator::do_irecv(result, recv.count, recv.type, recv.peer, recv.tag);
          sent.wait();
          return into_result;
        });
    return {Work(), std::move(received)};
  }

 private:
  /// Start the MPI operation and complete it (its post-processing included) inside one access: MPI
  /// may touch the buffers until the operation completes, and only then may they be protected again.
  template <typename Start>
  static Work completed(Start&& start) {
    const detail::EmulatedDeviceAccess access;
    Work work = start();
    work.wait();
    return Work();
  }

  /// Bytes of emulated device memory an operation writes or reads.
  struct Region {
    const void* address = nullptr;
    std::size_t bytes = 0;
  };

  /// The operation's result lands in `output` on the result stream (see the top): `start(result)`
  /// is the MPI operation with `result`, host memory of output.bytes, as its output; it is completed
  /// here, and the landing queued. Until then the operation is in flight, as NCCL's kernel would be:
  /// the landing first checks that nothing wrote into `output` or `input` since the call (on a GPU
  /// that write races with the kernel that reads and writes them), and fails naming the buffer.
  template <typename Start>
  Work landing_later(CommOp op, Region output, Region input, Start&& start) {
    auto result = std::make_shared<std::vector<std::byte>>(output.bytes);
    // What the buffers held at the call (the input once, where it lies inside the output).
    const auto* output_begin = static_cast<const std::byte*>(output.address);
    const auto* input_begin = static_cast<const std::byte*>(input.address);
    const bool input_inside_output = output.bytes > 0 && input_begin >= output_begin &&
                                     input_begin + input.bytes <= output_begin + output.bytes;
    if (input_inside_output) input = {};
    auto at_call = std::make_shared<std::vector<std::byte>>(output.bytes + input.bytes);
    completed([&] {
      if (output.bytes > 0) std::memcpy(at_call->data(), output.address, output.bytes);
      if (input.bytes > 0) std::memcpy(at_call->data() + output.bytes, input.address, input.bytes);
      return start(output.bytes == 0 ? const_cast<void*>(output.address)
                                     : static_cast<void*>(result->data()));
    });
    if (output.bytes == 0 && input.bytes == 0) return Work();  // nothing in flight
    std::string operation = std::string(comm_op_name(op)) + " on communicator '" + name() + "' (rank " +
                            std::to_string(rank()) + " of " + std::to_string(size()) + ")";
    detail::emulated_enqueue(detail::emulated_queue_of(results_), [output, input, result, at_call,
                                                                   operation = std::move(operation)] {
      const detail::EmulatedDeviceAccess access;
      const auto written_since = [&](const Region& region, std::size_t offset) {
        return region.bytes > 0 && std::memcmp(region.address, at_call->data() + offset, region.bytes) != 0;
      };
      const char* written = written_since(output, 0)             ? "output"
                            : written_since(input, output.bytes) ? "input"
                                                                 : nullptr;
      ZT_CHECK_AS(CommError, written == nullptr, operation, ": its ", written,
                  " buffer was written while the operation was in flight (after the call, before the work "
                  "that its Work::wait() orders); on a GPU that write races with NCCL's kernel: wait for the "
                  "operation before writing the buffer");
      if (output.bytes > 0) std::memcpy(const_cast<void*>(output.address), result->data(), result->size());
    });
    Event landed(device_);
    landed.record(results_);
    return Work(std::make_unique<ResultLanding>(std::move(landed), ordered_with_));
  }

  /// A non-blocking operation whose result lands on the result stream: waited for by the ordering
  /// stream (no host wait), or by the host where there is none.
  class ResultLanding final : public Work::State {
   public:
    ResultLanding(Event landed, const Stream* ordered_with)
        : landed_(std::move(landed)), ordered_with_(ordered_with) {}
    void wait() override {
      if (ordered_with_ != nullptr) {
        ordered_with_->wait(landed_);
      } else {
        landed_.synchronize();
      }
    }
    /// Under the lazy order nothing progresses on its own: an operation is done only once something
    /// waited for its landing. Under the eager one it lands now.
    bool test() override {
      if (landed_.ready()) return true;
      if (detail::emulated_stream_order() == detail::EmulatedStreamOrder::lazy) return false;
      landed_.synchronize();
      return true;
    }

   private:
    Event landed_;
    const Stream* ordered_with_;
  };

  void check_not_self(CommOp op, int peer) const {
    ZT_MPI_COMM_CHECK(op, peer != rank(), "peer ", peer, " is this rank; a device communicator (",
                      device_.str(),
                      ") cannot send to or receive from its own rank (copy the buffer instead)");
  }

  /// Every operation's first step: its buffers on the device, then the ordering stream's work.
  /// And the operations before it on this communicator land first, as NCCL runs one communicator's
  /// operations one after the other on its stream.
  void check_on_device(CommOp op, std::initializer_list<const void*> buffers, std::size_t count) const {
    detail::check_device_buffers(*this, op, buffers, count);
    if (ordered_with_ != nullptr) ordered_with_->synchronize();
    results_.synchronize();
  }

  static std::size_t total_of(std::span<const std::size_t> counts) {
    std::size_t total = 0;
    for (std::size_t count : counts) total += count;
    return total;
  }

  Device device_;
  const Stream* ordered_with_;  // the stream whose work each operation follows, or none
  Stream results_{device_};     // where non-blocking operations' results land (see the top)
};

// ---- construction ----------------------------------------------------------------------------

namespace {

/// A duplicate of `comm` set up for a zt communicator, and what the communicator needs to know.
struct DuplicatedComm {
  OwnedMpiComm comm;
  int rank = 0;
  int size = 0;
  int tag_upper_bound = 0;
  detail::CommIdentity identity;
};

DuplicatedComm duplicate_for_zerotrain(MPI_Comm comm, const std::string& name, const char* maker) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  ZT_CHECK_AS(CommError, initialized != 0 && !mpi_finalized(), maker, "('", name,
              "'): MPI is not initialized (or already finalized); create a zt::Runtime first");
  ZT_CHECK_AS(CommError, comm != MPI_COMM_NULL, maker, "('", name,
              "'): the MPI communicator is MPI_COMM_NULL; expected a valid communicator");
  MPI_Comm duplicate = MPI_COMM_NULL;
  ZT_CHECK_MPI(MPI_Comm_dup(comm, &duplicate), name);
  DuplicatedComm result{OwnedMpiComm(duplicate), 0, 0, 0, {}};
  ZT_CHECK_MPI(MPI_Comm_set_errhandler(duplicate, MPI_ERRORS_RETURN), name);
  // The name shows up in MPI's own error reports and in tools (truncated to what MPI allows).
  const std::string mpi_name = name.substr(0, MPI_MAX_OBJECT_NAME - 1);
  ZT_CHECK_MPI(MPI_Comm_set_name(duplicate, mpi_name.c_str()), name);
  ZT_CHECK_MPI(MPI_Comm_rank(duplicate, &result.rank), name);
  ZT_CHECK_MPI(MPI_Comm_size(duplicate, &result.size), name);
  int* tag_upper_bound = nullptr;
  int found = 0;
  ZT_CHECK_MPI(MPI_Comm_get_attr(duplicate, MPI_TAG_UB, &tag_upper_bound, &found), name);
  result.tag_upper_bound =
      (found != 0 && tag_upper_bound != nullptr) ? *tag_upper_bound : 32767;  // MPI's minimum
  result.identity = detail::agree_comm_identity(duplicate, name);
  return result;
}

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, std::string name) {
  DuplicatedComm made = duplicate_for_zerotrain(comm, name, "make_mpi_communicator");
  return std::make_unique<MpiCommunicator>(std::move(made.comm), made.rank, made.size, made.tag_upper_bound,
                                           std::move(name), std::move(made.identity));
}

std::unique_ptr<Communicator> make_emulated_device_communicator(MPI_Comm comm, std::string name,
                                                                Device device, const Stream* ordered_with) {
  ZT_CHECK_AS(CommError, device.is_emulated(), "make_emulated_device_communicator('", name, "'): device ",
              device.str(), "; expected an emulated device (Device::emulated())");
  ZT_CHECK_AS(CommError, ordered_with == nullptr || ordered_with->device() == device,
              "make_emulated_device_communicator('", name, "'): ordered with a ",
              ordered_with->device().str(), " stream; expected a stream of ", device.str());
  DuplicatedComm made = duplicate_for_zerotrain(comm, name, "make_emulated_device_communicator");
  return std::make_unique<EmulatedDeviceCommunicator>(std::move(made.comm), made.rank, made.size,
                                                      made.tag_upper_bound, std::move(name),
                                                      std::move(made.identity), device, ordered_with);
}

MPI_Comm native_mpi_comm(const Communicator& communicator) {
  const auto* mpi = dynamic_cast<const MpiCommunicator*>(&communicator);
  ZT_CHECK_AS(CommError, mpi != nullptr, "native_mpi_comm: communicator '", communicator.name(),
              "' uses the ", comm_backend_name(communicator.backend()),
              " backend; expected an MPI communicator");
  return mpi->comm();
}

void detail::set_mpi_max_chunk_elements(Communicator& communicator, std::size_t elements) {
  auto* mpi = dynamic_cast<MpiCommunicator*>(&communicator);
  ZT_CHECK_AS(CommError, mpi != nullptr, "set_mpi_max_chunk_elements: communicator '", communicator.name(),
              "' is not an MPI communicator");
  mpi->set_max_chunk_elements(elements);
}

void detail::set_mpi_ring_reduce_scatter(Communicator& communicator,
                                         const RingReduceScatterSettings& settings) {
  auto* mpi = dynamic_cast<MpiCommunicator*>(&communicator);
  ZT_CHECK_AS(CommError, mpi != nullptr, "set_mpi_ring_reduce_scatter: communicator '", communicator.name(),
              "' is not an MPI communicator");
  mpi->set_ring(settings);
}

}  // namespace zt
