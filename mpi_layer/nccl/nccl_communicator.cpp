// The NCCL backend of zt::Communicator (built only with CUDA). See nccl_communicator.hpp for how
// its semantics differ from the MPI backend, and for the stream-ordered mode the engine uses.
#include "zerotrain/nccl_communicator.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "base/seconds_since.hpp"
#include "mpi_layer/op_tracker.hpp"
#include "mpi_layer/watchdog.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/mpi_communicator.hpp"

namespace zt {
namespace {

using base::Clock;
using base::seconds_since;

/// cudaEventQuery, with a "not ready" answer kept out of the thread's last error, which a later
/// kernel launch's check reads (as kernels/cuda's query_event; HIP records it there).
cudaError_t query_event(cudaEvent_t event) {
  const cudaError_t status = cudaEventQuery(event);
  if (status == cudaErrorNotReady) (void)cudaGetLastError();
  return status;
}

std::byte* at(void* pointer, std::size_t bytes) {
  return static_cast<std::byte*>(pointer) + bytes;
}

[[noreturn]] void raise_nccl(const char* file, int line, std::string_view call, std::string_view communicator,
                             ncclComm_t comm, ncclResult_t result) {
  call = call.substr(0, call.find('('));
  const char* detail = comm != nullptr ? ncclGetLastError(comm) : nullptr;
  detail::raise<CommError>(
      file, line, call, " failed on NCCL communicator '", communicator, "': ", ncclGetErrorString(result),
      " (ncclResult_t ", static_cast<int>(result), ")",
      (detail != nullptr && *detail != '\0') ? std::string("; NCCL says: ") + detail : std::string());
}

[[noreturn]] void raise_cuda(const char* file, int line, std::string_view call, std::string_view communicator,
                             cudaError_t error) {
  call = call.substr(0, call.find('('));
  detail::raise<CommError>(file, line, call, " failed on NCCL communicator '", communicator,
                           "': ", cudaGetErrorName(error), ": ", cudaGetErrorString(error));
}

}  // namespace

#define ZT_CHECK_NCCL(call, communicator_name, nccl_comm)                                       \
  do {                                                                                          \
    const ncclResult_t zt_nccl_result_ = (call);                                                \
    if (zt_nccl_result_ != ncclSuccess)                                                         \
      raise_nccl(__FILE__, __LINE__, #call, (communicator_name), (nccl_comm), zt_nccl_result_); \
  } while (0)

#define ZT_CHECK_CUDA_COMM(call, communicator_name)                               \
  do {                                                                            \
    const cudaError_t zt_cuda_error_ = (call);                                    \
    if (zt_cuda_error_ != cudaSuccess)                                            \
      raise_cuda(__FILE__, __LINE__, #call, (communicator_name), zt_cuda_error_); \
  } while (0)

namespace {

ncclDataType_t nccl_type(DType type) {
  switch (type) {
    case DType::fp32:
      return ncclFloat32;
    case DType::fp64:
      return ncclFloat64;
    case DType::bf16:
      return ncclBfloat16;
    case DType::fp16:
      return ncclFloat16;
    case DType::int32:
      return ncclInt32;
    case DType::int64:
      return ncclInt64;
  }
  ZT_THROW_AS(CommError, "no NCCL datatype for dtype value ", static_cast<unsigned>(type));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::avg:
      return ncclAvg;
    case ReduceOp::max:
      return ncclMax;
  }
  ZT_THROW_AS(CommError, "no NCCL reduction for reduce op value ", static_cast<unsigned>(op));
}

/// Makes `device` current for the scope, restoring the previous device after.
class DeviceScope {
 public:
  DeviceScope(int device, std::string_view communicator) {
    ZT_CHECK_CUDA_COMM(cudaGetDevice(&previous_), communicator);
    if (previous_ != device) ZT_CHECK_CUDA_COMM(cudaSetDevice(device), communicator);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  ~DeviceScope() {
    int current = previous_;
    if (cudaGetDevice(&current) == cudaSuccess && current != previous_) cudaSetDevice(previous_);
  }

 private:
  int previous_ = 0;
};

/// Owns the NCCL communicator and the stream; destroyed on the communicator's device.
struct NcclResources {
  int device = 0;
  ncclComm_t comm = nullptr;  // null once ncclCommAbort has freed it
  cudaStream_t stream = nullptr;
  void* scalar = nullptr;  // 4 device bytes for barrier()

  NcclResources() = default;
  NcclResources(const NcclResources&) = delete;
  NcclResources& operator=(const NcclResources&) = delete;
  ~NcclResources() {
    int previous = device;
    cudaGetDevice(&previous);
    cudaSetDevice(device);
    if (stream != nullptr) cudaStreamSynchronize(stream);  // nothing of ours may still run
    if (comm != nullptr) ncclCommDestroy(comm);
    if (scalar != nullptr) cudaFree(scalar);
    if (stream != nullptr) cudaStreamDestroy(stream);
    cudaSetDevice(previous);
  }
};

/// A CUDA event without timing, destroyed with the object.
class OwnedEvent {
 public:
  /// `timing`: for cudaEventElapsedTime (the operations' device time); else the lighter kind.
  explicit OwnedEvent(std::string_view communicator, bool timing = false) {
    ZT_CHECK_CUDA_COMM(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming),
                       communicator);
  }
  OwnedEvent(const OwnedEvent&) = delete;
  OwnedEvent& operator=(const OwnedEvent&) = delete;
  ~OwnedEvent() {
    if (event_ != nullptr) cudaEventDestroy(event_);
  }
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::unique_ptr<NcclResources> resources, int rank, int size, std::string name,
                   detail::CommIdentity identity, cudaStream_t ordered_with)
      : Communicator(rank, size, std::move(name), std::move(identity)),
        resources_(std::move(resources)),
        ordered_(ordered_with) {
    if (ordered_ != nullptr) ordered_reached_ = std::make_unique<OwnedEvent>(this->name());
    // The watchdog retires what the device has completed and, when it ends the job, aborts.
    in_flight_list().set_device_hooks([this] { retire_completed_from_any_thread(); },
                                      [this] { abort_from_watchdog(); });
  }

  ~NcclCommunicator() override {
    in_flight_list().clear_device_hooks();  // waits for a hook in progress on the watchdog thread
    if (aborted_.load()) {
      resources_->comm = nullptr;  // ncclCommAbort freed it
    } else {
      int previous = resources_->device;
      cudaGetDevice(&previous);
      cudaSetDevice(resources_->device);
      cudaStreamSynchronize(stream());  // what is still pending completes (or has failed) now
      cudaSetDevice(previous);
    }
    const std::lock_guard lock(pending_mutex_);
    for (const PendingOp& op : pending_) in_flight_list().finish(op.token);
    pending_.clear();
  }

  CommBackend backend() const override { return CommBackend::nccl; }
  Device device() const override { return Device::cuda(resources_->device); }
  cudaStream_t stream() const { return resources_->stream; }

 protected:
  void do_all_reduce(const void* send, void* recv, std::size_t count, DType type, ReduceOp op) override {
    blocking(CommOp::all_reduce, count * dtype_size(type),
             [&] { enqueue_all_reduce(send, recv, count, type, op); });
  }
  void do_reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType type,
                         ReduceOp op) override {
    blocking(CommOp::reduce_scatter, recv_count * dtype_size(type) * static_cast<std::size_t>(size()),
             [&] { enqueue_reduce_scatter(send, recv, recv_count, type, op); });
  }
  void do_all_gather(const void* send, void* recv, std::size_t send_count, DType type) override {
    blocking(CommOp::all_gather, send_count * dtype_size(type) * static_cast<std::size_t>(size()),
             [&] { enqueue_all_gather(send, recv, send_count, type); });
  }
  void do_all_gather_v(const void* send, std::size_t send_count, void* recv,
                       std::span<const std::size_t> recv_counts, DType type) override {
    blocking(CommOp::all_gather_v, total_of(recv_counts) * dtype_size(type),
             [&] { enqueue_all_gather_v(send, send_count, recv, recv_counts, type); });
  }
  void do_broadcast(void* buffer, std::size_t count, DType type, int root) override {
    blocking(CommOp::broadcast, count * dtype_size(type),
             [&] { enqueue_broadcast(buffer, count, type, root); });
  }
  void do_send(const void* buffer, std::size_t count, DType type, int peer, int) override {
    blocking(CommOp::send, count * dtype_size(type), [&] { enqueue_send(buffer, count, type, peer); });
  }
  void do_recv(void* buffer, std::size_t count, DType type, int peer, int) override {
    blocking(CommOp::recv, count * dtype_size(type), [&] { enqueue_recv(buffer, count, type, peer); });
  }
  void do_barrier() override {  // the host waits, also when ordered with a stream
    blocking(CommOp::barrier, 0, [&] {
      ZT_CHECK_NCCL(
          ncclAllReduce(resources_->scalar, resources_->scalar, 1, ncclInt32, ncclSum, comm(), stream()),
          name(), comm());
    });
  }

  Work do_iall_reduce(const void* send, void* recv, std::size_t count, DType type, ReduceOp op) override {
    return nonblocking(CommOp::all_reduce, count * dtype_size(type),
                       [&] { enqueue_all_reduce(send, recv, count, type, op); });
  }
  Work do_ireduce_scatter(const void* send, void* recv, std::size_t recv_count, DType type,
                          ReduceOp op) override {
    return nonblocking(CommOp::reduce_scatter,
                       recv_count * dtype_size(type) * static_cast<std::size_t>(size()),
                       [&] { enqueue_reduce_scatter(send, recv, recv_count, type, op); });
  }
  Work do_iall_gather(const void* send, void* recv, std::size_t send_count, DType type) override {
    return nonblocking(CommOp::all_gather, send_count * dtype_size(type) * static_cast<std::size_t>(size()),
                       [&] { enqueue_all_gather(send, recv, send_count, type); });
  }
  Work do_iall_gather_v(const void* send, std::size_t send_count, void* recv,
                        std::span<const std::size_t> recv_counts, DType type) override {
    return nonblocking(CommOp::all_gather_v, total_of(recv_counts) * dtype_size(type),
                       [&] { enqueue_all_gather_v(send, send_count, recv, recv_counts, type); });
  }
  Work do_ibroadcast(void* buffer, std::size_t count, DType type, int root) override {
    return nonblocking(CommOp::broadcast, count * dtype_size(type),
                       [&] { enqueue_broadcast(buffer, count, type, root); });
  }
  Work do_isend(const void* buffer, std::size_t count, DType type, int peer, int) override {
    return nonblocking(CommOp::send, count * dtype_size(type),
                       [&] { enqueue_send(buffer, count, type, peer); });
  }
  Work do_irecv(void* buffer, std::size_t count, DType type, int peer, int) override {
    return nonblocking(CommOp::recv, count * dtype_size(type),
                       [&] { enqueue_recv(buffer, count, type, peer); });
  }
  /// One NCCL group: the send and the receive progress together, so neither waits for the other's
  /// peer. Both handles wait for the group's completion event.
  std::pair<Work, Work> do_isend_irecv(const OutgoingMessage& send, const IncomingMessage& recv) override;
  /// The communicator's stream waits for the event on the device: the operations enqueued after
  /// it (which also wait for the stream they are ordered with) start once it is reached.
  void do_order_after(const zt::Event& event) override {
    if (event.native() == nullptr) return;  // a host event: reached already
    const DeviceScope scope(resources_->device, name());
    ZT_CHECK_CUDA_COMM(cudaStreamWaitEvent(stream(), static_cast<cudaEvent_t>(event.native()), 0), name());
  }

 private:
  class Event;

  ncclComm_t comm() const { return resources_->comm; }

  static std::size_t total_of(std::span<const std::size_t> counts) {
    std::size_t total = 0;
    for (std::size_t count : counts) total += count;
    return total;
  }

  /// An operation ordered with a stream that the device has not completed yet: its registration
  /// with the watchdog and its completion event.
  struct PendingOp {
    std::uint64_t token = 0;
    std::shared_ptr<OwnedEvent> done;
  };
  /// ... and for its traffic counters: its kinds (an exchange is a send and a receive, each
  /// counting the group's time) and the events around it on the communicator's stream.
  struct TimedOp {
    std::vector<CommOp> ops;
    std::shared_ptr<OwnedEvent> started;
    std::shared_ptr<OwnedEvent> done;
  };

  /// Enqueue, then wait: on the host (stream synchronize), or, ordered with a stream, on the device
  /// (that stream waits for the operation's end; barrier() still waits on the host). A failure
  /// while waiting also asks NCCL for an asynchronous error (a peer that died, a network
  /// failure), which is the more useful message.
  template <typename Enqueue>
  void blocking(CommOp op, std::size_t payload_bytes, Enqueue&& enqueue) {
    const DeviceScope scope(resources_->device, name());
    const auto start = Clock::now();
    {
      const NcclCalls calls(*this);
      if (ordered_ != nullptr) {
        const std::shared_ptr<OwnedEvent> done = enqueue_ordered(enqueue, {op});
        ZT_CHECK_CUDA_COMM(cudaStreamWaitEvent(ordered_, done->get(), 0), name());
        check_async_error();
        if (op != CommOp::barrier) {
          record(op, payload_bytes, host_seconds_since(start));
          return;
        }
      } else {
        enqueue();
      }
    }  // the host may wait long below: the watchdog's abort must not wait for that
    const cudaError_t error = cudaStreamSynchronize(stream());
    stop_if_aborted();  // an aborted operation's wait may return success with nothing done
    if (error != cudaSuccess) {
      check_async_error();
      raise_cuda(__FILE__, __LINE__,
                 std::string("cudaStreamSynchronize after ") + std::string(comm_op_name(op)), name(), error);
    }
    record(op, payload_bytes, host_seconds_since(start));
  }

  /// The seconds an operation started at `start` counts when it completes on the host: ordered with
  /// a stream, none, as the device's time comes with its completion (settle_traffic).
  double host_seconds_since(Clock::time_point start) const {
    return ordered_ != nullptr ? 0.0 : seconds_since(start);
  }

  template <typename Enqueue>
  Work nonblocking(CommOp op, std::size_t payload_bytes, Enqueue&& enqueue);

  /// Enqueue, then an event the operation's handles wait for (ordered with a stream: the stream's
  /// work so far comes first). `ops`: the registered operations the enqueue runs (an exchange's
  /// send and receive: two). Callers have made the device current and hold NcclCalls.
  template <typename Enqueue>
  std::shared_ptr<OwnedEvent> enqueue_with_event(Enqueue&& enqueue, std::initializer_list<CommOp> ops) {
    if (ordered_ != nullptr) return enqueue_ordered(enqueue, ops);
    auto done = std::make_shared<OwnedEvent>(name());
    enqueue();
    ZT_CHECK_CUDA_COMM(cudaEventRecord(done->get(), stream()), name());
    return done;
  }

  /// Ordered with a stream: the operation starts on the device after the stream's work so far; its
  /// completion event keeps it (each of its `ops`) registered with the watchdog until the device
  /// reaches it, and an event at its start gives its device time.
  template <typename Enqueue>
  std::shared_ptr<OwnedEvent> enqueue_ordered(Enqueue&& enqueue, std::initializer_list<CommOp> ops) {
    retire_completed();  // keeps the list short between the watchdog's ticks
    ZT_CHECK_CUDA_COMM(cudaEventRecord(ordered_reached_->get(), ordered_), name());
    ZT_CHECK_CUDA_COMM(cudaStreamWaitEvent(stream(), ordered_reached_->get(), 0), name());
    auto started = std::make_shared<OwnedEvent>(name(), /*timing=*/true);
    ZT_CHECK_CUDA_COMM(cudaEventRecord(started->get(), stream()), name());
    enqueue();
    auto done = std::make_shared<OwnedEvent>(name(), /*timing=*/true);
    ZT_CHECK_CUDA_COMM(cudaEventRecord(done->get(), stream()), name());
    const std::lock_guard lock(pending_mutex_);
    for (const std::uint64_t token : in_flight_list().begin_device_side(ops.size()))
      pending_.push_back({token, done});
    timed_.push_back({std::vector<CommOp>(ops), std::move(started), done});
    return done;
  }

  /// Finish the registrations of the operations the device has completed, oldest first (one
  /// stream: they complete in order), and take their device time. Callers have made the device
  /// current.
  void retire_completed() const {
    const std::lock_guard lock(pending_mutex_);
    while (!pending_.empty() && query_event(pending_.front().done->get()) == cudaSuccess) {
      in_flight_list().finish(pending_.front().token);
      pending_.pop_front();
    }
    while (!timed_.empty() && query_event(timed_.front().done->get()) == cudaSuccess) {
      float milliseconds = 0.0f;
      if (cudaEventElapsedTime(&milliseconds, timed_.front().started->get(), timed_.front().done->get()) ==
          cudaSuccess) {
        for (const CommOp op : timed_.front().ops)
          device_seconds_[static_cast<std::size_t>(op)] += 1e-3 * milliseconds;
      } else {
        cudaGetLastError();  // the counters go without it; the operation itself completed
      }
      timed_.pop_front();
    }
  }

  /// The device time of the operations completed since the last call, into the counters (on the
  /// thread that reads them; the watchdog's thread may have retired some meanwhile).
  void settle_traffic() const override {
    if (ordered_ == nullptr) return;
    if (!aborted_.load()) {
      const DeviceScope scope(resources_->device, name());
      retire_completed();
    }
    const std::lock_guard lock(pending_mutex_);
    for (std::size_t i = 0; i < kCommOpCount; ++i) {
      if (device_seconds_[i] == 0.0) continue;
      add_late_seconds(static_cast<CommOp>(i), device_seconds_[i]);
      device_seconds_[i] = 0.0;
    }
  }

  /// The watchdog's hook, on its thread: make this communicator's device current there first, so
  /// that the thread never creates a context on another GPU.
  void retire_completed_from_any_thread() {
    if (aborted_.load() || cudaSetDevice(resources_->device) != cudaSuccess) return;
    retire_completed();
  }

  /// The owner thread's NCCL calls (enqueues, error queries) happen under this, so that the
  /// watchdog's ncclCommAbort does not free the communicator in the middle of one; a thread that
  /// reaches the communicator after the abort waits for the job's end instead.
  class NcclCalls {
   public:
    explicit NcclCalls(const NcclCommunicator& comm) : lock_(comm.nccl_calls_) {
      if (comm.aborted_.load()) {
        lock_.unlock();  // the abort may be waiting for it
        comm.wait_for_the_job_to_end();
      }
    }

   private:
    std::unique_lock<std::recursive_timed_mutex> lock_;
  };

  /// The watchdog ends the job: a collective waiting for a late peer would never return. A call in
  /// progress on the owner thread is waited for a while (an enqueue that NCCL blocks in, waiting
  /// for its peers' connections, is what ncclCommAbort exists to end, so not for ever).
  void abort_from_watchdog() {
    if (aborted_.exchange(true)) return;
    std::unique_lock lock(nccl_calls_, std::defer_lock);
    (void)lock.try_lock_for(std::chrono::seconds(2));
    cudaSetDevice(resources_->device);
    ncclCommAbort(resources_->comm);
    std::fprintf(stderr,
                 "zerotrain watchdog: aborted NCCL communicator '%s' (ncclCommAbort) on rank %d of %d\n",
                 name().c_str(), rank(), size());
  }

  /// After the watchdog's abort the job is ending: a thread that reaches this communicator (or
  /// sees its operation fail) waits for the end instead of running on with unfinished results.
  [[noreturn]] void wait_for_the_job_to_end() const {
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }

  /// After the watchdog's abort: never run on with what the aborted operations left (a wait for
  /// them may return success).
  void stop_if_aborted() const {
    if (aborted_.load()) wait_for_the_job_to_end();
  }

  void check_async_error() const {
    const NcclCalls calls(*this);
    ncclResult_t async_error = ncclSuccess;
    if (ncclCommGetAsyncError(comm(), &async_error) == ncclSuccess && async_error != ncclSuccess) {
      raise_nccl(__FILE__, __LINE__, "asynchronous NCCL error", name(), comm(), async_error);
    }
  }

  void enqueue_all_reduce(const void* send, void* recv, std::size_t count, DType type, ReduceOp op) {
    ZT_CHECK_NCCL(ncclAllReduce(send, recv, count, nccl_type(type), nccl_op(op), comm(), stream()), name(),
                  comm());
  }

  /// NCCL's in-place reduce_scatter is recv == send + rank * recv_count; ours is send == recv with the
  /// result at the start. For ours on ranks other than 0 the result goes to stream-ordered scratch
  /// memory first and is copied to the start of the buffer, all on the stream.
  void enqueue_reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType type, ReduceOp op) {
    const std::size_t bytes = recv_count * dtype_size(type);
    if (send != recv || rank() == 0 || bytes == 0) {
      ZT_CHECK_NCCL(ncclReduceScatter(send, recv, recv_count, nccl_type(type), nccl_op(op), comm(), stream()),
                    name(), comm());
      return;
    }
    void* scratch = nullptr;
    ZT_CHECK_CUDA_COMM(cudaMallocAsync(&scratch, bytes, stream()), name());
    const ncclResult_t result =
        ncclReduceScatter(send, scratch, recv_count, nccl_type(type), nccl_op(op), comm(), stream());
    if (result == ncclSuccess) {
      ZT_CHECK_CUDA_COMM(cudaMemcpyAsync(recv, scratch, bytes, cudaMemcpyDeviceToDevice, stream()), name());
    }
    ZT_CHECK_CUDA_COMM(cudaFreeAsync(scratch, stream()), name());
    if (result != ncclSuccess) raise_nccl(__FILE__, __LINE__, "ncclReduceScatter", name(), comm(), result);
  }

  void enqueue_all_gather(const void* send, void* recv, std::size_t send_count, DType type) {
    ZT_CHECK_NCCL(ncclAllGather(send, recv, send_count, nccl_type(type), comm(), stream()), name(), comm());
  }

  /// One broadcast per rank into its place in recv, fused in a group so NCCL runs them together.
  void enqueue_all_gather_v(const void* send, std::size_t, void* recv,
                            std::span<const std::size_t> recv_counts, DType type) {
    const std::size_t element = dtype_size(type);
    ZT_CHECK_NCCL(ncclGroupStart(), name(), comm());
    ncclResult_t result = ncclSuccess;
    std::size_t offset = 0;
    for (int root = 0; root < size() && result == ncclSuccess; ++root) {
      const std::size_t count = recv_counts[static_cast<std::size_t>(root)];
      void* block = at(recv, offset * element);
      if (count > 0) {  // every rank knows every count, so every rank skips alike
        const void* source = root == rank() ? send : block;
        result = ncclBroadcast(source, block, count, nccl_type(type), root, comm(), stream());
      }
      offset += count;
    }
    const ncclResult_t end = ncclGroupEnd();  // always close the group
    if (result != ncclSuccess) raise_nccl(__FILE__, __LINE__, "ncclBroadcast", name(), comm(), result);
    if (end != ncclSuccess) raise_nccl(__FILE__, __LINE__, "ncclGroupEnd", name(), comm(), end);
  }

  void enqueue_broadcast(void* buffer, std::size_t count, DType type, int root) {
    ZT_CHECK_NCCL(ncclBroadcast(buffer, buffer, count, nccl_type(type), root, comm(), stream()), name(),
                  comm());
  }

  /// A send and the matching receive on one rank would be two kernels on one stream, the first
  /// waiting for the second; grouped (isend_irecv) it would work, but a copy is what the caller
  /// wants, and refusing keeps the rule the same for every point-to-point call.
  void check_not_self(CommOp op, int peer) const {
    ZT_CHECK_AS(
        CommError, peer != rank(), comm_op_name(op), " on NCCL communicator '", name(), "' (rank ", rank(),
        " of ", size(), "): peer ", peer,
        " is this rank; the NCCL backend cannot send to or receive from its own rank (copy the buffer "
        "instead)");
  }

  void enqueue_send(const void* buffer, std::size_t count, DType type, int peer) {
    check_not_self(CommOp::send, peer);
    ZT_CHECK_NCCL(ncclSend(buffer, count, nccl_type(type), peer, comm(), stream()), name(), comm());
  }

  void enqueue_recv(void* buffer, std::size_t count, DType type, int peer) {
    check_not_self(CommOp::recv, peer);
    ZT_CHECK_NCCL(ncclRecv(buffer, count, nccl_type(type), peer, comm(), stream()), name(), comm());
  }

  std::unique_ptr<NcclResources> resources_;
  cudaStream_t ordered_ = nullptr;               // the stream operations are ordered with, if any
  std::unique_ptr<OwnedEvent> ordered_reached_;  // its point when an operation is enqueued
  // The owner thread's and the watchdog's (retire_completed), hence mutable: reading the counters
  // (const) retires too.
  mutable std::mutex pending_mutex_;
  mutable std::deque<PendingOp> pending_;
  mutable std::deque<TimedOp> timed_;
  mutable std::array<double, kCommOpCount> device_seconds_{};  // retired, not yet in the counters
  mutable std::recursive_timed_mutex nccl_calls_;              // see NcclCalls
  std::atomic<bool> aborted_{false};
};

/// Completion of a non-blocking NCCL operation: an event recorded on the stream after it. wait()
/// blocks the host on it, or, ordered with a stream, makes that stream wait for it.
class NcclCommunicator::Event final : public Work::State {
 public:
  Event(NcclCommunicator& comm, CommOp op, std::size_t payload_bytes, Clock::time_point start,
        std::shared_ptr<OwnedEvent> done)
      : comm_(comm), op_(op), payload_bytes_(payload_bytes), start_(start), event_(std::move(done)) {}

  void wait() override {
    if (comm_.ordered_ != nullptr) {
      const cudaError_t error = cudaStreamWaitEvent(comm_.ordered_, event_->get(), 0);
      if (error != cudaSuccess) fail(error);
      comm_.check_async_error();
    } else {
      const cudaError_t error = cudaEventSynchronize(event_->get());
      comm_.stop_if_aborted();
      if (error != cudaSuccess) fail(error);
    }
    comm_.record(op_, payload_bytes_, comm_.host_seconds_since(start_));
  }

  bool test() override {
    const cudaError_t error = query_event(event_->get());
    if (error == cudaErrorNotReady) {
      comm_.check_async_error();  // a stuck operation may be a failed one
      return false;
    }
    comm_.stop_if_aborted();
    if (error != cudaSuccess) fail(error);
    comm_.record(op_, payload_bytes_, comm_.host_seconds_since(start_));
    return true;
  }

 private:
  [[noreturn]] void fail(cudaError_t error) const {
    comm_.check_async_error();  // waits for the job's end after the watchdog's abort
    raise_cuda(__FILE__, __LINE__, std::string("waiting for ") + std::string(comm_op_name(op_)), comm_.name(),
               error);
  }

  NcclCommunicator& comm_;
  CommOp op_;
  std::size_t payload_bytes_;
  Clock::time_point start_;
  std::shared_ptr<OwnedEvent> event_;
};

template <typename Enqueue>
Work NcclCommunicator::nonblocking(CommOp op, std::size_t payload_bytes, Enqueue&& enqueue) {
  const DeviceScope scope(resources_->device, name());
  const NcclCalls calls(*this);
  const auto start = Clock::now();
  return Work(std::make_unique<Event>(*this, op, payload_bytes, start, enqueue_with_event(enqueue, {op})));
}

std::pair<Work, Work> NcclCommunicator::do_isend_irecv(const OutgoingMessage& send,
                                                       const IncomingMessage& recv) {
  check_not_self(CommOp::send, send.peer);
  check_not_self(CommOp::recv, recv.peer);
  const DeviceScope scope(resources_->device, name());
  const NcclCalls calls(*this);
  const auto start = Clock::now();
  const std::shared_ptr<OwnedEvent> done = enqueue_with_event(
      [&] {
        ZT_CHECK_NCCL(ncclGroupStart(), name(), comm());
        ncclResult_t result =
            ncclSend(send.buffer, send.count, nccl_type(send.type), send.peer, comm(), stream());
        if (result == ncclSuccess)
          result = ncclRecv(recv.buffer, recv.count, nccl_type(recv.type), recv.peer, comm(), stream());
        const ncclResult_t end = ncclGroupEnd();  // always close the group
        if (result != ncclSuccess)
          raise_nccl(__FILE__, __LINE__, "ncclSend/ncclRecv", name(), comm(), result);
        if (end != ncclSuccess) raise_nccl(__FILE__, __LINE__, "ncclGroupEnd", name(), comm(), end);
      },
      {CommOp::send, CommOp::recv});  // one group: both stay in flight until both are done
  return {
      Work(std::make_unique<Event>(*this, CommOp::send, send.count * dtype_size(send.type), start, done)),
      Work(std::make_unique<Event>(*this, CommOp::recv, recv.count * dtype_size(recv.type), start, done))};
}

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap_mpi, Device cuda_device,
                                                     std::string name, const Stream* ordered_with) {
  ZT_CHECK_AS(CommError, bootstrap_mpi.backend() == CommBackend::mpi, "make_nccl_communicator('", name,
              "'): the bootstrap communicator '", bootstrap_mpi.name(), "' uses the ",
              comm_backend_name(bootstrap_mpi.backend()), " backend; expected an MPI communicator");
  ZT_CHECK_AS(CommError, cuda_device.is_cuda(), "make_nccl_communicator('", name, "'): device ",
              cuda_device.str(), " is not a CUDA device");
  ZT_CHECK_AS(
      CommError,
      ordered_with == nullptr || (ordered_with->device() == cuda_device && ordered_with->native() != nullptr),
      "make_nccl_communicator('", name, "'): the stream to order with is on ",
      ordered_with != nullptr ? ordered_with->device().str() : std::string(),
      "; expected a stream of its own on ", cuda_device.str(), " (not the legacy default stream)");
  const CudaStatus& status = cuda_status();
  ZT_CHECK_AS(CommError, status.usable(), "make_nccl_communicator('", name, "') on rank ",
              bootstrap_mpi.rank(), ": no usable CUDA device (", status.reason, ")");
  ZT_CHECK_AS(CommError, cuda_device.index >= 0 && cuda_device.index < status.device_count,
              "make_nccl_communicator('", name, "') on rank ", bootstrap_mpi.rank(), ": ", cuda_device.str(),
              " does not exist; this process sees ", status.device_count, " device(s)");

  // Rank 0 makes the id; a failure there is broadcast too, so that no rank waits forever.
  struct Bootstrap {
    std::int32_t ok = 0;
    ncclUniqueId id{};
  };
  static_assert(sizeof(Bootstrap) % sizeof(std::int32_t) == 0);
  Bootstrap bootstrap;
  std::string root_error;
  if (bootstrap_mpi.rank() == 0) {
    const ncclResult_t result = ncclGetUniqueId(&bootstrap.id);
    bootstrap.ok = result == ncclSuccess ? 1 : 0;
    if (result != ncclSuccess) root_error = ncclGetErrorString(result);
  }
  bootstrap_mpi.broadcast(&bootstrap, sizeof(Bootstrap) / sizeof(std::int32_t), DType::int32, 0);
  ZT_CHECK_AS(CommError, bootstrap.ok == 1, "make_nccl_communicator('", name,
              "'): ncclGetUniqueId failed on rank 0", root_error.empty() ? std::string() : ": " + root_error);

  auto resources = std::make_unique<NcclResources>();
  resources->device = cuda_device.index;
  const DeviceScope scope(cuda_device.index, name);
  ZT_CHECK_NCCL(ncclCommInitRank(&resources->comm, bootstrap_mpi.size(), bootstrap.id, bootstrap_mpi.rank()),
                name, nullptr);
  ZT_CHECK_CUDA_COMM(cudaStreamCreateWithFlags(&resources->stream, cudaStreamNonBlocking), name);
  ZT_CHECK_CUDA_COMM(cudaMalloc(&resources->scalar, sizeof(std::int32_t)), name);
  ZT_CHECK_CUDA_COMM(cudaMemsetAsync(resources->scalar, 0, sizeof(std::int32_t), resources->stream), name);
  // Same members as the bootstrap communicator, so the watchdog asks them about a hang here.
  detail::CommIdentity identity = detail::agree_comm_identity(native_mpi_comm(bootstrap_mpi), name);
  return std::make_unique<NcclCommunicator>(
      std::move(resources), bootstrap_mpi.rank(), bootstrap_mpi.size(), std::move(name), std::move(identity),
      ordered_with != nullptr ? static_cast<cudaStream_t>(ordered_with->native()) : nullptr);
}

void* nccl_stream(const Communicator& communicator) {
  const auto* nccl = dynamic_cast<const NcclCommunicator*>(&communicator);
  ZT_CHECK_AS(CommError, nccl != nullptr, "nccl_stream: communicator '", communicator.name(), "' uses the ",
              comm_backend_name(communicator.backend()), " backend; expected a NCCL communicator");
  return nccl->stream();
}

}  // namespace zt
