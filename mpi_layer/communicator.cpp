// The backend-independent half of zt::Communicator and zt::Work: names, argument validation,
// traffic accounting and the lifetime rules of non-blocking handles.
#include "zerotrain/communicator.hpp"

#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <string>
#include <tuple>
#include <utility>

#include "mpi_layer/op_tracker.hpp"
#include "zerotrain/error.hpp"

namespace zt {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::avg:
      return "avg";
    case ReduceOp::max:
      return "max";
  }
  return "?";
}

std::string_view comm_backend_name(CommBackend backend) {
  switch (backend) {
    case CommBackend::mpi:
      return "mpi";
    case CommBackend::nccl:
      return "nccl";
    case CommBackend::local:
      return "local";
  }
  return "?";
}

std::string_view comm_op_name(CommOp op) {
  switch (op) {
    case CommOp::all_reduce:
      return "all_reduce";
    case CommOp::reduce_scatter:
      return "reduce_scatter";
    case CommOp::all_gather:
      return "all_gather";
    case CommOp::all_gather_v:
      return "all_gather_v";
    case CommOp::broadcast:
      return "broadcast";
    case CommOp::send:
      return "send";
    case CommOp::recv:
      return "recv";
    case CommOp::barrier:
      return "barrier";
  }
  return "?";
}

TrafficCounter TrafficStats::total() const {
  TrafficCounter sum;
  for (const TrafficCounter& counter : per_op) {
    sum.calls += counter.calls;
    sum.bytes += counter.bytes;
    sum.wire_bytes += counter.wire_bytes;
    sum.seconds += counter.seconds;
  }
  return sum;
}

namespace {

/// floor(bytes * numerator / denominator) without the overflow of the plain product.
std::uint64_t scale_bytes(std::uint64_t bytes, std::uint64_t numerator, std::uint64_t denominator) {
  return bytes / denominator * numerator + bytes % denominator * numerator / denominator;
}

/// Bytes one rank sends for `payload` bytes under a bandwidth-optimal (ring) algorithm; the bus
/// factors of NCCL-tests. A single rank sends nothing in a collective.
std::uint64_t wire_bytes_of(CommOp op, std::uint64_t payload, int ranks) {
  const auto n = static_cast<std::uint64_t>(ranks);
  switch (op) {
    case CommOp::all_reduce:
      return scale_bytes(payload, 2 * (n - 1), n);
    case CommOp::reduce_scatter:
    case CommOp::all_gather:
    case CommOp::all_gather_v:
      return scale_bytes(payload, n - 1, n);
    case CommOp::broadcast:
      return n > 1 ? payload : 0;
    case CommOp::send:
    case CommOp::recv:
      return payload;
    case CommOp::barrier:
      return 0;
  }
  return 0;
}

// ---- argument validation -------------------------------------------------------------------
// Every message starts "<op> on communicator '<name>' (rank r of n): " so that a failure in a
// job of thousands of ranks says which call, which group and which member went wrong.

struct CallSite {
  const Communicator& comm;
  CommOp op;
};

#define ZT_COMM_CHECK(site, condition, ...)                                                                  \
  ZT_CHECK_AS(::zt::CommError, condition, comm_op_name((site).op), " on communicator '", (site).comm.name(), \
              "' (rank ", (site).comm.rank(), " of ", (site).comm.size(), "): ", __VA_ARGS__)

bool valid_dtype(DType type) {
  return static_cast<unsigned>(type) <= static_cast<unsigned>(DType::int64);
}

void check_dtype(const CallSite& site, DType type) {
  ZT_COMM_CHECK(site, valid_dtype(type), "invalid dtype value ", static_cast<unsigned>(type),
                "; expected one of fp32, fp64, bf16, fp16, int32, int64");
}

void check_reduce_op(const CallSite& site, ReduceOp op) {
  ZT_COMM_CHECK(site, op == ReduceOp::sum || op == ReduceOp::avg || op == ReduceOp::max,
                "invalid reduce op value ", static_cast<unsigned>(op), "; expected sum, avg or max");
}

/// count * dtype size, refusing counts whose byte size does not fit in size_t.
std::size_t checked_bytes(const CallSite& site, std::string_view what, std::size_t count, DType type) {
  const std::size_t element = dtype_size(type);
  ZT_COMM_CHECK(site, count <= std::numeric_limits<std::size_t>::max() / element, what, " holds ", count,
                " elements of ", dtype_name(type), ", more bytes than size_t can address");
  return count * element;
}

void check_buffer(const CallSite& site, std::string_view what, const void* buffer, std::size_t count) {
  ZT_COMM_CHECK(site, buffer != nullptr || count == 0, what, " buffer is null but the call has ", count,
                " elements; expected a valid pointer (null is only allowed with count 0)");
}

void check_rank(const CallSite& site, std::string_view what, int value) {
  ZT_COMM_CHECK(site, value >= 0 && value < site.comm.size(), what, " ", value,
                " is out of range; expected 0 <= ", what, " < ", site.comm.size());
}

void check_tag(const CallSite& site, int tag) {
  ZT_COMM_CHECK(site, tag >= 0, "tag ", tag, " is negative; expected a tag >= 0");
}

/// Byte ranges [a, a + a_bytes) and [b, b + b_bytes) share at least one byte.
bool overlap(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  if (a_bytes == 0 || b_bytes == 0) return false;
  const auto a_begin = reinterpret_cast<std::uintptr_t>(a);
  const auto b_begin = reinterpret_cast<std::uintptr_t>(b);
  return a_begin < b_begin + b_bytes && b_begin < a_begin + a_bytes;
}

/// `send` must either sit exactly at `in_place_position` (the documented in-place form) or not
/// touch the receive buffer at all; a partial overlap would give rank-dependent garbage.
void check_in_place_or_disjoint(const CallSite& site, const void* send, std::size_t send_bytes,
                                const void* recv, std::size_t recv_bytes, const void* in_place_position,
                                std::string_view in_place_rule) {
  if (send == in_place_position) return;
  ZT_COMM_CHECK(
      site, !overlap(send, send_bytes, recv, recv_bytes),
      "send and recv buffers overlap without being the in-place form; expected disjoint buffers or ",
      in_place_rule);
}

const void* advance(const void* pointer, std::size_t bytes) {
  return pointer == nullptr ? nullptr : static_cast<const std::byte*>(pointer) + bytes;
}

/// What a destructor does when completing an operation fails: it cannot throw, and returning
/// would leave buffers in flight, so it reports and ends the process (MPI then ends the job).
void finish_or_terminate(std::unique_ptr<Work::State>& state, const char* context) noexcept {
  if (!state) return;
  try {
    std::unique_ptr<Work::State> pending = std::move(state);
    pending->wait();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "[zerotrain rank %d] a non-blocking operation failed in %s: %s\n",
                 detail::error_rank(), context, error.what());
    std::terminate();
  } catch (...) {
    std::fprintf(stderr, "[zerotrain rank %d] a non-blocking operation failed in %s (unknown exception)\n",
                 detail::error_rank(), context);
    std::terminate();
  }
}

}  // namespace

// ---- in-flight registration ---------------------------------------------------------------

void detail::InFlightOp::finish() noexcept {
  if (tracker_ == nullptr) return;
  OpTracker* tracker = std::exchange(tracker_, nullptr);
  try {
    tracker->finish(token_);
  } catch (...) {  // a failing mutex leaves the operation listed; the watchdog may then report it
  }
}

Communicator::Communicator(int rank, int size, std::string name)
    : Communicator(rank, size, std::move(name), detail::CommIdentity{}) {}

Communicator::Communicator(int rank, int size, std::string name, detail::CommIdentity identity)
    : rank_(rank),
      size_(size),
      name_(std::move(name)),
      tracker_(std::make_shared<detail::OpTracker>(name_, rank, size, std::move(identity))) {
  detail::register_tracker(tracker_);
}

std::uint64_t Communicator::collectives_started() const {
  return tracker_->collectives_started();
}

detail::InFlightOp Communicator::begin(CommOp op, std::size_t payload_bytes, std::optional<DType> type,
                                       int peer, int tag) {
  return {tracker_.get(), tracker_->begin(op, payload_bytes, type, peer, tag)};
}

namespace {

/// A Work's registration as an object again (ended when it goes out of scope).
detail::InFlightOp take_in_flight(detail::OpTracker*& list, std::uint64_t token) {
  return {std::exchange(list, nullptr), token};
}

}  // namespace

Work Communicator::tracked(detail::InFlightOp in_flight, Work work) {
  if (work.completed()) return work;  // the backend finished it already; `in_flight` ends here
  take_in_flight(work.in_flight_list_, work.in_flight_token_).finish();
  std::tie(work.in_flight_list_, work.in_flight_token_) = in_flight.release();
  return work;
}

// ---- Work ----------------------------------------------------------------------------------

Work::Work(std::unique_ptr<State> state) : state_(std::move(state)) {}

Work::Work(Work&& other) noexcept
    : state_(std::move(other.state_)),
      in_flight_list_(std::exchange(other.in_flight_list_, nullptr)),
      in_flight_token_(other.in_flight_token_) {}

Work& Work::operator=(Work&& other) noexcept {
  if (this != &other) {
    finish_or_terminate(state_, "Work move-assignment (the overwritten handle had not completed)");
    take_in_flight(in_flight_list_, in_flight_token_).finish();
    state_ = std::move(other.state_);
    in_flight_list_ = std::exchange(other.in_flight_list_, nullptr);
    in_flight_token_ = other.in_flight_token_;
  }
  return *this;
}

Work::~Work() {
  finish_or_terminate(state_, "~Work (the handle was destroyed before wait())");
  take_in_flight(in_flight_list_, in_flight_token_).finish();
}

void Work::wait() {
  if (!state_) return;
  const detail::InFlightOp finished_at_exit = take_in_flight(in_flight_list_, in_flight_token_);
  // The handle is complete afterwards whether or not wait() throws: a failed operation cannot be
  // waited for again, and the state's destructor releases whatever is still pending.
  std::unique_ptr<State> pending = std::move(state_);
  pending->wait();
}

bool Work::test() {
  if (!state_) return true;
  bool done = false;
  try {
    done = state_->test();
  } catch (...) {
    state_.reset();
    take_in_flight(in_flight_list_, in_flight_token_).finish();
    throw;
  }
  if (done) {
    state_.reset();
    take_in_flight(in_flight_list_, in_flight_token_).finish();
  }
  return done;
}

// ---- Communicator: validation, then the backend ------------------------------------------

void Communicator::record(CommOp op, std::size_t payload_bytes, double seconds) {
  TrafficCounter& counter = traffic_[op];
  counter.calls += 1;
  counter.bytes += payload_bytes;
  counter.wire_bytes += wire_bytes_of(op, payload_bytes, size_);
  counter.seconds += seconds;
}

namespace {

void validate_all_reduce(const CallSite& site, const void* send, const void* recv, std::size_t count,
                         DType type, ReduceOp op) {
  check_dtype(site, type);
  check_reduce_op(site, op);
  const std::size_t bytes = checked_bytes(site, "the buffer", count, type);
  check_buffer(site, "send", send, count);
  check_buffer(site, "recv", recv, count);
  check_in_place_or_disjoint(site, send, bytes, recv, bytes, recv, "send == recv (in place)");
}

void validate_reduce_scatter(const CallSite& site, const void* send, const void* recv, std::size_t recv_count,
                             DType type, ReduceOp op) {
  check_dtype(site, type);
  check_reduce_op(site, op);
  const auto ranks = static_cast<std::size_t>(site.comm.size());
  ZT_COMM_CHECK(site, recv_count <= std::numeric_limits<std::size_t>::max() / ranks, "recv_count ",
                recv_count, " times ", ranks, " ranks overflows size_t");
  const std::size_t send_bytes = checked_bytes(site, "send", recv_count * ranks, type);
  const std::size_t recv_bytes = recv_count * dtype_size(type);
  check_buffer(site, "send", send, recv_count * ranks);
  check_buffer(site, "recv", recv, recv_count);
  check_in_place_or_disjoint(site, send, send_bytes, recv, recv_bytes, recv,
                             "send == recv (in place, the result lands at the start of the buffer)");
}

void validate_all_gather(const CallSite& site, const void* send, const void* recv, std::size_t send_count,
                         DType type) {
  check_dtype(site, type);
  const auto ranks = static_cast<std::size_t>(site.comm.size());
  ZT_COMM_CHECK(site, send_count <= std::numeric_limits<std::size_t>::max() / ranks, "send_count ",
                send_count, " times ", ranks, " ranks overflows size_t");
  const std::size_t recv_bytes = checked_bytes(site, "recv", send_count * ranks, type);
  const std::size_t send_bytes = send_count * dtype_size(type);
  check_buffer(site, "send", send, send_count);
  check_buffer(site, "recv", recv, send_count * ranks);
  check_in_place_or_disjoint(site, send, send_bytes, recv, recv_bytes,
                             advance(recv, static_cast<std::size_t>(site.comm.rank()) * send_bytes),
                             "send == recv + rank() * send_count (in place)");
}

void validate_all_gather_v(const CallSite& site, const void* send, std::size_t send_count, const void* recv,
                           std::span<const std::size_t> recv_counts, DType type) {
  check_dtype(site, type);
  ZT_COMM_CHECK(site, recv_counts.size() == static_cast<std::size_t>(site.comm.size()), "recv_counts has ",
                recv_counts.size(), " entries; expected one per rank (", site.comm.size(), ")");
  const auto rank = static_cast<std::size_t>(site.comm.rank());
  ZT_COMM_CHECK(site, recv_counts[rank] == send_count, "recv_counts[", rank, "] is ", recv_counts[rank],
                " but this rank sends send_count = ", send_count, "; expected them equal");
  std::size_t total = 0;
  std::size_t own_offset = 0;
  for (std::size_t r = 0; r < recv_counts.size(); ++r) {
    ZT_COMM_CHECK(site, recv_counts[r] <= std::numeric_limits<std::size_t>::max() - total,
                  "the sum of recv_counts overflows size_t");
    if (r == rank) own_offset = total;
    total += recv_counts[r];
  }
  const std::size_t recv_bytes = checked_bytes(site, "recv", total, type);
  const std::size_t send_bytes = send_count * dtype_size(type);
  check_buffer(site, "send", send, send_count);
  check_buffer(site, "recv", recv, total);
  check_in_place_or_disjoint(site, send, send_bytes, recv, recv_bytes,
                             advance(recv, own_offset * dtype_size(type)),
                             "send == recv + (sum of recv_counts before this rank) (in place)");
}

void validate_broadcast(const CallSite& site, const void* buffer, std::size_t count, DType type, int root) {
  check_dtype(site, type);
  checked_bytes(site, "the buffer", count, type);
  check_buffer(site, "the", buffer, count);
  check_rank(site, "root", root);
}

void validate_point_to_point(const CallSite& site, const void* buffer, std::size_t count, DType type,
                             int peer, int tag) {
  check_dtype(site, type);
  checked_bytes(site, "the message", count, type);
  check_buffer(site, "the message", buffer, count);
  check_rank(site, "peer", peer);
  check_tag(site, tag);
}

std::size_t ranks_of(const Communicator& comm) {
  return static_cast<std::size_t>(comm.size());
}

std::size_t sum_of(std::span<const std::size_t> counts) {
  std::size_t total = 0;
  for (std::size_t count : counts) total += count;
  return total;
}

}  // namespace

void Communicator::all_reduce(const void* send, void* recv, std::size_t count, DType type, ReduceOp op) {
  validate_all_reduce({*this, CommOp::all_reduce}, send, recv, count, type, op);
  const auto in_flight = begin(CommOp::all_reduce, count * dtype_size(type), type);
  do_all_reduce(send, recv, count, type, op);
}

void Communicator::reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType type,
                                  ReduceOp op) {
  validate_reduce_scatter({*this, CommOp::reduce_scatter}, send, recv, recv_count, type, op);
  const auto in_flight = begin(CommOp::reduce_scatter, recv_count * ranks_of(*this) * dtype_size(type), type);
  do_reduce_scatter(send, recv, recv_count, type, op);
}

void Communicator::all_gather(const void* send, void* recv, std::size_t send_count, DType type) {
  validate_all_gather({*this, CommOp::all_gather}, send, recv, send_count, type);
  const auto in_flight = begin(CommOp::all_gather, send_count * ranks_of(*this) * dtype_size(type), type);
  do_all_gather(send, recv, send_count, type);
}

void Communicator::all_gather_v(const void* send, std::size_t send_count, void* recv,
                                std::span<const std::size_t> recv_counts, DType type) {
  validate_all_gather_v({*this, CommOp::all_gather_v}, send, send_count, recv, recv_counts, type);
  const auto in_flight = begin(CommOp::all_gather_v, sum_of(recv_counts) * dtype_size(type), type);
  do_all_gather_v(send, send_count, recv, recv_counts, type);
}

void Communicator::broadcast(void* buffer, std::size_t count, DType type, int root) {
  validate_broadcast({*this, CommOp::broadcast}, buffer, count, type, root);
  const auto in_flight = begin(CommOp::broadcast, count * dtype_size(type), type, root);
  do_broadcast(buffer, count, type, root);
}

void Communicator::send(const void* buffer, std::size_t count, DType type, int peer, int tag) {
  validate_point_to_point({*this, CommOp::send}, buffer, count, type, peer, tag);
  const auto in_flight = begin(CommOp::send, count * dtype_size(type), type, peer, tag);
  do_send(buffer, count, type, peer, tag);
}

void Communicator::recv(void* buffer, std::size_t count, DType type, int peer, int tag) {
  validate_point_to_point({*this, CommOp::recv}, buffer, count, type, peer, tag);
  const auto in_flight = begin(CommOp::recv, count * dtype_size(type), type, peer, tag);
  do_recv(buffer, count, type, peer, tag);
}

void Communicator::barrier() {
  const auto in_flight = begin(CommOp::barrier, 0, std::nullopt);
  do_barrier();
}

Work Communicator::iall_reduce(const void* send, void* recv, std::size_t count, DType type, ReduceOp op) {
  validate_all_reduce({*this, CommOp::all_reduce}, send, recv, count, type, op);
  detail::InFlightOp in_flight = begin(CommOp::all_reduce, count * dtype_size(type), type);
  return tracked(std::move(in_flight), do_iall_reduce(send, recv, count, type, op));
}

Work Communicator::ireduce_scatter(const void* send, void* recv, std::size_t recv_count, DType type,
                                   ReduceOp op) {
  validate_reduce_scatter({*this, CommOp::reduce_scatter}, send, recv, recv_count, type, op);
  detail::InFlightOp in_flight =
      begin(CommOp::reduce_scatter, recv_count * ranks_of(*this) * dtype_size(type), type);
  return tracked(std::move(in_flight), do_ireduce_scatter(send, recv, recv_count, type, op));
}

Work Communicator::iall_gather(const void* send, void* recv, std::size_t send_count, DType type) {
  validate_all_gather({*this, CommOp::all_gather}, send, recv, send_count, type);
  detail::InFlightOp in_flight =
      begin(CommOp::all_gather, send_count * ranks_of(*this) * dtype_size(type), type);
  return tracked(std::move(in_flight), do_iall_gather(send, recv, send_count, type));
}

Work Communicator::iall_gather_v(const void* send, std::size_t send_count, void* recv,
                                 std::span<const std::size_t> recv_counts, DType type) {
  validate_all_gather_v({*this, CommOp::all_gather_v}, send, send_count, recv, recv_counts, type);
  detail::InFlightOp in_flight = begin(CommOp::all_gather_v, sum_of(recv_counts) * dtype_size(type), type);
  return tracked(std::move(in_flight), do_iall_gather_v(send, send_count, recv, recv_counts, type));
}

Work Communicator::ibroadcast(void* buffer, std::size_t count, DType type, int root) {
  validate_broadcast({*this, CommOp::broadcast}, buffer, count, type, root);
  detail::InFlightOp in_flight = begin(CommOp::broadcast, count * dtype_size(type), type, root);
  return tracked(std::move(in_flight), do_ibroadcast(buffer, count, type, root));
}

Work Communicator::isend(const void* buffer, std::size_t count, DType type, int peer, int tag) {
  validate_point_to_point({*this, CommOp::send}, buffer, count, type, peer, tag);
  detail::InFlightOp in_flight = begin(CommOp::send, count * dtype_size(type), type, peer, tag);
  return tracked(std::move(in_flight), do_isend(buffer, count, type, peer, tag));
}

Work Communicator::irecv(void* buffer, std::size_t count, DType type, int peer, int tag) {
  validate_point_to_point({*this, CommOp::recv}, buffer, count, type, peer, tag);
  detail::InFlightOp in_flight = begin(CommOp::recv, count * dtype_size(type), type, peer, tag);
  return tracked(std::move(in_flight), do_irecv(buffer, count, type, peer, tag));
}

namespace {

/// Two operations' handles as one: complete when both are.
class BothOperations final : public Work::State {
 public:
  BothOperations(Work first, Work second) : first_(std::move(first)), second_(std::move(second)) {}
  void wait() override {
    first_.wait();
    second_.wait();
  }
  bool test() override {
    const bool first_done = first_.test();  // both polled, so that each progresses
    return second_.test() && first_done;
  }

 private:
  Work first_;
  Work second_;
};

}  // namespace

Work Communicator::isend_irecv(const OutgoingMessage& send, const IncomingMessage& recv) {
  validate_point_to_point({*this, CommOp::send}, send.buffer, send.count, send.type, send.peer, send.tag);
  validate_point_to_point({*this, CommOp::recv}, recv.buffer, recv.count, recv.type, recv.peer, recv.tag);
  ZT_COMM_CHECK((CallSite{*this, CommOp::recv}),
                !overlap(send.buffer, send.count * dtype_size(send.type), recv.buffer,
                         recv.count * dtype_size(recv.type)),
                "the message to send and the receive buffer overlap; an exchange needs disjoint buffers");
  detail::InFlightOp sending =
      begin(CommOp::send, send.count * dtype_size(send.type), send.type, send.peer, send.tag);
  detail::InFlightOp receiving =
      begin(CommOp::recv, recv.count * dtype_size(recv.type), recv.type, recv.peer, recv.tag);
  tracker_->link_exchange(sending.token(), receiving.token());
  auto [sent, received] = do_isend_irecv(send, recv);
  Work send_work = tracked(std::move(sending), std::move(sent));
  Work recv_work = tracked(std::move(receiving), std::move(received));
  if (send_work.completed() && recv_work.completed()) return Work();
  return Work(std::make_unique<BothOperations>(std::move(send_work), std::move(recv_work)));
}

void Communicator::order_after(const Event& event) {
  ZT_CHECK_AS(CommError, event.device().is_host() || device().is_host() || event.device() == device(),
              "order_after on communicator '", name(), "' (rank ", rank(), " of ", size(),
              "): the event is on ", event.device().str(), ", the communicator's buffers on ", device().str(),
              "; a device communicator waits only for its own device's events (or host events)");
  do_order_after(event);
}

void Communicator::do_order_after(const Event& event) {
  event.synchronize();
}

std::pair<Work, Work> Communicator::do_isend_irecv(const OutgoingMessage& send, const IncomingMessage& recv) {
  Work sent = do_isend(send.buffer, send.count, send.type, send.peer, send.tag);
  return {std::move(sent), do_irecv(recv.buffer, recv.count, recv.type, recv.peer, recv.tag)};
}

}  // namespace zt
