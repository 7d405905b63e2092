// The emulated device's communicator (make_emulated_device_communicator) at 1, 2 and 4 ranks.
//
// Every collective runs twice on the same inputs: on the host MPI communicator with host buffers
// and on the emulated-device communicator with copies of them in emulated memory (which faults if
// anything touches it outside the device API). The results must be the same bytes, blocking and
// non-blocking, in place and not, and through the chunked large-count paths. A non-blocking form's
// result lands on the communicator's own stream, seen by the ordering stream only once its Work is
// waited for, and a write into its buffers while it is in flight is an error; traffic and sequence numbers
// count as on the host; and point-to-point follows the device backend's rules (ordered ring, no send to
// itself).
//
// Checks inside loops use EXPECT (never ASSERT) so that all ranks keep making the same calls.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "collective_reference.hpp"
#include "kernels/emulated_device.hpp"
#include "mpi_layer/mpi_communicator_testing.hpp"
#include "test_helpers.hpp"
#include "zerotrain/communicator.hpp"
#include "zerotrain/device.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/mpi_communicator.hpp"

namespace {

using namespace zt::testing;  // NOLINT: the shared test vocabulary
using zt::CommOp;
using zt::DType;
using zt::ReduceOp;

const zt::Device kEmulated = zt::Device::emulated();
const DType kTypes[] = {DType::fp32, DType::bf16, DType::fp64, DType::int64};
const std::vector<std::size_t> kSizes = {0, 1, 7, 1000, 100003};

std::size_t bytes_of(const Values& values) {
  return values.size() * zt::dtype_size(values.type());
}

/// A copy of host values in emulated memory.
class EmulatedCopy {
 public:
  explicit EmulatedCopy(const Values& values)
      : type_(values.type()),
        count_(values.size()),
        buffer_(kEmulated, std::max<std::size_t>(bytes_of(values), 1)) {
    zt::copy_bytes(buffer_.data(), kEmulated, values.bytes(), zt::Device::host(), bytes_of(values));
  }
  void* data() { return count_ == 0 ? nullptr : buffer_.data(); }  // as Values: count 0 passes null
  Values to_host() const {
    Values values(type_, count_);
    zt::copy_bytes(values.bytes(), zt::Device::host(), buffer_.data(), kEmulated, bytes_of(values));
    return values;
  }

 private:
  DType type_;
  std::size_t count_;
  zt::Buffer buffer_;
};

struct Communicators {
  std::unique_ptr<zt::Communicator> host = zt::make_mpi_communicator(MPI_COMM_WORLD, "host");
  std::unique_ptr<zt::Communicator> emulated =
      zt::make_emulated_device_communicator(MPI_COMM_WORLD, "emulated", kEmulated);
  void set_chunk(std::size_t elements) {
    zt::detail::set_mpi_max_chunk_elements(*host, elements);
    zt::detail::set_mpi_max_chunk_elements(*emulated, elements);
  }
};

/// The operation on the host communicator with `buffers`, and on the emulated one with emulated
/// copies of them; afterwards every buffer must hold the same bytes on both.
using Operation = std::function<void(zt::Communicator& comm, const std::vector<void*>& buffers)>;
void expect_same_bytes(Communicators& comms, const std::string& label, std::vector<Values> buffers,
                       const Operation& operation) {
  std::vector<EmulatedCopy> copies;
  std::vector<void*> host_pointers, emulated_pointers;
  for (Values& values : buffers) {
    copies.emplace_back(values);
    host_pointers.push_back(values.data());
  }
  for (EmulatedCopy& copy : copies) emulated_pointers.push_back(copy.data());
  operation(*comms.host, host_pointers);
  operation(*comms.emulated, emulated_pointers);
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    const Values back = copies[i].to_host();
    EXPECT_EQ(std::memcmp(back.bytes(), buffers[i].bytes(), bytes_of(back)), 0)
        << label << ": buffer " << i << " differs from the host result";
  }
}

/// Non-blocking forms: waited for (on the host: these communicators are ordered with no stream).
void finish(zt::Communicator&, zt::Work work, const std::string&) {
  work.wait();
}

std::byte* at(void* pointer, std::size_t elements, DType type) {
  return pointer == nullptr ? nullptr : static_cast<std::byte*>(pointer) + elements * zt::dtype_size(type);
}

void check_all_reduce(Communicators& comms, const std::vector<std::size_t>& sizes) {
  const int rank = comms.host->rank();
  for (DType type : kTypes) {
    for (ReduceOp op : kAllOps) {
      for (std::size_t count : sizes) {
        for (bool in_place : {false, true}) {
          for (bool nonblocking : {false, true}) {
            const std::string label = describe(*comms.emulated, "all_reduce", type, count, nonblocking,
                                               in_place, zt::reduce_op_name(op));
            std::vector<Values> buffers{input_values(type, count, rank)};
            if (!in_place) buffers.push_back(filled_values(type, count, 99));
            expect_same_bytes(comms, label, buffers,
                              [&](zt::Communicator& comm, const std::vector<void*>& b) {
                                void* recv = b.back();
                                if (nonblocking) {
                                  finish(comm, comm.iall_reduce(b[0], recv, count, type, op), label);
                                } else {
                                  comm.all_reduce(b[0], recv, count, type, op);
                                }
                              });
          }
        }
      }
    }
  }
}

void check_reduce_scatter(Communicators& comms, const std::vector<std::size_t>& sizes) {
  const int rank = comms.host->rank();
  const auto n = static_cast<std::size_t>(comms.host->size());
  for (DType type : kTypes) {
    for (ReduceOp op : kAllOps) {
      for (std::size_t count : sizes) {
        for (bool in_place : {false, true}) {
          for (bool nonblocking : {false, true}) {
            const std::string label = describe(*comms.emulated, "reduce_scatter", type, count, nonblocking,
                                               in_place, zt::reduce_op_name(op));
            std::vector<Values> buffers{input_values(type, count * n, rank)};
            if (!in_place) buffers.push_back(filled_values(type, count, 99));
            expect_same_bytes(comms, label, buffers,
                              [&](zt::Communicator& comm, const std::vector<void*>& b) {
                                if (nonblocking) {
                                  finish(comm, comm.ireduce_scatter(b[0], b.back(), count, type, op), label);
                                } else {
                                  comm.reduce_scatter(b[0], b.back(), count, type, op);
                                }
                              });
          }
        }
      }
    }
  }
}

void check_all_gather(Communicators& comms, const std::vector<std::size_t>& sizes) {
  const int rank = comms.host->rank();
  const auto n = static_cast<std::size_t>(comms.host->size());
  for (DType type : kTypes) {
    for (std::size_t count : sizes) {
      for (bool in_place : {false, true}) {
        for (bool nonblocking : {false, true}) {
          const std::string label =
              describe(*comms.emulated, "all_gather", type, count, nonblocking, in_place);
          // In place: this rank's block already sits at its place in the output.
          Values output = filled_values(type, count * n, 99);
          const Values mine = input_values(type, count, rank);
          if (count > 0) std::memcpy(output.bytes() + rank * bytes_of(mine), mine.bytes(), bytes_of(mine));
          std::vector<Values> buffers{output};
          if (!in_place) buffers.push_back(mine);
          expect_same_bytes(comms, label, buffers, [&](zt::Communicator& comm, const std::vector<void*>& b) {
            const void* send = in_place ? at(b[0], count * static_cast<std::size_t>(rank), type) : b[1];
            if (nonblocking) {
              finish(comm, comm.iall_gather(send, b[0], count, type), label);
            } else {
              comm.all_gather(send, b[0], count, type);
            }
          });
        }
      }
    }
  }
}

void check_all_gather_v(Communicators& comms, const std::vector<std::size_t>& sizes) {
  const int rank = comms.host->rank();
  for (DType type : kTypes) {
    for (std::size_t base : sizes) {
      const std::vector<std::size_t> counts = uneven_counts(base, comms.host->size());
      std::size_t total = 0;
      for (std::size_t count : counts) total += count;
      const std::size_t mine = counts[static_cast<std::size_t>(rank)];
      for (bool nonblocking : {false, true}) {
        const std::string label = describe(*comms.emulated, "all_gather_v", type, base, nonblocking, false);
        std::vector<Values> buffers{filled_values(type, total, 99), input_values(type, mine, rank)};
        expect_same_bytes(comms, label, buffers, [&](zt::Communicator& comm, const std::vector<void*>& b) {
          if (nonblocking) {
            finish(comm, comm.iall_gather_v(b[1], mine, b[0], counts, type), label);
          } else {
            comm.all_gather_v(b[1], mine, b[0], counts, type);
          }
        });
      }
    }
  }
}

void check_broadcast(Communicators& comms, const std::vector<std::size_t>& sizes) {
  const int rank = comms.host->rank();
  for (DType type : kTypes) {
    for (std::size_t count : sizes) {
      for (int root = 0; root < comms.host->size(); ++root) {
        for (bool nonblocking : {false, true}) {
          const std::string label = describe(*comms.emulated, "broadcast", type, count, nonblocking, false,
                                             "root " + std::to_string(root));
          std::vector<Values> buffers{rank == root ? input_values(type, count, rank)
                                                   : filled_values(type, count, 99)};
          expect_same_bytes(comms, label, buffers, [&](zt::Communicator& comm, const std::vector<void*>& b) {
            if (nonblocking) {
              finish(comm, comm.ibroadcast(b[0], count, type, root), label);
            } else {
              comm.broadcast(b[0], count, type, root);
            }
          });
        }
      }
    }
  }
}

TEST(EmulatedCollectives, AllReduceEqualsTheHost) {
  Communicators comms;
  check_all_reduce(comms, kSizes);
}

TEST(EmulatedCollectives, ReduceScatterEqualsTheHost) {
  Communicators comms;
  check_reduce_scatter(comms, kSizes);
}

TEST(EmulatedCollectives, AllGatherEqualsTheHost) {
  Communicators comms;
  check_all_gather(comms, kSizes);
}

TEST(EmulatedCollectives, AllGatherVEqualsTheHost) {
  Communicators comms;
  check_all_gather_v(comms, kSizes);
}

TEST(EmulatedCollectives, BroadcastEqualsTheHost) {
  Communicators comms;
  check_broadcast(comms, kSizes);
}

// With a chunk limit of 64 elements: chunked calls, per-root reduces (an in-place reduce_scatter
// copies out of scratch memory when it completes) and gathers by broadcasts, all in emulated memory.
TEST(EmulatedCollectives, ChunkedPathsEqualTheHost) {
  Communicators comms;
  comms.set_chunk(64);
  const std::vector<std::size_t> sizes = {1, 1000};
  check_all_reduce(comms, sizes);
  check_reduce_scatter(comms, sizes);
  check_all_gather(comms, sizes);
  check_all_gather_v(comms, sizes);
  check_broadcast(comms, sizes);
}

TEST(EmulatedCollectives, SendRecvInAnOrderedRing) {
  Communicators comms;
  const int n = comms.host->size();
  const int rank = comms.host->rank();
  if (n == 1) {
    // A device communicator has no peer in its own rank.
    EmulatedCopy buffer(filled_values(DType::fp32, 4, 1));
    const std::string message =
        zt::testing::error_of([&] { comms.emulated->send(buffer.data(), 4, DType::fp32, 0, 0); });
    EXPECT_NE(message.find("peer 0 is this rank"), std::string::npos) << message;
    EXPECT_NE(message.find("emulated:0"), std::string::npos) << message;
    EXPECT_THROW(static_cast<void>(comms.emulated->irecv(buffer.data(), 4, DType::fp32, 0, 0)),
                 zt::CommError);
    return;
  }
  const int next = (rank + 1) % n, previous = (rank + n - 1) % n;
  int tag = 10;
  for (DType type : kTypes) {
    for (std::size_t count : kSizes) {
      for (bool nonblocking : {false, true}) {
        const std::string label =
            describe(*comms.emulated, "send/recv ring", type, count, nonblocking, false);
        std::vector<Values> buffers{input_values(type, count, rank), filled_values(type, count, 99)};
        expect_same_bytes(comms, label, buffers, [&](zt::Communicator& comm, const std::vector<void*>& b) {
          // Even ranks send first, odd ranks receive first: a receive waits for its message.
          const auto send = [&] {
            if (nonblocking) {
              finish(comm, comm.isend(b[0], count, type, next, tag), label);
            } else {
              comm.send(b[0], count, type, next, tag);
            }
          };
          const auto receive = [&] {
            if (nonblocking) {
              finish(comm, comm.irecv(b[1], count, type, previous, tag), label);
            } else {
              comm.recv(b[1], count, type, previous, tag);
            }
          };
          exchange_in_ring_order(rank, send, receive);
        });
        ++tag;
      }
    }
  }
}

TEST(EmulatedCollectives, ExchangesStartTheSendAndTheReceiveTogether) {
  Communicators comms;
  const int n = comms.host->size();
  const int rank = comms.host->rank();
  if (n == 1) {
    // MPI exchanges with its own rank; a device communicator refuses it, as its send and recv.
    Values out = input_values(DType::fp32, 5, 0), in = filled_values(DType::fp32, 5, 99);
    comms.host->isend_irecv({out.data(), 5, DType::fp32, 0, 1}, {in.data(), 5, DType::fp32, 0, 1}).wait();
    EXPECT_EQ(std::memcmp(in.bytes(), out.bytes(), bytes_of(in)), 0);
    const std::string overlapping = zt::testing::error_of([&] {
      static_cast<void>(
          comms.host->isend_irecv({out.data(), 5, DType::fp32, 0, 1}, {out.data(), 5, DType::fp32, 0, 1}));
    });
    EXPECT_NE(overlapping.find("the message to send and the receive buffer overlap"), std::string::npos)
        << overlapping;
    EmulatedCopy buffer(out), other(in);
    const std::string message = zt::testing::error_of([&] {
      static_cast<void>(comms.emulated->isend_irecv({buffer.data(), 5, DType::fp32, 0, 1},
                                                    {other.data(), 5, DType::fp32, 0, 1}));
    });
    EXPECT_NE(message.find("peer 0 is this rank"), std::string::npos) << message;
    return;
  }
  // Every rank sends to the next and receives from the previous at once: with a device
  // communicator's separate send and recv this deadlocks (every send waits for its receive, which
  // its peer posts only after its own send); as one exchange it completes. Then each pair of
  // neighbours swaps, sending to and receiving from the same peer.
  const int next = (rank + 1) % n, previous = (rank + n - 1) % n;
  const int partner = rank ^ 1;  // n is even here (2 or 4)
  int tag = 40;
  for (DType type : kTypes) {
    for (std::size_t count : kSizes) {
      for (bool swap_with_partner : {false, true}) {
        const std::string label =
            describe(*comms.emulated, swap_with_partner ? "isend_irecv pair" : "isend_irecv ring", type,
                     count, true, false);
        const int to = swap_with_partner ? partner : next, from = swap_with_partner ? partner : previous;
        // Different counts each way: the receive takes what the sender sends.
        const std::size_t incoming = count + static_cast<std::size_t>(from % 2);
        const std::size_t outgoing = count + static_cast<std::size_t>(rank % 2);
        std::vector<Values> buffers{input_values(type, outgoing, rank), filled_values(type, incoming, 99)};
        expect_same_bytes(comms, label, buffers, [&](zt::Communicator& comm, const std::vector<void*>& b) {
          finish(comm, comm.isend_irecv({b[0], outgoing, type, to, tag}, {b[1], incoming, type, from, tag}),
                 label);
          if (comm.device().is_host()) {  // the host's result is the peer's message itself
            const Values expected = input_values(type, incoming, from);
            EXPECT_TRUE(incoming == 0 || std::memcmp(b[1], expected.bytes(), bytes_of(expected)) == 0)
                << label;
          }
        });
        ++tag;
      }
    }
  }
  // Counted as a send and a recv, as on the host.
  for (CommOp op : {CommOp::send, CommOp::recv}) {
    EXPECT_EQ(comms.emulated->traffic()[op].calls, comms.host->traffic()[op].calls) << zt::comm_op_name(op);
    EXPECT_EQ(comms.emulated->traffic()[op].bytes, comms.host->traffic()[op].bytes) << zt::comm_op_name(op);
    EXPECT_EQ(comms.host->traffic()[op].calls, std::size(kTypes) * kSizes.size() * 2) << zt::comm_op_name(op);
  }
}

TEST(EmulatedCollectives, TrafficAndSequenceNumbersCountAsOnTheHost) {
  Communicators comms;
  const auto n = static_cast<std::size_t>(comms.host->size());
  EXPECT_EQ(comms.emulated->device(), kEmulated);
  EXPECT_EQ(comms.emulated->backend(), zt::CommBackend::mpi);
  EXPECT_EQ(comms.emulated->name(), "emulated");
  EXPECT_NE(zt::native_mpi_comm(*comms.emulated), MPI_COMM_WORLD);  // a duplicate
  for (zt::Communicator* comm : {comms.host.get(), comms.emulated.get()}) {
    Values floats = filled_values(DType::fp32, 1000, 1.0);
    Values doubles = filled_values(DType::fp64, 10 * n, 1.0);
    EmulatedCopy emulated_floats(floats), emulated_doubles(doubles);
    void* a = comm->device().is_emulated() ? emulated_floats.data() : floats.data();
    void* b = comm->device().is_emulated() ? emulated_doubles.data() : doubles.data();
    comm->all_reduce(a, a, 1000, DType::fp32, ReduceOp::sum);
    comm->iall_reduce(a, a, 1000, DType::fp32, ReduceOp::avg).wait();
    comm->reduce_scatter(b, b, 10, DType::fp64, ReduceOp::sum);
    comm->broadcast(a, 5, DType::fp32, 0);
    comm->barrier();
  }
  EXPECT_EQ(comms.emulated->collectives_started(), comms.host->collectives_started());
  EXPECT_EQ(comms.emulated->collectives_started(), 5u);
  for (CommOp op : {CommOp::all_reduce, CommOp::reduce_scatter, CommOp::broadcast, CommOp::barrier}) {
    const zt::TrafficCounter& host = comms.host->traffic()[op];
    const zt::TrafficCounter& emulated = comms.emulated->traffic()[op];
    EXPECT_EQ(emulated.calls, host.calls) << zt::comm_op_name(op);
    EXPECT_EQ(emulated.bytes, host.bytes) << zt::comm_op_name(op);
    EXPECT_EQ(emulated.wire_bytes, host.wire_bytes) << zt::comm_op_name(op);
  }
  EXPECT_EQ(comms.emulated->traffic()[CommOp::all_reduce].calls, 2u);
  EXPECT_EQ(comms.emulated->traffic()[CommOp::all_reduce].bytes, 8000u);
}

TEST(EmulatedCollectives, RefusesHostBuffersAsNcclWould) {
  // A host buffer handed to a device communicator is an engine bug that would fail on a GPU; the
  // emulated device finds it first, whatever the operation, before any rank starts it.
  Communicators comms;
  Values host = filled_values(DType::fp32, 8, 1.0);
  EmulatedCopy device(host);
  const int peer = (comms.host->rank() + 1) % comms.host->size();
  const std::vector<std::pair<const char*, std::function<void()>>> calls = {
      {"all_reduce",
       [&] { comms.emulated->all_reduce(host.data(), host.data(), 8, DType::fp32, ReduceOp::sum); }},
      {"all_reduce",
       [&] { comms.emulated->all_reduce(device.data(), host.data(), 8, DType::fp32, ReduceOp::sum); }},
      {"broadcast", [&] { static_cast<void>(comms.emulated->ibroadcast(host.data(), 8, DType::fp32, 0)); }},
      {"all_gather", [&] { comms.emulated->all_gather(host.data(), device.data(), 1, DType::fp32); }},
  };
  for (const auto& [op, call] : calls) {
    const std::string message = zt::testing::error_of(call);
    EXPECT_NE(message.find(std::string(op) + " on communicator 'emulated'"), std::string::npos) << message;
    EXPECT_NE(message.find("is not in emulated:0 memory"), std::string::npos) << message;
  }
  if (comms.host->size() > 1) {
    const std::string message = zt::testing::error_of([&] {
      static_cast<void>(comms.emulated->isend_irecv({device.data(), 8, DType::fp32, peer, 0},
                                                    {host.data(), 8, DType::fp32, peer, 0}));
    });
    EXPECT_NE(message.find("recv on communicator 'emulated'"), std::string::npos) << message;
    EXPECT_NE(message.find("is not in emulated:0 memory"), std::string::npos) << message;
  }
  // Count 0 touches no memory: any pointer passes.
  EXPECT_NO_THROW(comms.emulated->all_reduce(host.data(), host.data(), 0, DType::fp32, ReduceOp::sum));
}

TEST(EmulatedCollectives, SingleRankCommunicatorsCopy) {
  // The engine's device communicator for a group of one rank (any world size: each rank makes its
  // own): every collective is a copy from send to receive, or nothing in place; no peer to send to.
  const zt::Stream stream(kEmulated);
  auto single = zt::make_single_rank_communicator(kEmulated, "single@emulated:0", stream);
  EXPECT_EQ(single->backend(), zt::CommBackend::local);
  EXPECT_EQ(zt::comm_backend_name(single->backend()), "local");
  EXPECT_EQ(single->size(), 1);
  EXPECT_EQ(single->rank(), 0);
  EXPECT_EQ(single->device(), kEmulated);
  for (DType type : kTypes) {
    for (std::size_t count : kSizes) {
      for (bool nonblocking : {false, true}) {
        const std::string label = describe(*single, "single rank", type, count, nonblocking, false);
        const Values input = input_values(type, count, 3);
        auto check_copy = [&](const std::function<void(void*, void*)>& operation, const char* what) {
          EmulatedCopy send(input), recv(filled_values(type, count, 99));
          operation(send.data(), recv.data());
          const Values got = recv.to_host();
          EXPECT_EQ(std::memcmp(got.bytes(), input.bytes(), bytes_of(input)), 0) << label << ": " << what;
          EmulatedCopy in_place(input);
          operation(in_place.data(), in_place.data());
          const Values kept = in_place.to_host();
          EXPECT_EQ(std::memcmp(kept.bytes(), input.bytes(), bytes_of(input)), 0) << label << ": " << what;
        };
        for (ReduceOp op : kAllOps) {
          check_copy(
              [&](void* send, void* recv) {
                if (nonblocking) {
                  EXPECT_TRUE(single->iall_reduce(send, recv, count, type, op).completed());
                } else {
                  single->all_reduce(send, recv, count, type, op);
                }
              },
              "all_reduce");
        }
        check_copy(
            [&](void* send, void* recv) { single->reduce_scatter(send, recv, count, type, ReduceOp::sum); },
            "reduce_scatter");
        check_copy(
            [&](void* send, void* recv) {
              if (nonblocking) {
                EXPECT_TRUE(single->iall_gather(send, recv, count, type).completed());
              } else {
                single->all_gather(send, recv, count, type);
              }
            },
            "all_gather");
        const std::size_t counts[] = {count};
        check_copy([&](void* send, void* recv) { single->all_gather_v(send, count, recv, counts, type); },
                   "all_gather_v");
        EmulatedCopy root(input);
        single->broadcast(root.data(), count, type, 0);
        const Values broadcast = root.to_host();
        EXPECT_EQ(std::memcmp(broadcast.bytes(), input.bytes(), bytes_of(input)), 0) << label;
      }
    }
  }
  single->barrier();
  EXPECT_EQ(single->traffic()[CommOp::all_gather].calls, std::size(kTypes) * kSizes.size() * 2 * 2);
  EXPECT_EQ(single->traffic()[CommOp::all_reduce].wire_bytes, 0u) << "one rank sends nothing";
  // No peer but itself; a host buffer refused; no host device.
  EmulatedCopy buffer(filled_values(DType::fp32, 4, 1.0));
  std::string message = zt::testing::error_of([&] { single->send(buffer.data(), 4, DType::fp32, 0); });
  EXPECT_NE(message.find("send on communicator 'single@emulated:0' (rank 0 of 1): peer 0 is this rank"),
            std::string::npos)
      << message;
  EXPECT_THROW(static_cast<void>(single->isend_irecv({buffer.data(), 4, DType::fp32, 0, 0},
                                                     {buffer.data(), 4, DType::fp32, 0, 0})),
               zt::CommError);
  Values host = filled_values(DType::fp32, 4, 1.0);
  message = zt::testing::error_of(
      [&] { single->all_reduce(host.data(), buffer.data(), 4, DType::fp32, ReduceOp::sum); });
  EXPECT_NE(message.find("is not in emulated:0 memory"), std::string::npos) << message;
  const zt::Stream host_stream;
  message =
      zt::testing::error_of([&] { zt::make_single_rank_communicator(zt::Device::host(), "h", host_stream); });
  EXPECT_NE(message.find("make_single_rank_communicator('h'): device host"), std::string::npos) << message;
}

TEST(EmulatedCollectives, OrderAfterTakesEventsOfItsDeviceOrTheHost) {
  // order_after: the emulated device's streams run work at once, so its events are reached when
  // recorded and the wait returns at once (tests/mpi/test_nccl.cpp has the GPU's ordering); what is
  // checked here is which events each backend takes, on every rank before the collective after it.
  Communicators comms;
  const zt::Stream transfer(kEmulated);
  zt::Event copied(kEmulated);
  copied.record(transfer);
  const zt::Stream compute(kEmulated);
  auto single = zt::make_single_rank_communicator(kEmulated, "single@emulated:0", compute);
  const zt::Event host_event;
  for (zt::Communicator* comm : {comms.emulated.get(), single.get(), comms.host.get()}) {
    SCOPED_TRACE(comm->name());
    EXPECT_NO_THROW(comm->order_after(copied));
    EXPECT_NO_THROW(comm->order_after(host_event));
  }
  // Another device's event: a device communicator cannot wait for it.
  const zt::Stream other_stream(zt::Device::emulated(1));
  zt::Event other(zt::Device::emulated(1));
  other.record(other_stream);
  std::string message = zt::testing::error_of([&] { comms.emulated->order_after(other); });
  EXPECT_NE(message.find("order_after on communicator 'emulated' (rank " +
                         std::to_string(comms.host->rank()) + " of " + std::to_string(comms.host->size()) +
                         "): the event is on emulated:1, the communicator's buffers on emulated:0"),
            std::string::npos)
      << message;
  message = zt::testing::error_of([&] { single->order_after(other); });
  EXPECT_NE(message.find("order_after on communicator 'single@emulated:0' (rank 0 of 1): the event is on "
                         "emulated:1"),
            std::string::npos)
      << message;
  EXPECT_NO_THROW(comms.host->order_after(other)) << "host buffers: the host waits for any device's event";
  // The collectives after the waits: still the host's results.
  Values sum = input_values(DType::fp32, 1000, comms.host->rank());
  EmulatedCopy device(sum);
  comms.emulated->order_after(copied);
  comms.emulated->all_reduce(device.data(), device.data(), 1000, DType::fp32, ReduceOp::sum);
  comms.host->all_reduce(sum.data(), sum.data(), 1000, DType::fp32, ReduceOp::sum);
  const Values back = device.to_host();
  EXPECT_EQ(std::memcmp(back.bytes(), sum.bytes(), bytes_of(sum)), 0);
}

TEST(EmulatedCollectives, ANonBlockingResultLandsOnlyWhereItIsWaitedFor) {
  // Ordered with a stream, as the engine's communicators are: the result lands on the communicator's
  // own stream, and the ordering stream's work sees it only after Work::wait() (NCCL's
  // cudaStreamWaitEvent), not before, under the lazy order (the eager one lands it early).
  const bool lazy = zt::detail::emulated_stream_order() == zt::detail::EmulatedStreamOrder::lazy;
  const zt::Stream compute(kEmulated);
  Communicators comms;
  auto ordered = zt::make_emulated_device_communicator(MPI_COMM_WORLD, "ordered", kEmulated, &compute);
  const int rank = comms.host->rank();
  constexpr std::size_t kCount = 1000;
  const Values input = input_values(DType::fp32, kCount, rank);
  Values expected = input;
  comms.host->all_reduce(expected.data(), expected.data(), kCount, DType::fp32, ReduceOp::sum);
  auto read_on = [&](EmulatedCopy& device, const zt::Stream& stream) {
    Values values(DType::fp32, kCount);  // pageable: the copy is done when copy_bytes returns
    zt::copy_bytes(values.bytes(), zt::Device::host(), device.data(), kEmulated, bytes_of(values), &stream);
    return values;
  };
  for (const bool in_place : {true, false}) {
    SCOPED_TRACE(in_place ? "in place" : "out of place");
    EmulatedCopy device(input);
    EmulatedCopy output(Values(DType::fp32, kCount));
    void* recv = in_place ? device.data() : output.data();
    zt::Work work = ordered->iall_reduce(device.data(), recv, kCount, DType::fp32, ReduceOp::sum);
    EXPECT_FALSE(work.completed());
    EmulatedCopy& result = in_place ? device : output;
    const Values before = read_on(result, compute);
    if (lazy) {
      const Values unwritten = in_place ? input : Values(DType::fp32, kCount);
      EXPECT_EQ(std::memcmp(before.bytes(), unwritten.bytes(), bytes_of(before)), 0)
          << "the result landed before its Work was waited for";
    }
    work.wait();  // the ordering stream waits for the landing; the host does not
    const Values after = read_on(result, compute);
    EXPECT_EQ(std::memcmp(after.bytes(), expected.bytes(), bytes_of(after)), 0);
  }
  // test(): under the lazy order nothing progresses on its own, so an operation is not done until
  // waited for (as a GPU's may not be yet); under the eager one it lands at the test.
  {
    EmulatedCopy device(input);
    zt::Work work = ordered->ibroadcast(device.data(), kCount, DType::fp32, 0);
    const Values root = input_values(DType::fp32, kCount, 0);
    EXPECT_EQ(work.test(), !lazy);
    work.wait();
    const Values after = read_on(device, compute);
    EXPECT_EQ(std::memcmp(after.bytes(), root.bytes(), bytes_of(after)), 0);
  }
  // Written into the output or the input after the call and before the landing: a race with NCCL's
  // kernel on a GPU, an error naming the operation and the buffer here (lazy order: the write runs
  // before the landing; the eager one lands first).
  for (const bool into_output : {true, false}) {
    SCOPED_TRACE(into_output ? "a write into the output" : "a write into the input");
    const zt::Stream compute_of_one(kEmulated);  // a failed landing poisons its stream's later work
    auto comm = zt::make_emulated_device_communicator(MPI_COMM_WORLD, "raced", kEmulated, &compute_of_one);
    EmulatedCopy device(input);
    EmulatedCopy output(Values(DType::fp32, kCount));
    zt::Work work = comm->iall_reduce(device.data(), output.data(), kCount, DType::fp32, ReduceOp::sum);
    const Values ones = filled_values(DType::fp32, kCount, 1.0);
    zt::copy_bytes(into_output ? output.data() : device.data(), kEmulated, ones.bytes(), zt::Device::host(),
                   bytes_of(ones), &compute_of_one);
    work.wait();
    std::string message;  // none under the eager order
    try {
      compute_of_one.synchronize();
    } catch (const zt::Error& error) {
      message = error.what();
    }
    if (lazy) {
      EXPECT_NE(message.find(std::string("all_reduce on communicator 'raced' (rank ") + std::to_string(rank) +
                             " of " + std::to_string(comms.host->size()) + "): its " +
                             (into_output ? "output" : "input") +
                             " buffer was written while the operation was in flight"),
                std::string::npos)
          << message;
    } else {
      EXPECT_TRUE(message.empty()) << message;
    }
    comm->barrier();  // every rank's failure seen before the next collective
  }
  // Operations of one communicator land in order: a second one that reads the first's output
  // reads it landed, as NCCL's stream runs them one after the other.
  {
    EmulatedCopy device(input);
    EmulatedCopy twice(Values(DType::fp32, kCount));
    zt::Work first = ordered->iall_reduce(device.data(), device.data(), kCount, DType::fp32, ReduceOp::sum);
    zt::Work second = ordered->iall_reduce(device.data(), twice.data(), kCount, DType::fp32, ReduceOp::sum);
    first.wait();
    second.wait();
    Values expected_twice = expected;
    comms.host->all_reduce(expected_twice.data(), expected_twice.data(), kCount, DType::fp32, ReduceOp::sum);
    const Values after = read_on(twice, compute);
    EXPECT_EQ(std::memcmp(after.bytes(), expected_twice.bytes(), bytes_of(after)), 0);
  }
  // Ordered with no stream (the other tests' communicators): wait() waits on the host.
  EmulatedCopy device(input);
  zt::Work work =
      comms.emulated->iall_reduce(device.data(), device.data(), kCount, DType::fp32, ReduceOp::sum);
  work.wait();
  const Values after = device.to_host();
  EXPECT_EQ(std::memcmp(after.bytes(), expected.bytes(), bytes_of(after)), 0);
}

TEST(EmulatedCollectives, RefusesADeviceThatIsNotEmulated) {
  const std::string message = zt::testing::error_of(
      [] { zt::make_emulated_device_communicator(MPI_COMM_WORLD, "wrong", zt::Device::host()); });
  EXPECT_NE(message.find("make_emulated_device_communicator('wrong'): device host"), std::string::npos)
      << message;
}

}  // namespace
