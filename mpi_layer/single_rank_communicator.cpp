// make_single_rank_communicator (include/zerotrain/communicator.hpp): the device communicator of a
// group of one rank. Every collective of one rank is the identity, so it is a copy on the stream the
// group's work is ordered with; a NCCL communicator of one rank would do the same copy and hold
// NCCL's buffers, a proxy thread and an initialization for it.
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "mpi_layer/device_buffers.hpp"
#include "zerotrain/communicator.hpp"
#include "zerotrain/device.hpp"
#include "zerotrain/error.hpp"

namespace zt {
namespace {

class SingleRankCommunicator final : public Communicator {
 public:
  SingleRankCommunicator(Device device, std::string name, const Stream& ordered_with)
      : Communicator(0, 1, std::move(name)), device_(device), stream_(ordered_with) {}

  CommBackend backend() const override { return CommBackend::local; }
  Device device() const override { return device_; }

 protected:
  void do_all_reduce(const void* send, void* recv, std::size_t count, DType type, ReduceOp) override {
    copy(CommOp::all_reduce, recv, send, count, type);
  }
  void do_reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType type,
                         ReduceOp) override {
    copy(CommOp::reduce_scatter, recv, send, recv_count, type);
  }
  void do_all_gather(const void* send, void* recv, std::size_t send_count, DType type) override {
    copy(CommOp::all_gather, recv, send, send_count, type);
  }
  void do_all_gather_v(const void* send, std::size_t send_count, void* recv, std::span<const std::size_t>,
                       DType type) override {
    copy(CommOp::all_gather_v, recv, send, send_count, type);
  }
  void do_broadcast(void* buffer, std::size_t count, DType type, int) override {
    check_on_device(CommOp::broadcast, {buffer}, count);
    record(CommOp::broadcast, count * dtype_size(type), 0.0);
  }
  void do_send(const void*, std::size_t, DType, int, int) override { refuse_point_to_point(CommOp::send); }
  void do_recv(void*, std::size_t, DType, int, int) override { refuse_point_to_point(CommOp::recv); }
  void do_barrier() override {
    stream_.synchronize();
    record(CommOp::barrier, 0, 0.0);
  }

  Work do_iall_reduce(const void* send, void* recv, std::size_t count, DType type, ReduceOp op) override {
    do_all_reduce(send, recv, count, type, op);
    return Work();
  }
  Work do_ireduce_scatter(const void* send, void* recv, std::size_t recv_count, DType type,
                          ReduceOp op) override {
    do_reduce_scatter(send, recv, recv_count, type, op);
    return Work();
  }
  Work do_iall_gather(const void* send, void* recv, std::size_t send_count, DType type) override {
    do_all_gather(send, recv, send_count, type);
    return Work();
  }
  Work do_iall_gather_v(const void* send, std::size_t send_count, void* recv,
                        std::span<const std::size_t> recv_counts, DType type) override {
    do_all_gather_v(send, send_count, recv, recv_counts, type);
    return Work();
  }
  Work do_ibroadcast(void* buffer, std::size_t count, DType type, int root) override {
    do_broadcast(buffer, count, type, root);
    return Work();
  }
  Work do_isend(const void*, std::size_t, DType, int, int) override { refuse_point_to_point(CommOp::send); }
  Work do_irecv(void*, std::size_t, DType, int, int) override { refuse_point_to_point(CommOp::recv); }
  std::pair<Work, Work> do_isend_irecv(const OutgoingMessage&, const IncomingMessage&) override {
    refuse_point_to_point(CommOp::send);
  }
  /// Its copies run on the stream it is ordered with: that stream waits (on the device).
  void do_order_after(const Event& event) override { stream_.wait(event); }

 private:
  /// The one rank's block: `count` elements from `send` to `recv` (nothing in place).
  void copy(CommOp op, void* recv, const void* send, std::size_t count, DType type) {
    check_on_device(op, {send, recv}, count);
    const std::size_t bytes = count * dtype_size(type);
    if (send != recv && bytes > 0) copy_bytes(recv, device_, send, device_, bytes, &stream_);
    record(op, bytes, 0.0);
  }

  void check_on_device(CommOp op, std::initializer_list<const void*> buffers, std::size_t count) const {
    detail::check_device_buffers(*this, op, buffers, count);
  }

  [[noreturn]] void refuse_point_to_point(CommOp op) const {
    ZT_THROW_AS(CommError, comm_op_name(op), " on communicator '", name(),
                "' (rank 0 of 1): peer 0 is this rank; a device communicator (", device_.str(),
                ") cannot send to or receive from its own rank (copy the buffer instead)");
  }

  Device device_;
  const Stream& stream_;
};

}  // namespace

std::unique_ptr<Communicator> make_single_rank_communicator(Device device, std::string name,
                                                            const Stream& ordered_with) {
  ZT_CHECK_AS(CommError, !device.is_host(), "make_single_rank_communicator('", name,
              "'): device host; on the host a group of one rank uses its MPI communicator");
  ZT_CHECK_AS(CommError, ordered_with.device() == device, "make_single_rank_communicator('", name,
              "'): the stream to order with is on ", ordered_with.device().str(), ", not on ", device.str());
  return std::make_unique<SingleRankCommunicator>(device, std::move(name), ordered_with);
}

}  // namespace zt
