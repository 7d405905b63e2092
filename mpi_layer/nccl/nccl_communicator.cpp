// The NCCL backend of zt::Communicator (built only with CUDA). See nccl_communicator.hpp for how
// its semantics differ from the MPI backend.
#include "zerotrain/nccl_communicator.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <utility>
#include <vector>

#include "base/seconds_since.hpp"
#include "mpi_layer/watchdog.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/mpi_communicator.hpp"

namespace zt {
namespace {

using base::Clock;
using base::seconds_since;

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
  ncclComm_t comm = nullptr;
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
  explicit OwnedEvent(std::string_view communicator) {
    ZT_CHECK_CUDA_COMM(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), communicator);
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
                   detail::CommIdentity identity)
      : Communicator(rank, size, std::move(name), std::move(identity)), resources_(std::move(resources)) {}

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
  void do_barrier() override {
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

 private:
  class Event;

  ncclComm_t comm() const { return resources_->comm; }

  static std::size_t total_of(std::span<const std::size_t> counts) {
    std::size_t total = 0;
    for (std::size_t count : counts) total += count;
    return total;
  }

  /// Enqueue, wait for the stream, record. A failure while waiting also asks NCCL for an
  /// asynchronous error (a peer that died, a network failure), which is the more useful message.
  template <typename Enqueue>
  void blocking(CommOp op, std::size_t payload_bytes, Enqueue&& enqueue) {
    const DeviceScope scope(resources_->device, name());
    const auto start = Clock::now();
    enqueue();
    const cudaError_t error = cudaStreamSynchronize(stream());
    if (error != cudaSuccess) {
      check_async_error();
      raise_cuda(__FILE__, __LINE__,
                 std::string("cudaStreamSynchronize after ") + std::string(comm_op_name(op)), name(), error);
    }
    record(op, payload_bytes, seconds_since(start));
  }

  template <typename Enqueue>
  Work nonblocking(CommOp op, std::size_t payload_bytes, Enqueue&& enqueue);

  void check_async_error() const {
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
  /// waiting for the second: NCCL needs them grouped, which this interface cannot express.
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
};

/// Completion of a non-blocking NCCL operation: an event recorded on the stream after it.
class NcclCommunicator::Event final : public Work::State {
 public:
  Event(NcclCommunicator& comm, CommOp op, std::size_t payload_bytes, Clock::time_point start)
      : comm_(comm), op_(op), payload_bytes_(payload_bytes), start_(start), event_(comm.name()) {}

  void record_on_stream() { ZT_CHECK_CUDA_COMM(cudaEventRecord(event_.get(), comm_.stream()), comm_.name()); }

  void wait() override {
    const cudaError_t error = cudaEventSynchronize(event_.get());
    if (error != cudaSuccess) fail(error);
    comm_.record(op_, payload_bytes_, seconds_since(start_));
  }

  bool test() override {
    const cudaError_t error = cudaEventQuery(event_.get());
    if (error == cudaErrorNotReady) {
      comm_.check_async_error();  // a stuck operation may be a failed one
      return false;
    }
    if (error != cudaSuccess) fail(error);
    comm_.record(op_, payload_bytes_, seconds_since(start_));
    return true;
  }

 private:
  [[noreturn]] void fail(cudaError_t error) const {
    comm_.check_async_error();
    raise_cuda(__FILE__, __LINE__, std::string("waiting for ") + std::string(comm_op_name(op_)), comm_.name(),
               error);
  }

  NcclCommunicator& comm_;
  CommOp op_;
  std::size_t payload_bytes_;
  Clock::time_point start_;
  OwnedEvent event_;
};

template <typename Enqueue>
Work NcclCommunicator::nonblocking(CommOp op, std::size_t payload_bytes, Enqueue&& enqueue) {
  const DeviceScope scope(resources_->device, name());
  auto event = std::make_unique<Event>(*this, op, payload_bytes, Clock::now());
  enqueue();
  event->record_on_stream();
  return Work(std::move(event));
}

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap_mpi, Device cuda_device,
                                                     std::string name) {
  ZT_CHECK_AS(CommError, bootstrap_mpi.backend() == CommBackend::mpi, "make_nccl_communicator('", name,
              "'): the bootstrap communicator '", bootstrap_mpi.name(), "' uses the ",
              comm_backend_name(bootstrap_mpi.backend()), " backend; expected an MPI communicator");
  ZT_CHECK_AS(CommError, cuda_device.is_cuda(), "make_nccl_communicator('", name, "'): device ",
              cuda_device.str(), " is not a CUDA device");
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
  return std::make_unique<NcclCommunicator>(std::move(resources), bootstrap_mpi.rank(), bootstrap_mpi.size(),
                                            std::move(name), std::move(identity));
}

void* nccl_stream(const Communicator& communicator) {
  const auto* nccl = dynamic_cast<const NcclCommunicator*>(&communicator);
  ZT_CHECK_AS(CommError, nccl != nullptr, "nccl_stream: communicator '", communicator.name(), "' uses the ",
              comm_backend_name(communicator.backend()), " backend; expected a NCCL communicator");
  return nccl->stream();
}

}  // namespace zt
