// The MPI communicator, checked at whatever world size the test runs with (ctest: 1, 2 and 4).
//
// Every rank can compute every rank's input (input_value(type, rank, index)), so each checks its
// own result against a reference computed locally. Every collective x dtype x op x {blocking,
// non-blocking} x {out of place, in place} runs at odd sizes (0, 1, 7, 1000, 100003, one larger),
// and again with a chunk limit of 64 elements, which drives the large-count paths (chunked calls,
// per-root reduces and broadcasts) with small buffers.
//
// Checks inside loops use EXPECT (never ASSERT) so that all ranks keep making the same
// collective calls even when one of them sees a wrong result.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "collective_reference.hpp"
#include "mpi_layer/mpi_communicator_testing.hpp"
#include "zerotrain/communicator.hpp"
#include "zerotrain/dtype.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/mpi_communicator.hpp"

namespace {

using namespace zt::testing;  // NOLINT: the shared test vocabulary
using zt::CommOp;
using zt::DType;
using zt::ReduceOp;

/// Sizes for the full matrix; 1000003-element buffers run in the *Large tests on fewer combinations.
const std::vector<std::size_t> kSizes = {0, 1, 7, 1000, 100003};
constexpr std::size_t kSmallChunk = 64;

std::unique_ptr<zt::Communicator> make_world(const std::string& name = "world") {
  return zt::make_mpi_communicator(MPI_COMM_WORLD, name);
}

std::unique_ptr<zt::Communicator> make_chunked_world() {
  auto comm = make_world("chunked");
  zt::detail::set_mpi_max_chunk_elements(*comm, kSmallChunk);
  return comm;
}

// ---- cases and how they run ------------------------------------------------------------------

/// One call to check. The lambdas own the buffers (shared_ptr), so a case can be started now and
/// verified later.
struct Case {
  std::string label;
  std::function<void()> run;        // the blocking form
  std::function<zt::Work()> start;  // the non-blocking form
  std::function<::testing::AssertionResult()> verify;
};

/// Blocking: run and verify one case after another. Non-blocking: start every case (all ranks in
/// the same order), complete them in reverse order -- every other one by polling test(), the rest
/// with wait() -- then verify. Having them all in flight at once checks that operations on one
/// communicator are independent; it also overlaps their latency, which with 4 ranks on 2 cores is
/// milliseconds per collective.
void run_cases(std::vector<Case>& cases, bool nonblocking) {
  if (!nonblocking) {
    for (Case& c : cases) {
      c.run();
      EXPECT_TRUE(c.verify()) << c.label;
    }
    return;
  }
  std::vector<zt::Work> works;
  works.reserve(cases.size());
  for (Case& c : cases) works.push_back(c.start());
  for (std::size_t k = works.size(); k-- > 0;) {
    if (k % 2 == 0) {
      while (!works[k].test()) {
      }
    } else {
      works[k].wait();
    }
    EXPECT_TRUE(works[k].completed()) << cases[k].label;
  }
  for (Case& c : cases) EXPECT_TRUE(c.verify()) << c.label;
}

using SharedValues = std::shared_ptr<Values>;

SharedValues make_input(DType type, std::size_t count, int rank) {
  auto values = std::make_shared<Values>(type, count);
  values->fill([&](std::size_t i) { return input_value(type, rank, i); });
  return values;
}

SharedValues make_filled(DType type, std::size_t count, double value) {
  auto values = std::make_shared<Values>(type, count);
  values->fill([&](std::size_t) { return value; });
  return values;
}

/// Address of element `index` (null for an empty buffer, as a caller with nothing to send may pass).
void* element_at(Values& values, std::size_t index) {
  return values.size() == 0 ? nullptr : values.bytes() + index * zt::dtype_size(values.type());
}

// ---- the checks, per collective --------------------------------------------------------------

void check_all_reduce(zt::Communicator& comm, std::span<const DType> types, std::span<const ReduceOp> ops,
                      const std::vector<std::size_t>& sizes) {
  const int n = comm.size();
  for (bool nonblocking : {false, true}) {
    std::vector<Case> cases;
    for (DType type : types) {
      for (ReduceOp op : ops) {
        for (std::size_t count : sizes) {
          for (bool in_place : {false, true}) {
            SharedValues send = make_input(type, count, comm.rank());
            SharedValues recv = in_place ? send : make_filled(type, count, 99);
            const void* source = send->data();
            Case c;
            c.label =
                describe(comm, "all_reduce", type, count, nonblocking, in_place, zt::reduce_op_name(op));
            c.run = [&comm, send, recv, source, count, type, op] {
              comm.all_reduce(source, recv->data(), count, type, op);
            };
            c.start = [&comm, send, recv, source, count, type, op] {
              return comm.iall_reduce(source, recv->data(), count, type, op);
            };
            c.verify = [send, recv, count, type, op, n, in_place, rank = comm.rank()] {
              auto result = matches(*recv, 0, count, [&](std::size_t i) {
                return reference_reduction(type, op, n, [&](int r) { return input_value(type, r, i); });
              });
              if (!result || in_place) return result;
              return matches(*send, 0, count, [&](std::size_t i) { return input_value(type, rank, i); })
                     << " (the input was modified)";
            };
            cases.push_back(std::move(c));
          }
        }
      }
    }
    run_cases(cases, nonblocking);
  }
}

void check_reduce_scatter(zt::Communicator& comm, std::span<const DType> types, std::span<const ReduceOp> ops,
                          const std::vector<std::size_t>& recv_counts) {
  const int n = comm.size();
  const int rank = comm.rank();
  for (bool nonblocking : {false, true}) {
    std::vector<Case> cases;
    for (DType type : types) {
      for (ReduceOp op : ops) {
        for (std::size_t recv_count : recv_counts) {
          for (bool in_place : {false, true}) {
            SharedValues send = make_input(type, recv_count * static_cast<std::size_t>(n), rank);
            SharedValues recv = in_place ? send : make_filled(type, recv_count, 99);
            Case c;
            c.label = describe(comm, "reduce_scatter", type, recv_count, nonblocking, in_place,
                               zt::reduce_op_name(op));
            c.run = [&comm, send, recv, recv_count, type, op] {
              comm.reduce_scatter(send->data(), recv->data(), recv_count, type, op);
            };
            c.start = [&comm, send, recv, recv_count, type, op] {
              return comm.ireduce_scatter(send->data(), recv->data(), recv_count, type, op);
            };
            c.verify = [recv, recv_count, type, op, n, rank] {
              const std::size_t block = static_cast<std::size_t>(rank) * recv_count;
              return matches(*recv, 0, recv_count, [&](std::size_t i) {
                return reference_reduction(type, op, n,
                                           [&](int r) { return input_value(type, r, block + i); });
              });
            };
            cases.push_back(std::move(c));
          }
        }
      }
    }
    run_cases(cases, nonblocking);
  }
}

/// all_gather and all_gather_v: rank r contributes counts[r] elements; in place, its own block of
/// recv is the send buffer.
Case gather_case(zt::Communicator& comm, DType type, const std::vector<std::size_t>& counts, bool variable,
                 bool nonblocking, bool in_place, std::size_t label_count) {
  const auto rank = static_cast<std::size_t>(comm.rank());
  const std::size_t mine = counts[rank];
  const std::size_t my_offset =
      std::accumulate(counts.begin(), counts.begin() + static_cast<long>(rank), std::size_t{0});
  const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  SharedValues send = make_input(type, mine, comm.rank());
  SharedValues recv = make_filled(type, total, 99);
  const void* source = send->data();
  if (in_place) {
    for (std::size_t i = 0; i < mine; ++i) recv->set(my_offset + i, send->get(i));
    source = element_at(*recv, my_offset);
  }
  Case c;
  c.label =
      describe(comm, variable ? "all_gather_v" : "all_gather", type, label_count, nonblocking, in_place);
  c.run = [&comm, send, recv, source, mine, counts, type, variable] {
    if (variable) {
      comm.all_gather_v(source, mine, recv->data(), counts, type);
    } else {
      comm.all_gather(source, recv->data(), mine, type);
    }
  };
  c.start = [&comm, send, recv, source, mine, counts, type, variable] {
    return variable ? comm.iall_gather_v(source, mine, recv->data(), counts, type)
                    : comm.iall_gather(source, recv->data(), mine, type);
  };
  c.verify = [recv, counts] { return blocks_match(*recv, counts); };
  return c;
}

void check_all_gather(zt::Communicator& comm, std::span<const DType> types,
                      const std::vector<std::size_t>& sizes) {
  for (bool nonblocking : {false, true}) {
    std::vector<Case> cases;
    for (DType type : types) {
      for (std::size_t send_count : sizes) {
        const std::vector<std::size_t> counts(static_cast<std::size_t>(comm.size()), send_count);
        for (bool in_place : {false, true}) {
          cases.push_back(gather_case(comm, type, counts, false, nonblocking, in_place, send_count));
        }
      }
    }
    run_cases(cases, nonblocking);
  }
}

void check_all_gather_v(zt::Communicator& comm, std::span<const DType> types,
                        const std::vector<std::size_t>& bases) {
  for (bool nonblocking : {false, true}) {
    std::vector<Case> cases;
    for (DType type : types) {
      for (std::size_t base : bases) {
        for (bool in_place : {false, true}) {
          cases.push_back(
              gather_case(comm, type, uneven_counts(base, comm.size()), true, nonblocking, in_place, base));
        }
      }
    }
    run_cases(cases, nonblocking);
  }
}

void check_broadcast(zt::Communicator& comm, std::span<const DType> types,
                     const std::vector<std::size_t>& sizes) {
  for (bool nonblocking : {false, true}) {
    std::vector<Case> cases;
    for (DType type : types) {
      for (std::size_t count : sizes) {
        for (int root = comm.size() - 1; root >= 0; --root) {  // non-zero roots first
          SharedValues buffer =
              comm.rank() == root ? make_input(type, count, root) : make_filled(type, count, 99);
          Case c;
          c.label =
              describe(comm, "broadcast", type, count, nonblocking, false, "root " + std::to_string(root));
          c.run = [&comm, buffer, count, type, root] { comm.broadcast(buffer->data(), count, type, root); };
          c.start = [&comm, buffer, count, type, root] {
            return comm.ibroadcast(buffer->data(), count, type, root);
          };
          c.verify = [buffer, count, type, root] {
            return matches(*buffer, 0, count, [&](std::size_t i) { return input_value(type, root, i); });
          };
          cases.push_back(std::move(c));
        }
      }
    }
    run_cases(cases, nonblocking);
  }
}

/// Each rank sends to the next and receives from the previous. Blocking: a blocking send paired
/// with a non-blocking receive and vice versa, so that no ordering can deadlock (also at one rank,
/// where the peer is the rank itself). Non-blocking: every message in flight at once, told apart by
/// tag only -- receives are posted in the opposite order of the sends.
void check_send_recv_ring(zt::Communicator& comm, std::span<const DType> types,
                          const std::vector<std::size_t>& sizes) {
  const int n = comm.size();
  const int rank = comm.rank();
  const int next = (rank + 1) % n;
  const int previous = (rank + n - 1) % n;
  int tag = 100;
  for (DType type : types) {
    for (std::size_t count : sizes) {
      for (bool blocking_send : {true, false}) {
        SCOPED_TRACE(
            describe(comm, blocking_send ? "send + irecv" : "isend + recv", type, count, false, false));
        SharedValues out = make_input(type, count, rank);
        SharedValues in = make_filled(type, count, 99);
        if (blocking_send) {
          zt::Work receiving = comm.irecv(in->data(), count, type, previous, tag);
          comm.send(out->data(), count, type, next, tag);
          receiving.wait();
        } else {
          zt::Work sending = comm.isend(out->data(), count, type, next, tag);
          comm.recv(in->data(), count, type, previous, tag);
          sending.wait();
        }
        EXPECT_TRUE(matches(*in, 0, count, [&](std::size_t i) { return input_value(type, previous, i); }));
        ++tag;
      }
    }
  }
  struct Message {
    SharedValues out;
    SharedValues in;
    int tag;
  };
  std::vector<Message> messages;
  for (DType type : types) {
    for (std::size_t count : sizes)
      messages.push_back({make_input(type, count, rank), make_filled(type, count, 99), tag++});
  }
  std::vector<zt::Work> works;
  for (auto it = messages.rbegin(); it != messages.rend(); ++it) {
    works.push_back(comm.irecv(it->in->data(), it->in->size(), it->in->type(), previous, it->tag));
  }
  for (Message& m : messages)
    works.push_back(comm.isend(m.out->data(), m.out->size(), m.out->type(), next, m.tag));
  for (zt::Work& work : works) work.wait();
  for (Message& m : messages) {
    EXPECT_TRUE(matches(*m.in, 0, m.in->size(),
                        [&](std::size_t i) { return input_value(m.in->type(), previous, i); }))
        << describe(comm, "isend + irecv", m.in->type(), m.in->size(), true, false,
                    "tag " + std::to_string(m.tag));
  }
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

/// Runs `call`, expects zt::CommError, and checks that its message names everything in `parts`.
void expect_comm_error(const std::function<void()>& call, const std::vector<std::string>& parts) {
  try {
    call();
    ADD_FAILURE() << "expected zt::CommError naming " << ::testing::PrintToString(parts);
  } catch (const zt::CommError& error) {
    const std::string message = error.what();
    for (const std::string& part : parts)
      EXPECT_TRUE(contains(message, part)) << "'" << part << "' not in: " << message;
  }
}

// ---- the tests -------------------------------------------------------------------------------

TEST(Collectives, AllReduceEveryDTypeOpAndSize) {
  auto world = make_world();
  check_all_reduce(*world, zt::kAllDTypes, kAllOps, kSizes);
}

TEST(Collectives, ReduceScatterEveryDTypeOpAndSize) {
  auto world = make_world();
  check_reduce_scatter(*world, zt::kAllDTypes, kAllOps, {0, 1, 7, 1000, 25001});
}

TEST(Collectives, AllGatherEveryDTypeAndSize) {
  auto world = make_world();
  check_all_gather(*world, zt::kAllDTypes, {0, 1, 7, 1000, 25001});
}

TEST(Collectives, AllGatherVUnevenCountsWithAnEmptyRank) {
  auto world = make_world();
  check_all_gather_v(*world, zt::kAllDTypes, {0, 1, 7, 1000, 25001});
}

TEST(Collectives, BroadcastFromEveryRoot) {
  auto world = make_world();
  check_broadcast(*world, zt::kAllDTypes, kSizes);
}

TEST(Collectives, SendRecvRing) {
  auto world = make_world();
  check_send_recv_ring(*world, zt::kAllDTypes, kSizes);
}

TEST(Collectives, LargeBuffers) {
  auto world = make_world();
  constexpr DType kTypes[] = {DType::fp32, DType::bf16};
  constexpr ReduceOp kSum[] = {ReduceOp::sum};
  const std::vector<std::size_t> large = {1000003};
  check_all_reduce(*world, kTypes, kSum, large);
  check_reduce_scatter(*world, kTypes, kSum, {250001});
  check_all_gather(*world, kTypes, {250001});
  check_broadcast(*world, kTypes, large);
}

// The large-count paths with a 64-element chunk limit; one dtype per kind of arithmetic (native,
// 16-bit user op, integer) keeps the number of calls -- milliseconds each at 4 ranks on 2 cores -- low.
constexpr DType kChunkedTypes[] = {DType::fp32, DType::bf16, DType::int64};

TEST(CollectivesChunked, AllReduceInChunks) {
  auto comm = make_chunked_world();
  check_all_reduce(*comm, kChunkedTypes, kAllOps, {0, 65, 300});
}

TEST(CollectivesChunked, ReduceScatterPastTheLimitTakesTheRing) {
  auto comm = make_chunked_world();
  check_reduce_scatter(*comm, kChunkedTypes, kAllOps, {0, 17, 130});  // 17: MPI's at 1-2 ranks, not at 4
}

TEST(CollectivesChunked, AllGatherByBroadcasts) {
  auto comm = make_chunked_world();
  check_all_gather(*comm, kChunkedTypes, {0, 17, 130});
}

TEST(CollectivesChunked, AllGatherVByBroadcasts) {
  auto comm = make_chunked_world();
  check_all_gather_v(*comm, kChunkedTypes, {0, 13, 70});
}

TEST(CollectivesChunked, BroadcastInChunks) {
  auto comm = make_chunked_world();
  check_broadcast(*comm, kChunkedTypes, {0, 64, 65, 300});
}

TEST(CollectivesChunked, SendRecvInSeveralMessages) {
  auto comm = make_chunked_world();
  check_send_recv_ring(*comm, kChunkedTypes, {0, 64, 65, 300});
}

// ---- reduce_scatter's ring (zerotrain's own, over point-to-point messages) ---------------------

/// A world whose reduce_scatter always takes the ring, in messages of `chunk_bytes` with `lanes`
/// columns in flight.
std::unique_ptr<zt::Communicator> make_ring_world(std::size_t chunk_bytes, int lanes) {
  auto comm = make_world("ring");
  zt::detail::set_mpi_ring_reduce_scatter(*comm,
                                          {.min_bytes = 0, .chunk_bytes = chunk_bytes, .lanes = lanes});
  return comm;
}

// 24-byte messages: columns of 3, 6 and 12 elements (8-, 4- and 2-byte types), so no size below
// divides evenly for every type, and 3 lanes with fewer or more columns than lanes.
TEST(CollectivesRing, EveryDTypeOpAndSizeInSmallMessages) {
  auto comm = make_ring_world(24, 3);
  check_reduce_scatter(*comm, zt::kAllDTypes, kAllOps, {0, 1, 7, 13, 100});
}

TEST(CollectivesRing, LargeBuffersInMessagesOf64KiB) {
  auto comm = make_ring_world(64 << 10, 2);
  constexpr DType kTypes[] = {DType::fp32, DType::bf16, DType::int32};
  check_reduce_scatter(*comm, kTypes, kAllOps, {100003});
}

TEST(CollectivesRing, OneLaneAndTheChunkLimitBelowTheMessageSize) {
  auto comm = make_ring_world(1 << 20, 1);
  zt::detail::set_mpi_max_chunk_elements(*comm, 5);  // messages of 5 elements, whatever chunk_bytes says
  check_reduce_scatter(*comm, kChunkedTypes, kAllOps, {0, 5, 23});
}

// The default settings: inputs of at least 1 MiB take the ring (an fp32 and a bf16 input just above).
TEST(CollectivesRing, DefaultThreshold) {
  auto world = make_world();
  const auto n = static_cast<std::size_t>(world->size());
  constexpr ReduceOp kSumAndAvg[] = {ReduceOp::sum, ReduceOp::avg};
  for (DType type : {DType::fp32, DType::bf16}) {
    const DType types[] = {type};
    const std::size_t above =
        zt::detail::RingReduceScatterSettings{}.min_bytes / zt::dtype_size(type) / n + 7;
    check_reduce_scatter(*world, types, kSumAndAvg, {above});
  }
}

/// Rank r's element i for the order test: values whose sums round, so a different summation order
/// gives different bits.
double rounding_input(DType type, int rank, std::size_t index) {
  const double mantissa =
      1.0 + static_cast<double>((rank * 7919 + static_cast<int>(index % 4099) * 104729) % 65521) / 65521.0;
  const double scale =
      std::ldexp(1.0, static_cast<int>((index + static_cast<std::size_t>(rank) * 3) % 9) - 4);
  return round_to(type, (index % 2 == 0 ? 1 : -1) * mantissa * scale * (1.0 + 1e-3 * rank));
}

/// x_b + (x_{b-1} + (... + x_{b+1})), every addition rounded to `type` (16-bit: in fp32, rounded once).
double in_ring_order(DType type, int n, int block, std::size_t index) {
  double partial = rounding_input(type, (block + 1) % n, index);
  for (int k = 2; k <= n; ++k) {
    const double own = rounding_input(type, (block + k) % n, index);
    partial = round_to(type, static_cast<float>(static_cast<float>(own) + static_cast<float>(partial)));
  }
  return partial;
}

/// (x_lo + ... ) + ( ... + x_{hi-1}) as a balanced tree over ranks [lo, hi), like MPI's recursive halving.
double in_tree_order(DType type, int lo, int hi, std::size_t index) {
  if (hi - lo == 1) return rounding_input(type, lo, index);
  const int middle = lo + (hi - lo) / 2;
  return round_to(type, static_cast<float>(static_cast<float>(in_tree_order(type, lo, middle, index)) +
                                           static_cast<float>(in_tree_order(type, middle, hi, index))));
}

// The ring combines block b's contributions in one fixed order, whatever the messages' timing: the
// result is the same bits blocking and non-blocking, in small and large messages, and equals the
// documented order computed here. At 4 ranks the data is such that a tree's order would differ.
TEST(CollectivesRing, DeterministicInTheDocumentedOrder) {
  const std::size_t recv_count = 20011;
  for (DType type : {DType::fp32, DType::bf16}) {
    std::size_t differs = 0;  // elements where a tree over the ranks would give other bits
    int ranks = 1;
    for (std::size_t chunk_bytes : {std::size_t{40}, std::size_t{1} << 20}) {
      auto comm = make_ring_world(chunk_bytes, 2);
      const int n = comm->size();
      const int rank = comm->rank();
      ranks = n;
      const std::size_t block = static_cast<std::size_t>(rank) * recv_count;
      for (bool nonblocking : {false, true}) {
        SCOPED_TRACE(describe(*comm, "reduce_scatter rounding", type, recv_count, nonblocking, true,
                              "chunk " + std::to_string(chunk_bytes)));
        Values data(type, recv_count * static_cast<std::size_t>(n));
        data.fill([&](std::size_t i) { return rounding_input(type, rank, i); });
        if (nonblocking) {
          zt::Work work = comm->ireduce_scatter(data.data(), data.data(), recv_count, type, ReduceOp::sum);
          while (!work.test()) {
          }
        } else {
          comm->reduce_scatter(data.data(), data.data(), recv_count, type, ReduceOp::sum);
        }
        EXPECT_TRUE(matches(data, 0, recv_count,
                            [&](std::size_t i) { return in_ring_order(type, n, rank, block + i); }));
        for (std::size_t i = 0; i < recv_count; ++i) {
          if (in_tree_order(type, 0, n, block + i) != in_ring_order(type, n, rank, block + i)) ++differs;
        }
      }
    }
    if (ranks >= 3) {
      EXPECT_GT(differs, 0u) << "the data does not tell the ring's order from a tree's";
    }
  }
}

// The ring's messages travel on a communicator of their own: point-to-point traffic of the caller on
// the same communicator, with any tag, cannot match them (nor the other way round).
TEST(CollectivesRing, UserMessagesDuringARingDoNotMix) {
  auto comm = make_ring_world(64, 2);
  const int n = comm->size();
  const int rank = comm->rank();
  const std::size_t recv_count = 1000;
  for (DType type : {DType::fp32, DType::int64}) {
    SCOPED_TRACE(describe(*comm, "ireduce_scatter beside send/recv", type, recv_count, true, false));
    SharedValues send = make_input(type, recv_count * static_cast<std::size_t>(n), rank);
    SharedValues recv = make_filled(type, recv_count, 99);
    zt::Work reducing = comm->ireduce_scatter(send->data(), recv->data(), recv_count, type, ReduceOp::sum);
    SharedValues out = make_input(type, recv_count, rank);
    SharedValues in = make_filled(type, recv_count, 99);
    const int previous = (rank + n - 1) % n;
    for (int tag : {0, 1, 2}) {
      zt::Work receiving = comm->irecv(in->data(), recv_count, type, previous, tag);
      comm->send(out->data(), recv_count, type, (rank + 1) % n, tag);
      receiving.wait();
      EXPECT_TRUE(matches(*in, 0, recv_count, [&](std::size_t i) { return input_value(type, previous, i); }));
    }
    reducing.wait();
    const std::size_t block = static_cast<std::size_t>(rank) * recv_count;
    EXPECT_TRUE(matches(*recv, 0, recv_count, [&](std::size_t i) {
      return reference_reduction(type, ReduceOp::sum, n,
                                 [&](int r) { return input_value(type, r, block + i); });
    }));
  }
}

// bf16/fp16 with random data: each pairwise combine rounds once to the 16-bit format, so for any
// reduction order the sum of n values is within gamma_{n-1} * sum|x_i| of the exact sum, where
// gamma_k = k*u / (1 - k*u) and u is the unit roundoff (2^-8 for bf16, 2^-11 for fp16) -- the
// classic bound for recursive/tree summation (Higham, Accuracy and Stability, section 4.2). The
// average divides that sum in fp32 and rounds once more: + u * |result|. fp16 adds an absolute
// half-ulp of its subnormals (2^-25) per rounding for results near zero. max is exact.
TEST(Collectives, SixteenBitRandomDataWithinRoundingBound) {
  auto world = make_world();
  const int n = world->size();
  const std::size_t count = 100003;
  auto random_input = [](DType type, int rank, std::size_t index) {
    std::uint64_t x = (static_cast<std::uint64_t>(rank) << 40) ^ (index * 0x9E3779B97F4A7C15ull);
    x ^= x >> 33;  // splitmix-style mixing, the same on every rank
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    const double uniform = static_cast<double>(x >> 11) * 0x1.0p-53;  // [0, 1)
    return round_to(type, 2.0 * uniform - 1.0);                       // [-1, 1], representable
  };
  for (DType type : {DType::bf16, DType::fp16}) {
    const double u = type == DType::bf16 ? 0x1.0p-8 : 0x1.0p-11;
    const double absolute = type == DType::fp16 ? n * 0x1.0p-25 : 0.0;
    const double k = n - 1;
    const double gamma = k * u / (1 - k * u);
    for (ReduceOp op : kAllOps) {
      SCOPED_TRACE(describe(*world, "all_reduce random", type, count, false, false, zt::reduce_op_name(op)));
      Values data(type, count);
      data.fill([&](std::size_t i) { return random_input(type, world->rank(), i); });
      world->all_reduce(data.data(), data.data(), count, type, op);
      std::size_t violations = 0;
      double worst_ratio = 0;
      for (std::size_t i = 0; i < count; ++i) {
        double exact = 0;
        double magnitude = 0;
        double maximum = -2;
        for (int r = 0; r < n; ++r) {
          const double x = random_input(type, r, i);
          exact += x;
          magnitude += std::abs(x);
          maximum = std::max(maximum, x);
        }
        const double got = data.get(i);
        double error = 0;
        double bound = 0;
        if (op == ReduceOp::max) {
          error = std::abs(got - maximum);
        } else if (op == ReduceOp::sum) {
          error = std::abs(got - exact);
          bound = gamma * magnitude + absolute;
        } else {
          error = std::abs(got - exact / n);
          bound = (gamma * magnitude + absolute) / n + u * (std::abs(got) + std::abs(exact / n)) + absolute;
        }
        if (error > bound) ++violations;
        if (bound > 0) worst_ratio = std::max(worst_ratio, error / bound);
      }
      EXPECT_EQ(violations, 0u) << "worst error / bound = " << worst_ratio;
    }
  }
}

TEST(Collectives, Barrier) {
  auto world = make_world();
  for (int i = 0; i < 3; ++i) world->barrier();
  EXPECT_EQ(world->traffic()[CommOp::barrier].calls, 3u);
  EXPECT_EQ(world->traffic()[CommOp::barrier].bytes, 0u);
}

TEST(Collectives, TrafficCountersFollowTheBusFactors) {
  auto world = make_world("traffic");
  const auto n = static_cast<std::uint64_t>(world->size());
  const int rank = world->rank();
  std::vector<float> floats(1000, 1.0f);
  world->all_reduce(floats.data(), floats.data(), 1000, DType::fp32, ReduceOp::sum);
  const zt::TrafficCounter& all_reduce = world->traffic()[CommOp::all_reduce];
  EXPECT_EQ(all_reduce.calls, 1u);
  EXPECT_EQ(all_reduce.bytes, 4000u);
  EXPECT_EQ(all_reduce.wire_bytes, 4000u * 2 * (n - 1) / n);  // 0, 4000, 6000 at 1, 2, 4 ranks
  EXPECT_GE(all_reduce.seconds, 0.0);

  std::vector<double> doubles(10 * n, 1.0);
  world->reduce_scatter(doubles.data(), doubles.data(), 10, DType::fp64, ReduceOp::sum);
  EXPECT_EQ(world->traffic()[CommOp::reduce_scatter].bytes, 80u * n);  // the whole input
  EXPECT_EQ(world->traffic()[CommOp::reduce_scatter].wire_bytes, 80u * (n - 1));

  std::vector<zt::bf16> halves(3 * n);
  world->all_gather(halves.data() + 3 * static_cast<std::size_t>(rank), halves.data(), 3, DType::bf16);
  EXPECT_EQ(world->traffic()[CommOp::all_gather].bytes, 6u * n);  // the whole output
  EXPECT_EQ(world->traffic()[CommOp::all_gather].wire_bytes, 6u * (n - 1));

  std::vector<std::int32_t> ints(5, 7);
  world->broadcast(ints.data(), 5, DType::int32, 0);
  EXPECT_EQ(world->traffic()[CommOp::broadcast].bytes, 20u);
  EXPECT_EQ(world->traffic()[CommOp::broadcast].wire_bytes, n > 1 ? 20u : 0u);

  const int next = (rank + 1) % world->size();
  const int previous = (rank + world->size() - 1) % world->size();
  std::vector<std::int64_t> message(4, rank), received(4);
  zt::Work sending = world->isend(message.data(), 4, DType::int64, next, 3);
  EXPECT_EQ(world->traffic()[CommOp::send].calls, 0u) << "counted when completed, not when started";
  world->recv(received.data(), 4, DType::int64, previous, 3);
  sending.wait();
  EXPECT_EQ(world->traffic()[CommOp::send].calls, 1u);
  EXPECT_EQ(world->traffic()[CommOp::send].bytes, 32u);
  EXPECT_EQ(world->traffic()[CommOp::send].wire_bytes, 32u);
  EXPECT_EQ(world->traffic()[CommOp::recv].bytes, 32u);

  world->barrier();
  const zt::TrafficCounter total = world->traffic().total();
  EXPECT_EQ(total.calls, 7u);
  EXPECT_EQ(total.bytes, 4000u + 80u * n + 6u * n + 20u + 32u + 32u);
  EXPECT_EQ(total.wire_bytes,
            4000u * 2 * (n - 1) / n + 80u * (n - 1) + 6u * (n - 1) + (n > 1 ? 20u : 0u) + 64u);
  world->reset_traffic();
  EXPECT_EQ(world->traffic().total().calls, 0u);
  EXPECT_EQ(world->traffic().total().bytes, 0u);
}

TEST(Collectives, ArgumentErrorsNameTheOperationCommunicatorAndRank) {
  auto comm = make_world("errors");
  const int n = comm->size();
  const std::string rank_text = "(rank " + std::to_string(comm->rank()) + " of " + std::to_string(n) + ")";
  std::vector<float> buffer(16 * static_cast<std::size_t>(n), 0.0f);
  // All of these fail the local checks before any communication, on every rank.
  expect_comm_error(
      [&] { comm->send(buffer.data(), 1, DType::fp32, n, 0); },
      {"send on communicator 'errors'", rank_text, "peer " + std::to_string(n) + " is out of range",
       "expected 0 <= peer < " + std::to_string(n)});
  expect_comm_error([&] { (void)comm->irecv(buffer.data(), 1, DType::fp32, -1, 0); },
                    {"recv on communicator 'errors'", "peer -1 is out of range"});
  expect_comm_error([&] { comm->send(buffer.data(), 1, DType::fp32, 0, -5); },
                    {"send", "tag -5 is negative"});
  int* tag_upper_bound = nullptr;
  int found = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_upper_bound, &found);
  if (found != 0 && *tag_upper_bound < INT32_MAX) {
    expect_comm_error([&] { comm->send(buffer.data(), 1, DType::fp32, 0, *tag_upper_bound + 1); },
                      {"send", "exceeds this MPI's MPI_TAG_UB"});
  }
  expect_comm_error(
      [&] { comm->broadcast(buffer.data(), 4, DType::fp32, n); },
      {"broadcast on communicator 'errors'", rank_text, "root " + std::to_string(n) + " is out of range"});
  expect_comm_error([&] { comm->all_reduce(nullptr, buffer.data(), 3, DType::fp32, ReduceOp::sum); },
                    {"all_reduce", "send buffer is null", "3 elements"});
  expect_comm_error(
      [&] { comm->all_reduce(buffer.data(), buffer.data() + 1, 4, DType::fp32, ReduceOp::sum); },
      {"all_reduce", "overlap"});
  expect_comm_error(
      [&] { comm->all_reduce(buffer.data(), buffer.data(), 4, static_cast<DType>(42), ReduceOp::sum); },
      {"all_reduce", "invalid dtype value 42"});
  expect_comm_error(
      [&] { comm->all_reduce(buffer.data(), buffer.data(), 4, DType::fp32, static_cast<ReduceOp>(9)); },
      {"all_reduce", "invalid reduce op value 9"});
  const std::vector<std::size_t> too_few(static_cast<std::size_t>(n) + 1, 1);
  expect_comm_error([&] { comm->all_gather_v(buffer.data(), 1, buffer.data() + 8, too_few, DType::fp32); },
                    {"all_gather_v on communicator 'errors'", rank_text,
                     "recv_counts has " + std::to_string(n + 1) + " entries; expected one per rank (" +
                         std::to_string(n) + ")"});
  std::vector<std::size_t> counts(static_cast<std::size_t>(n), 2);
  expect_comm_error(
      [&] { (void)comm->iall_gather_v(buffer.data(), 3, buffer.data() + 4, counts, DType::fp32); },
      {"all_gather_v",
       "recv_counts[" + std::to_string(comm->rank()) + "] is 2 but this rank sends send_count = 3"});
  expect_comm_error(
      [&] { comm->reduce_scatter(buffer.data(), buffer.data() + 1, 2, DType::fp32, ReduceOp::sum); },
      {"reduce_scatter", "overlap", "send == recv"});
  // Nothing was sent: the communicator is still usable and still consistent across ranks.
  comm->barrier();
  EXPECT_EQ(comm->traffic()[CommOp::send].calls, 0u);
}

TEST(Collectives, MessageLengthMismatchesAreErrors) {
  auto comm = make_world("p2p");
  const int rank = comm->rank();
  const int next = (rank + 1) % comm->size();
  const int previous = (rank + comm->size() - 1) % comm->size();
  std::vector<std::int32_t> out(10, rank), in(10, -1);
  {  // shorter than asked: caught by our count check
    zt::Work sending = comm->isend(out.data(), 5, DType::int32, next, 1);
    expect_comm_error([&] { comm->recv(in.data(), 10, DType::int32, previous, 1); },
                      {"recv on communicator 'p2p'",
                       "expected 10 elements from peer " + std::to_string(previous), "the message had 5"});
    sending.wait();
  }
  {  // longer than the buffer: MPI's truncation error, returned (not fatal) and named
    zt::Work sending = comm->isend(out.data(), 10, DType::int32, next, 2);
    zt::Work receiving = comm->irecv(in.data(), 5, DType::int32, previous, 2);
    expect_comm_error([&] { receiving.wait(); }, {"MPI_Wait completing recv", "communicator 'p2p'"});
    EXPECT_TRUE(receiving.completed());
    sending.wait();
  }
  comm->barrier();
}

TEST(Collectives, WorkTestPollsUntilDone) {
  auto world = make_world();
  const int rank = world->rank();
  const int n = world->size();
  const std::size_t count = 200000;
  std::vector<float> data(count, static_cast<float>(rank + 1));
  zt::Work work = world->iall_reduce(data.data(), data.data(), count, DType::fp32, ReduceOp::sum);
  EXPECT_FALSE(work.completed());
  long polls = 0;
  while (!work.test()) ++polls;
  EXPECT_TRUE(work.completed());
  EXPECT_TRUE(work.test()) << "a completed handle stays completed";
  const float expected = static_cast<float>(n * (n + 1) / 2);
  EXPECT_EQ(std::count(data.begin(), data.end(), expected), static_cast<long>(count));
  EXPECT_EQ(world->traffic()[CommOp::all_reduce].calls, 1u);
  if (rank == 0) std::printf("[          ] completed after %ld test() calls\n", polls);

  zt::Work empty;
  EXPECT_TRUE(empty.completed());
  EXPECT_TRUE(empty.test());
  empty.wait();
}

TEST(Collectives, WorkDestructorWaits) {
  auto world = make_world();
  const int n = world->size();
  std::vector<double> data(50000, 2.0);
  {
    zt::Work abandoned =
        world->iall_reduce(data.data(), data.data(), data.size(), DType::fp64, ReduceOp::avg);
  }  // ~Work waits, divides the average and records the traffic
  EXPECT_EQ(std::count(data.begin(), data.end(), 2.0), static_cast<long>(data.size()));
  EXPECT_EQ(world->traffic()[CommOp::all_reduce].calls, 1u);

  // Move-assignment over a pending handle completes the overwritten operation first.
  std::vector<std::int64_t> first(1000, 1), second(1000, 3);
  zt::Work work = world->iall_reduce(first.data(), first.data(), first.size(), DType::int64, ReduceOp::sum);
  work = world->iall_reduce(second.data(), second.data(), second.size(), DType::int64, ReduceOp::max);
  EXPECT_EQ(world->traffic()[CommOp::all_reduce].calls, 2u);
  EXPECT_EQ(first[999], n);
  zt::Work moved = std::move(work);
  EXPECT_TRUE(work.completed());  // NOLINT(bugprone-use-after-move): moved-from is documented empty
  moved.wait();
  EXPECT_EQ(second[0], 3);
  EXPECT_EQ(world->traffic()[CommOp::all_reduce].calls, 3u);
}

TEST(Collectives, CommunicatorIsADuplicate) {
  auto world = make_world("dup-check");
  EXPECT_EQ(world->backend(), zt::CommBackend::mpi);
  EXPECT_EQ(world->device(), zt::Device::host());
  MPI_Comm native = zt::native_mpi_comm(*world);
  int comparison = MPI_UNEQUAL;
  MPI_Comm_compare(native, MPI_COMM_WORLD, &comparison);
  EXPECT_EQ(comparison, MPI_CONGRUENT)
      << "same group, different context: our traffic never mixes with the caller's";
  char name[MPI_MAX_OBJECT_NAME];
  int length = 0;
  MPI_Comm_get_name(native, name, &length);
  EXPECT_EQ(std::string(name, static_cast<std::size_t>(length)), "dup-check");
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  EXPECT_EQ(world->rank(), rank);
  expect_comm_error([] { (void)zt::make_mpi_communicator(MPI_COMM_NULL, "null"); },
                    {"make_mpi_communicator('null')", "MPI_COMM_NULL"});
}

TEST(Collectives, Names) {
  EXPECT_EQ(zt::reduce_op_name(ReduceOp::avg), "avg");
  EXPECT_EQ(zt::comm_backend_name(zt::CommBackend::nccl), "nccl");
  EXPECT_EQ(zt::comm_op_name(CommOp::all_gather_v), "all_gather_v");
  EXPECT_EQ(zt::comm_op_name(CommOp::reduce_scatter), "reduce_scatter");
}

}  // namespace
