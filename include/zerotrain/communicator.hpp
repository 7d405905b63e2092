// One communicator interface, two backends: MPI for host buffers, NCCL for device buffers.
//
// Every operation exists blocking and non-blocking (the i-prefixed form returns a Work handle).
// Counts are in elements of `type`. Buffers may alias (in place) where the comment says so.
// Each operation is counted in traffic(): calls, payload bytes, estimated bytes on the wire, seconds.
// Each operation is also registered as in flight until it completes, with a per-communicator
// sequence number, so that the runtime's watchdog can name a collective that hangs
// (docs/fault-detection.md).
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zerotrain/device.hpp"
#include "zerotrain/dtype.hpp"

namespace zt {

enum class ReduceOp { sum, avg, max };
std::string_view reduce_op_name(ReduceOp op);

/// mpi: MPI (host buffers; the emulated device's communicators too); nccl: NCCL (CUDA buffers);
/// local: a group of one rank on a device, whose collectives are copies
/// (make_single_rank_communicator).
enum class CommBackend { mpi, nccl, local };
std::string_view comm_backend_name(CommBackend backend);

enum class CommOp : std::uint8_t {
  all_reduce,
  reduce_scatter,
  all_gather,
  all_gather_v,
  broadcast,
  send,
  recv,
  barrier,
};
inline constexpr std::size_t kCommOpCount = 8;
std::string_view comm_op_name(CommOp op);

/// Counters for one kind of operation on one communicator.
struct TrafficCounter {
  std::uint64_t calls = 0;
  /// Payload as NCCL-tests define it: all_reduce and broadcast the buffer, reduce_scatter the
  /// (whole) input, all_gather the (whole) output, send/recv the message.
  std::uint64_t bytes = 0;
  /// Bytes this rank sends under a ring/bandwidth-optimal algorithm: bytes times the bus
  /// factor (2(n-1)/n for all_reduce, (n-1)/n for reduce_scatter, all_gather and all_gather_v,
  /// 1 otherwise; 0 for a broadcast on a single rank, which sends nothing).
  std::uint64_t wire_bytes = 0;
  /// Wall time from the start of the call until its completion was observed.
  double seconds = 0.0;
};

struct TrafficStats {
  std::array<TrafficCounter, kCommOpCount> per_op{};
  const TrafficCounter& operator[](CommOp op) const { return per_op[static_cast<std::size_t>(op)]; }
  TrafficCounter& operator[](CommOp op) { return per_op[static_cast<std::size_t>(op)]; }
  TrafficCounter total() const;
};

namespace detail {
// The watchdog's bookkeeping, private to mpi_layer/ (op_tracker.hpp): the in-flight operations of
// one communicator, one operation's registration there, and who a communicator's members are.
class OpTracker;
class InFlightOp;
struct CommIdentity;
}  // namespace detail

/// The halves of Communicator::isend_irecv: a message to send to `peer` and one to receive from it.
struct OutgoingMessage {
  const void* buffer = nullptr;
  std::size_t count = 0;
  DType type = DType::fp32;
  int peer = 0;
  int tag = 0;
};
struct IncomingMessage {
  void* buffer = nullptr;
  std::size_t count = 0;
  DType type = DType::fp32;
  int peer = 0;
  int tag = 0;
};

/// Handle to a non-blocking operation. wait() blocks until it completes (and finishes any
/// post-processing such as the division of an average); test() polls. Destroying a handle that
/// has not completed waits for it, so buffers are never left in flight.
class Work {
 public:
  class State;  // backend-specific
  Work() = default;
  explicit Work(std::unique_ptr<State> state);
  Work(Work&&) noexcept;
  Work& operator=(Work&&) noexcept;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;
  ~Work();

  void wait();
  bool test();
  bool completed() const { return state_ == nullptr; }

 private:
  friend class Communicator;  // registers the operation as in flight
  std::unique_ptr<State> state_;
  // The operation's registration in its communicator's in-flight list, ended when state_
  // completes: the list (opaque here) and the operation's token in it.
  detail::OpTracker* in_flight_list_ = nullptr;
  std::uint64_t in_flight_token_ = 0;
};

class Work::State {
 public:
  virtual ~State() = default;
  /// Block until done; run completion work; record the traffic counters.
  virtual void wait() = 0;
  /// Poll; on completion behave like wait() and return true.
  virtual bool test() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  /// A name for messages: "world", "data", "pipeline", "tensor", or what the creator chose.
  const std::string& name() const { return name_; }
  virtual CommBackend backend() const = 0;
  /// The device whose buffers this communicator takes (host for MPI).
  virtual Device device() const = 0;
  /// Sequence number of the last collective started on this communicator (1 for the first);
  /// every member numbers alike, as collectives start in the same order on every rank.
  std::uint64_t collectives_started() const;

  // ---- blocking ----
  /// recv[i] = op over ranks of send[i]; send == recv is in place.
  void all_reduce(const void* send, void* recv, std::size_t count, DType type, ReduceOp op);
  /// send holds size()*recv_count elements; this rank gets chunk rank() reduced.
  /// send == recv is allowed (the result lands at the start of the buffer).
  void reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType type, ReduceOp op);
  /// recv holds size()*send_count elements, chunk r from rank r. send may be recv + rank()*send_count.
  void all_gather(const void* send, void* recv, std::size_t send_count, DType type);
  /// Variable counts: recv_counts[r] elements from rank r, packed in rank order;
  /// recv_counts[rank()] must equal send_count.
  void all_gather_v(const void* send, std::size_t send_count, void* recv,
                    std::span<const std::size_t> recv_counts, DType type);
  void broadcast(void* buffer, std::size_t count, DType type, int root);
  void send(const void* buffer, std::size_t count, DType type, int peer, int tag = 0);
  void recv(void* buffer, std::size_t count, DType type, int peer, int tag = 0);
  void barrier();

  // ---- non-blocking ----
  [[nodiscard]] Work iall_reduce(const void* send, void* recv, std::size_t count, DType type, ReduceOp op);
  [[nodiscard]] Work ireduce_scatter(const void* send, void* recv, std::size_t recv_count, DType type,
                                     ReduceOp op);
  [[nodiscard]] Work iall_gather(const void* send, void* recv, std::size_t send_count, DType type);
  [[nodiscard]] Work iall_gather_v(const void* send, std::size_t send_count, void* recv,
                                   std::span<const std::size_t> recv_counts, DType type);
  [[nodiscard]] Work ibroadcast(void* buffer, std::size_t count, DType type, int root);
  [[nodiscard]] Work isend(const void* buffer, std::size_t count, DType type, int peer, int tag = 0);
  [[nodiscard]] Work irecv(void* buffer, std::size_t count, DType type, int peer, int tag = 0);
  /// A send and a receive started together as one operation (MPI: an isend and an irecv; NCCL: one
  /// group), complete when both are. Neither waits for the other to start, unlike a device
  /// communicator's separate send and recv (they run in posting order, and a send completes only
  /// once its receive is posted): neighbours can exchange, and a chain of ranks can each send to a
  /// neighbour and receive from it, without a deadlock. The peers may differ; a device
  /// communicator refuses this rank as either. Counted as one send and one recv in traffic().
  [[nodiscard]] Work isend_irecv(const OutgoingMessage& send, const IncomingMessage& recv);

  // ---- ordering ----
  /// Operations started from now on begin after the work that `event` was last recorded after, on
  /// whichever stream: a transfer stream's host-to-device copy of what a collective sends, so that
  /// the copy holds up only the collective, not the work queued on the stream the communicator is
  /// ordered with. A device communicator waits on the device (NCCL: its stream waits for the event;
  /// the single-rank communicator: the stream it is ordered with waits), never on the host; the MPI
  /// backend, whose operations start on the host, waits on the host (Event::synchronize: at once
  /// for host and emulated events). The event is a host event or on this communicator's device
  /// (any device for a communicator of host buffers); else zt::CommError.
  void order_after(const Event& event);

  // ---- accounting ----
  /// The counters so far. An operation's seconds run from its call to its observed completion; on a
  /// NCCL communicator ordered with a stream, whose operations run on the device after their call,
  /// they are the device's time (its completion event's minus its start's), added once the device
  /// has completed it, as of this call.
  const TrafficStats& traffic() const {
    settle_traffic();
    return traffic_;
  }
  void reset_traffic() {
    settle_traffic();
    traffic_ = {};
  }

 protected:
  /// The watchdog reports a hang here as a local timeout: it cannot ask the other members.
  Communicator(int rank, int size, std::string name);
  /// For zerotrain's backends (mpi_layer/): `identity`, agreed on by the members at creation, lets
  /// the watchdog ask the other members about a hang.
  Communicator(int rank, int size, std::string name, detail::CommIdentity identity);

  /// Record one completed operation (backends call this from their blocking paths and Work states).
  void record(CommOp op, std::size_t payload_bytes, double seconds);
  /// The in-flight list the watchdog reads, for backends whose operations go on after their call
  /// returns (NCCL ordered with a stream keeps them listed until the device completes them).
  detail::OpTracker& in_flight_list() const { return *tracker_; }
  /// For backends whose operations complete after their call returns: add what completed since the
  /// last call (add_late_seconds). Called on the thread that reads the counters.
  virtual void settle_traffic() const {}
  void add_late_seconds(CommOp op, double seconds) const { traffic_[op].seconds += seconds; }

  // Backend hooks. Arguments are already validated by the public methods above.
  virtual void do_all_reduce(const void* send, void* recv, std::size_t count, DType type, ReduceOp op) = 0;
  virtual void do_reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType type,
                                 ReduceOp op) = 0;
  virtual void do_all_gather(const void* send, void* recv, std::size_t send_count, DType type) = 0;
  virtual void do_all_gather_v(const void* send, std::size_t send_count, void* recv,
                               std::span<const std::size_t> recv_counts, DType type) = 0;
  virtual void do_broadcast(void* buffer, std::size_t count, DType type, int root) = 0;
  virtual void do_send(const void* buffer, std::size_t count, DType type, int peer, int tag) = 0;
  virtual void do_recv(void* buffer, std::size_t count, DType type, int peer, int tag) = 0;
  virtual void do_barrier() = 0;

  virtual Work do_iall_reduce(const void* send, void* recv, std::size_t count, DType type, ReduceOp op) = 0;
  virtual Work do_ireduce_scatter(const void* send, void* recv, std::size_t recv_count, DType type,
                                  ReduceOp op) = 0;
  virtual Work do_iall_gather(const void* send, void* recv, std::size_t send_count, DType type) = 0;
  virtual Work do_iall_gather_v(const void* send, std::size_t send_count, void* recv,
                                std::span<const std::size_t> recv_counts, DType type) = 0;
  virtual Work do_ibroadcast(void* buffer, std::size_t count, DType type, int root) = 0;
  virtual Work do_isend(const void* buffer, std::size_t count, DType type, int peer, int tag) = 0;
  virtual Work do_irecv(void* buffer, std::size_t count, DType type, int peer, int tag) = 0;
  /// The send's and the receive's handles. By default do_isend then do_irecv, which is right for a
  /// backend whose isend does not wait for the receive (MPI on host buffers).
  virtual std::pair<Work, Work> do_isend_irecv(const OutgoingMessage& send, const IncomingMessage& recv);
  /// By default a host wait for the event, which is right for a backend whose operations start on
  /// the host.
  virtual void do_order_after(const Event& event);

 private:
  /// Registers the operation as in flight until the returned object is destroyed.
  detail::InFlightOp begin(CommOp op, std::size_t payload_bytes, std::optional<DType> type, int peer = -1,
                           int tag = -1);
  /// The backend's handle, now holding the operation's in-flight registration (made before the
  /// backend started it, so that sequence numbers follow the order in which operations start).
  static Work tracked(detail::InFlightOp in_flight, Work work);

  int rank_;
  int size_;
  std::string name_;
  mutable TrafficStats traffic_{};              // mutable: settle_traffic() adds late completions on read
  std::shared_ptr<detail::OpTracker> tracker_;  // shared with the watchdog's registry
};

/// A communicator of one rank for buffers on `device` (the emulated device or a GPU): every collective
/// is a copy from the send to the receive buffer, or nothing in place, queued on `ordered_with` (the
/// stream whose work it follows and which later work follows: the engine's compute stream) and
/// complete for the host when it returns (its non-blocking forms return completed handles);
/// barrier() waits for that stream. Point-to-point is refused (the only peer would be the rank
/// itself), as on every device communicator. backend() is local; it holds no NCCL resources. On the
/// emulated device a buffer outside its memory is refused, as with its MPI communicators. What the
/// engine uses for a group of one rank on a device.
std::unique_ptr<Communicator> make_single_rank_communicator(Device device, std::string name,
                                                            const Stream& ordered_with);

}  // namespace zt
