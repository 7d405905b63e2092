// The NCCL communicator: every collective x dtype x op, blocking and non-blocking, on cudaMalloc'd
// buffers, against the same references as the MPI tests (collective_reference.hpp).
//
// They run when every rank has a usable GPU of its own (NCCL refuses two ranks on one device);
// otherwise every rank skips, visibly, with the reason. Skipping is decided collectively so that no
// rank waits in a collective that the others skipped.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "collective_reference.hpp"
#include "gpu_per_rank.hpp"
#include "mpi_layer/op_tracker.hpp"
#include "mpi_test_main.hpp"
#include "zerotrain/build_info.hpp"
#include "zerotrain/device.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/execution.hpp"
#include "zerotrain/mpi_communicator.hpp"
#include "zerotrain/nccl_communicator.hpp"

namespace {

using namespace zt::testing;  // NOLINT: the shared test vocabulary
using zt::DType;
using zt::ReduceOp;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

/// The device of this rank: one per local rank.
zt::Device my_device() {
  return zt::testing::gpu_of_this_rank();
}

/// A device copy of host values, and back.
class DeviceValues {
 public:
  explicit DeviceValues(const Values& host)
      : type_(host.type()),
        count_(host.size()),
        buffer_(my_device(), std::max<std::size_t>(1, host.size() * zt::dtype_size(host.type()))) {
    zt::copy_bytes(buffer_.data(), buffer_.device(), host.bytes(), zt::Device::host(), bytes());
  }
  void* data() { return buffer_.data(); }
  std::byte* at(std::size_t index) {
    return static_cast<std::byte*>(buffer_.data()) + index * zt::dtype_size(type_);
  }
  std::size_t bytes() const { return count_ * zt::dtype_size(type_); }
  Values to_host() {
    Values host(type_, count_);
    zt::copy_bytes(host.bytes(), zt::Device::host(), buffer_.data(), buffer_.device(), bytes());
    return host;
  }

 private:
  DType type_;
  std::size_t count_;
  zt::Buffer buffer_;
};

bool power_of_two(int n) {
  return n > 0 && (n & (n - 1)) == 0;
}

/// The reference, but NCCL's float avg multiplies by 1/n before summing: exact for these inputs when
/// n is a power of two; otherwise within a few units in the last place, which we allow.
::testing::AssertionResult reduction_matches(const Values& got, std::size_t offset, std::size_t count,
                                             DType type, ReduceOp op, int ranks, std::size_t first_index) {
  if (op != ReduceOp::avg || !zt::dtype_is_floating(type) || power_of_two(ranks)) {
    return matches(got, offset, count, [&](std::size_t i) {
      return reference_reduction(type, op, ranks,
                                 [&](int r) { return input_value(type, r, first_index + i); });
    });
  }
  const double unit = type == DType::bf16   ? 0x1.0p-8
                      : type == DType::fp16 ? 0x1.0p-11
                      : type == DType::fp32 ? 0x1.0p-24
                                            : 0x1.0p-53;
  for (std::size_t i = 0; i < count; ++i) {
    const double want =
        reference_reduction(type, op, ranks, [&](int r) { return input_value(type, r, first_index + i); });
    if (std::abs(got.get(offset + i) - want) > 4 * unit * (std::abs(want) + 1)) {
      return ::testing::AssertionFailure()
             << "element " << i << ": got " << got.get(offset + i) << ", expected " << want;
    }
  }
  return ::testing::AssertionSuccess();
}

const std::vector<std::size_t> kSizes = {0, 1, 7, 1000, 100003};

class Nccl : public ::testing::Test {
 protected:
  void SetUp() override {
    ZT_SKIP_WITHOUT_GPU_PER_RANK();
    mpi_ = zt::make_mpi_communicator(MPI_COMM_WORLD, "nccl-bootstrap");
    nccl_ = zt::make_nccl_communicator(*mpi_, my_device(), "nccl");
  }
  void TearDown() override {
    nccl_.reset();
    mpi_.reset();
  }

  /// Run one operation blocking or non-blocking (then wait; every other one by polling).
  template <typename Blocking, typename NonBlocking>
  void run(bool nonblocking, Blocking&& blocking, NonBlocking&& start) {
    if (!nonblocking) {
      blocking();
      return;
    }
    zt::Work work = start();
    if (++polls_ % 2 == 0) {
      while (!work.test()) {
      }
    } else {
      work.wait();
    }
  }

  std::unique_ptr<zt::Communicator> mpi_;
  std::unique_ptr<zt::Communicator> nccl_;
  int polls_ = 0;
};

TEST(NcclAvailability, MissingGpuOrCudaIsAClearError) {
  auto mpi = zt::make_mpi_communicator(MPI_COMM_WORLD, "nccl-bootstrap");
  if (zt::build_info::have_cuda && zt::cuda_status().usable()) GTEST_SKIP() << "a GPU is usable here";
  // Fails on every rank before any communication, so it is safe to call collectively.
  try {
    auto nccl = zt::make_nccl_communicator(*mpi, zt::Device::cuda(0), "nccl");
    ADD_FAILURE() << "expected zt::CommError";
  } catch (const zt::CommError& error) {
    const std::string message = error.what();
    EXPECT_TRUE(contains(message, "make_nccl_communicator('nccl')")) << message;
    EXPECT_TRUE(contains(message, zt::build_info::have_cuda ? "no usable CUDA device" : "built without CUDA"))
        << message;
  }
}

TEST_F(Nccl, AllReduce) {
  const int n = nccl_->size();
  for (DType type : zt::kAllDTypes) {
    for (ReduceOp op : kAllOps) {
      for (std::size_t count : kSizes) {
        for (bool nonblocking : {false, true}) {
          for (bool in_place : {false, true}) {
            SCOPED_TRACE(
                describe(*nccl_, "all_reduce", type, count, nonblocking, in_place, zt::reduce_op_name(op)));
            DeviceValues send(input_values(type, count, nccl_->rank()));
            DeviceValues recv(filled_values(type, count, 99));
            void* out = in_place ? send.data() : recv.data();
            run(
                nonblocking, [&] { nccl_->all_reduce(send.data(), out, count, type, op); },
                [&] { return nccl_->iall_reduce(send.data(), out, count, type, op); });
            const Values got = in_place ? send.to_host() : recv.to_host();
            EXPECT_TRUE(reduction_matches(got, 0, count, type, op, n, 0));
          }
        }
      }
    }
  }
}

TEST_F(Nccl, ReduceScatter) {
  const int n = nccl_->size();
  const int rank = nccl_->rank();
  for (DType type : zt::kAllDTypes) {
    for (ReduceOp op : kAllOps) {
      for (std::size_t recv_count : {0, 1, 7, 1000, 25001}) {
        for (bool nonblocking : {false, true}) {
          for (bool in_place : {false, true}) {
            SCOPED_TRACE(describe(*nccl_, "reduce_scatter", type, recv_count, nonblocking, in_place,
                                  zt::reduce_op_name(op)));
            DeviceValues send(input_values(type, recv_count * static_cast<std::size_t>(n), rank));
            DeviceValues recv(filled_values(type, recv_count, 99));
            void* out = in_place ? send.data() : recv.data();
            run(
                nonblocking, [&] { nccl_->reduce_scatter(send.data(), out, recv_count, type, op); },
                [&] { return nccl_->ireduce_scatter(send.data(), out, recv_count, type, op); });
            const Values got = in_place ? send.to_host() : recv.to_host();
            EXPECT_TRUE(reduction_matches(got, 0, recv_count, type, op, n,
                                          static_cast<std::size_t>(rank) * recv_count));
          }
        }
      }
    }
  }
}

TEST_F(Nccl, AllGatherAndAllGatherV) {
  const int n = nccl_->size();
  const auto rank = static_cast<std::size_t>(nccl_->rank());
  for (DType type : zt::kAllDTypes) {
    for (std::size_t base : {0, 1, 7, 1000, 25001}) {
      for (bool variable : {false, true}) {
        const std::vector<std::size_t> counts =
            variable ? uneven_counts(base, n) : std::vector<std::size_t>(static_cast<std::size_t>(n), base);
        std::size_t total = 0;
        std::size_t my_offset = 0;
        for (std::size_t r = 0; r < counts.size(); ++r) {
          if (r == rank) my_offset = total;
          total += counts[r];
        }
        for (bool nonblocking : {false, true}) {
          for (bool in_place : {false, true}) {
            SCOPED_TRACE(describe(*nccl_, variable ? "all_gather_v" : "all_gather", type, base, nonblocking,
                                  in_place));
            Values initial = filled_values(type, total, 99);
            for (std::size_t i = 0; i < counts[rank]; ++i)
              initial.set(my_offset + i, input_value(type, nccl_->rank(), i));
            DeviceValues send(input_values(type, counts[rank], nccl_->rank()));
            DeviceValues recv(initial);
            const void* source = in_place ? static_cast<const void*>(recv.at(my_offset)) : send.data();
            run(
                nonblocking,
                [&] {
                  if (variable) {
                    nccl_->all_gather_v(source, counts[rank], recv.data(), counts, type);
                  } else {
                    nccl_->all_gather(source, recv.data(), counts[rank], type);
                  }
                },
                [&] {
                  return variable ? nccl_->iall_gather_v(source, counts[rank], recv.data(), counts, type)
                                  : nccl_->iall_gather(source, recv.data(), counts[rank], type);
                });
            EXPECT_TRUE(blocks_match(recv.to_host(), counts));
          }
        }
      }
    }
  }
}

TEST_F(Nccl, BroadcastFromEveryRoot) {
  for (DType type : zt::kAllDTypes) {
    for (std::size_t count : kSizes) {
      for (int root = nccl_->size() - 1; root >= 0; --root) {
        for (bool nonblocking : {false, true}) {
          SCOPED_TRACE(
              describe(*nccl_, "broadcast", type, count, nonblocking, false, "root " + std::to_string(root)));
          DeviceValues buffer(nccl_->rank() == root ? input_values(type, count, root)
                                                    : filled_values(type, count, 99));
          run(
              nonblocking, [&] { nccl_->broadcast(buffer.data(), count, type, root); },
              [&] { return nccl_->ibroadcast(buffer.data(), count, type, root); });
          EXPECT_TRUE(
              matches(buffer.to_host(), 0, count, [&](std::size_t i) { return input_value(type, root, i); }));
        }
      }
    }
  }
}

TEST_F(Nccl, SendRecvRing) {
  const int n = nccl_->size();
  const int rank = nccl_->rank();
  DeviceValues dummy(filled_values(DType::fp32, 1, 0));
  try {  // with oneself: refused on every rank, before any communication
    nccl_->send(dummy.data(), 1, DType::fp32, rank);
    ADD_FAILURE() << "expected zt::CommError for a send to oneself";
  } catch (const zt::CommError& error) {
    EXPECT_TRUE(contains(error.what(), "cannot send to or receive from its own rank")) << error.what();
  }
  if (n == 1) GTEST_SKIP() << "a ring needs 2 or more ranks (NCCL send/recv with oneself is refused)";
  const int next = (rank + 1) % n;
  const int previous = (rank + n - 1) % n;
  for (DType type : zt::kAllDTypes) {
    for (std::size_t count : kSizes) {
      for (bool nonblocking : {false, true}) {
        SCOPED_TRACE(describe(*nccl_, "send/recv ring", type, count, nonblocking, false));
        DeviceValues out(input_values(type, count, rank));
        DeviceValues in(filled_values(type, count, 99));
        // Operations run in posting order on the stream: even ranks send first, odd ranks receive
        // first, so every receive has its send coming.
        auto send = [&] {
          if (nonblocking) {
            nccl_->isend(out.data(), count, type, next).wait();
          } else {
            nccl_->send(out.data(), count, type, next);
          }
        };
        auto receive = [&] {
          if (nonblocking) {
            nccl_->irecv(in.data(), count, type, previous).wait();
          } else {
            nccl_->recv(in.data(), count, type, previous);
          }
        };
        exchange_in_ring_order(rank, send, receive);
        EXPECT_TRUE(
            matches(in.to_host(), 0, count, [&](std::size_t i) { return input_value(type, previous, i); }));
      }
    }
  }
}

TEST_F(Nccl, ExchangesInOneGroup) {
  // isend_irecv is one NCCL group: every rank sends to the next and receives from the previous at
  // once (separate send and recv on one stream would deadlock), then neighbours swap.
  const int n = nccl_->size();
  const int rank = nccl_->rank();
  if (n == 1) GTEST_SKIP() << "an exchange needs 2 or more ranks (NCCL send/recv with oneself is refused)";
  const int next = (rank + 1) % n, previous = (rank + n - 1) % n;
  for (DType type : zt::kAllDTypes) {
    for (std::size_t count : kSizes) {
      for (bool swap_with_partner : {false, true}) {
        if (swap_with_partner && n % 2 != 0) continue;
        const int to = swap_with_partner ? (rank ^ 1) : next,
                  from = swap_with_partner ? (rank ^ 1) : previous;
        SCOPED_TRACE(describe(*nccl_, swap_with_partner ? "isend_irecv pair" : "isend_irecv ring", type,
                              count, true, false));
        DeviceValues out(input_values(type, count, rank));
        DeviceValues in(filled_values(type, count, 99));
        run(
            true, [] {},
            [&] {
              return nccl_->isend_irecv({out.data(), count, type, to, 0}, {in.data(), count, type, from, 0});
            });
        EXPECT_TRUE(
            matches(in.to_host(), 0, count, [&](std::size_t i) { return input_value(type, from, i); }));
      }
    }
  }
}

TEST_F(Nccl, BarrierAndTraffic) {
  nccl_->barrier();
  EXPECT_EQ(nccl_->traffic()[zt::CommOp::barrier].calls, 1u);
  EXPECT_EQ(nccl_->backend(), zt::CommBackend::nccl);
  EXPECT_EQ(nccl_->device(), my_device());
  EXPECT_NE(zt::nccl_stream(*nccl_), nullptr);
  DeviceValues data(input_values(DType::fp32, 1000, nccl_->rank()));
  nccl_->all_reduce(data.data(), data.data(), 1000, DType::fp32, ReduceOp::sum);
  const auto n = static_cast<std::uint64_t>(nccl_->size());
  EXPECT_EQ(nccl_->traffic()[zt::CommOp::all_reduce].bytes, 4000u);
  EXPECT_EQ(nccl_->traffic()[zt::CommOp::all_reduce].wire_bytes, 4000u * 2 * (n - 1) / n);
}

/// Ordered with a stream (as the engine's device communicators are): the collectives wait on the
/// device for the copies queued on that stream before them, and that stream's later work waits
/// for them; the host waits only when it copies the results back. The results equal the MPI
/// backend's, and every operation leaves the watchdog's list once the device has completed it.
TEST_F(Nccl, OrderedWithAStreamWithoutHostWaits) {
  const zt::Stream compute(my_device());
  auto ordered = zt::make_nccl_communicator(*mpi_, my_device(), "nccl ordered", &compute);
  const int n = ordered->size();
  const int r = ordered->rank();
  for (DType type : {DType::fp32, DType::bf16}) {
    SCOPED_TRACE(std::string(zt::dtype_name(type)));
    const std::size_t count = 100003;
    const Values input = input_values(type, count, r);
    // Through the compute stream only: the copy in, the sum, the gather, the copy out.
    zt::Buffer values(my_device(), count * zt::dtype_size(type));
    zt::copy_bytes(values.data(), my_device(), input.bytes(), zt::Device::host(),
                   input.size() * zt::dtype_size(type), &compute);
    ordered->all_reduce(values.data(), values.data(), count, type, ReduceOp::sum);
    const std::size_t piece = 1001;
    zt::Buffer gathered(my_device(), piece * static_cast<std::size_t>(n) * zt::dtype_size(type));
    zt::Work gather = ordered->iall_gather(values.data(), gathered.data(), piece, type);
    gather.wait();
    Values summed(type, count);
    Values all(type, piece * static_cast<std::size_t>(n));
    zt::copy_bytes(summed.bytes(), zt::Device::host(), values.data(), my_device(),
                   count * zt::dtype_size(type), &compute);
    zt::copy_bytes(all.bytes(), zt::Device::host(), gathered.data(), my_device(),
                   all.size() * zt::dtype_size(type), &compute);
    compute.synchronize();
    EXPECT_TRUE(reduction_matches(summed, 0, count, type, ReduceOp::sum, n, 0));
    for (int q = 0; q < n; ++q) {
      EXPECT_TRUE(matches(all, static_cast<std::size_t>(q) * piece, piece,
                          [&](std::size_t i) {
                            return summed.get(i);  // every rank's first piece of the sum is the same
                          }))
          << "piece of rank " << q;
    }
  }
  EXPECT_EQ(ordered->traffic()[zt::CommOp::all_reduce].calls, 2u);
  EXPECT_EQ(ordered->traffic()[zt::CommOp::all_gather].calls, 2u);
  // The device has completed everything (the stream was synchronized): once the watchdog's hook
  // retires them, nothing is in flight and every collective counts as completed.
  std::shared_ptr<zt::detail::OpTracker> tracker;
  for (auto& live : zt::detail::live_trackers()) {
    if (live->name() == "nccl ordered") tracker = live;
  }
  ASSERT_NE(tracker, nullptr);
  tracker->retire_device_work();
  const auto snapshot = tracker->snapshot();
  EXPECT_TRUE(snapshot.in_flight.empty());
  EXPECT_EQ(snapshot.collectives_completed, 4u);
  ordered->barrier();  // the host waits here, ordered or not
}

/// Ordered with a stream, an operation's seconds in traffic() are the device's (its events' elapsed
/// time), counted once the device has completed it: rank 0, whose peers join 0.3 s late, spends that
/// time in its all_reduce on the device, though its host only enqueued it.
TEST_F(Nccl, OrderedOperationsCountTheDevicesTime) {
  const zt::Stream compute(my_device());
  auto ordered = zt::make_nccl_communicator(*mpi_, my_device(), "nccl timed", &compute);
  const std::size_t count = 1000;
  zt::Buffer values(my_device(), count * sizeof(float));
  zt::zero_bytes(values.data(), my_device(), values.size(), &compute);
  ordered->all_reduce(values.data(), values.data(), count, DType::fp32, ReduceOp::sum);  // connects
  compute.synchronize();
  ordered->reset_traffic();
  mpi_->barrier();
  const bool waits_for_late_peers = ordered->rank() == 0 && ordered->size() > 1;
  if (ordered->rank() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ordered->all_reduce(values.data(), values.data(), count, DType::fp32, ReduceOp::sum);
  compute.synchronize();
  const zt::TrafficCounter counter = ordered->traffic()[zt::CommOp::all_reduce];
  EXPECT_EQ(counter.calls, 1u);
  EXPECT_GE(counter.seconds, 0.0);
  if (waits_for_late_peers) EXPECT_GT(counter.seconds, 0.2) << "the device waited about 0.3 s";
  EXPECT_LT(counter.seconds, 30.0);
  // An exchange counts its group's time for its send and its receive.
  if (ordered->size() > 1) {
    zt::Buffer incoming(my_device(), count * sizeof(float));
    const int next = (ordered->rank() + 1) % ordered->size();
    const int previous = (ordered->rank() + ordered->size() - 1) % ordered->size();
    ordered
        ->isend_irecv({values.data(), count, DType::fp32, next, 0},
                      {incoming.data(), count, DType::fp32, previous, 0})
        .wait();
    compute.synchronize();
    EXPECT_EQ(ordered->traffic()[zt::CommOp::send].calls, 1u);
    EXPECT_EQ(ordered->traffic()[zt::CommOp::send].seconds, ordered->traffic()[zt::CommOp::recv].seconds);
  }
}

/// order_after: a collective waits on the device for a copy on another stream (the engine's NVMe
/// parameter gathers: the host-to-device copy on the transfer stream, the all-gather after it),
/// while the stream the communicator is ordered with does not. A 256 MiB copy from pinned memory
/// takes milliseconds; without the wait the collective (out of place, so that even one rank copies)
/// would read the buffer's zeros long before it is done.
TEST_F(Nccl, OrderAfterWaitsForAnotherStreamsCopy) {
  const zt::ExecutionContext context(my_device());
  auto ordered = zt::make_nccl_communicator(*mpi_, my_device(), "nccl after transfers", &context.compute());
  const int n = ordered->size();
  const int r = ordered->rank();
  const std::size_t count = std::size_t{64} << 20;
  const std::size_t bytes = count * sizeof(float);
  zt::Buffer pinned = context.allocate_pinned_host(bytes);
  std::fill_n(pinned.as<float>(), count, static_cast<float>(r + 1));
  zt::Tensor values = context.zeros({static_cast<std::int64_t>(count)}, DType::fp32);
  zt::Tensor sums = context.zeros({static_cast<std::int64_t>(count)}, DType::fp32);
  context.synchronize();  // both zero before the copy starts
  context.from_host_async(values.raw_data(), pinned.data(), bytes);
  ordered->order_after(context.transfers_queued());
  ordered->all_reduce(values.raw_data(), sums.raw_data(), count, DType::fp32, ReduceOp::sum);
  std::vector<float> got(count);
  context.to_host(got.data(), sums.raw_data(), bytes);  // the compute stream waited for the sum
  const auto want = static_cast<float>(n * (n + 1) / 2);
  const auto wrong = std::count_if(got.begin(), got.end(), [&](float value) { return value != want; });
  EXPECT_EQ(wrong, 0) << "of " << count << " sums, expected " << want << " each; element 0 is " << got[0]
                      << ", the last " << got.back();
  context.synchronize();
  // A host event needs no wait; another device's event is refused.
  EXPECT_NO_THROW(ordered->order_after(zt::Event()));
  const zt::Event emulated(zt::Device::emulated());
  EXPECT_THROW(ordered->order_after(emulated), zt::CommError);
}

}  // namespace
