// zerotrain's MPI communicator against raw MPI, measured in the same run.
//
// For all_reduce, reduce_scatter, all_gather (out of place and in place) and broadcast (fp32, sum) at
// sizes from 4 KiB to 64 MiB, both run on the same MPI_Comm (the communicator's own duplicate) with
// the same buffers (first touched before timing) and the same in/out-of-place choice, interleaved
// call by call so that both see the same
// machine load: a block makes `iters` pairs of calls, zerotrain and raw alternating, each timed on its
// own; a block's time per call is the maximum over ranks of the per-rank mean, and a size's figure
// is the median over blocks.
//
// all_gather is out of place (separate send and receive buffers: MPI also copies the rank's own block
// into the receive buffer); all_gather_in_place passes the rank's own block inside the receive buffer,
// which zerotrain turns into MPI_IN_PLACE and the raw side calls with MPI_IN_PLACE, as the engine's
// parameter gathers do. At 2 ranks and 64 MiB the local copy made the out-of-place call ~1.5-2x slower
// (docs/benchmarks.md), so the two are separate rows. bench/mpi_allgather_anchor.c is the same
// measurement in a plain MPI program, without zerotrain's runtime: the outside anchor for both.
//
// Sizes and bandwidths follow NCCL-tests: S is the all_reduce/broadcast buffer, the whole
// reduce_scatter input and the whole all_gather output; algbw = S / t; busbw = algbw times
// 2(n-1)/n (all_reduce), (n-1)/n (reduce_scatter, all_gather) or 1 (broadcast). The ratio column is
// zerotrain busbw / raw busbw = raw time / zerotrain time, taken per block (both sides of a block
// ran interleaved, under the same load) and then the median over blocks.
//
//   mpirun -n 4 zt_bench_collectives [--quick] [--min-bytes 4K] [--max-bytes 64M] [--iters N]
//                                    [--blocks B] [--ops all_reduce,all_gather_in_place] [--json PATH]
//                                    [--raw-vs-raw] [--ring-min-bytes 4M] [--ring-chunk 1M] [--ring-lanes 2]
//
// --raw-vs-raw runs raw MPI in both columns: its ratios show how far this machine's noise alone
// moves the ratio, the yardstick for reading the real run. --ring-* set when zerotrain's
// reduce_scatter takes its own ring and how it pipelines (mpi_layer/mpi_communicator_testing.hpp):
// the measurements behind the defaults.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mpi_layer/mpi_communicator_testing.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/mpi_communicator.hpp"
#include "zerotrain/runtime.hpp"

namespace {

struct Options {
  std::size_t min_bytes = 4 << 10;
  std::size_t max_bytes = 64 << 20;
  int fixed_iterations = 0;  // 0: adapt to the size
  int blocks = 5;
  double block_seconds = 0.06;  // aim per block when adapting iterations
  std::vector<std::string> ops = {"all_reduce", "reduce_scatter", "all_gather", "all_gather_in_place",
                                  "broadcast"};
  std::string json_path;
  bool raw_vs_raw = false;  // calibration: both columns run raw MPI, so the ratios show the noise
  zt::detail::RingReduceScatterSettings ring;  // --ring-*: reduce_scatter's ring (the defaults otherwise)
};

std::size_t parse_bytes(std::string_view text) {
  std::size_t multiplier = 1;
  if (!text.empty()) {
    switch (text.back()) {
      case 'K':
      case 'k':
        multiplier = std::size_t{1} << 10;
        break;
      case 'M':
      case 'm':
        multiplier = std::size_t{1} << 20;
        break;
      case 'G':
      case 'g':
        multiplier = std::size_t{1} << 30;
        break;
      default:
        break;
    }
    if (multiplier != 1) text.remove_suffix(1);
  }
  char* end = nullptr;
  const std::string digits(text);
  const unsigned long long value = std::strtoull(digits.c_str(), &end, 10);
  ZT_CHECK(!digits.empty() && end != nullptr && *end == '\0', "cannot read '", text,
           "' as a byte count; expected e.g. 4096, 64K, 16M or 1G");
  return static_cast<std::size_t>(value) * multiplier;
}

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = text.find(',', start);
    const std::size_t end = comma == std::string::npos ? text.size() : comma;
    if (end > start) parts.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return parts;
}

Options parse_options(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    auto value = [&]() -> std::string {
      ZT_CHECK(i + 1 < argc, "option ", arg, " needs a value");
      return argv[++i];
    };
    if (arg == "--quick") {
      options.max_bytes = std::min<std::size_t>(options.max_bytes, 4 << 20);
      options.blocks = 3;
      options.block_seconds = 0.02;
    } else if (arg == "--min-bytes") {
      options.min_bytes = parse_bytes(value());
    } else if (arg == "--max-bytes") {
      options.max_bytes = parse_bytes(value());
    } else if (arg == "--iters") {
      options.fixed_iterations = std::stoi(value());
      ZT_CHECK(options.fixed_iterations > 0, "--iters must be positive");
    } else if (arg == "--blocks") {
      options.blocks = std::stoi(value());
      ZT_CHECK(options.blocks > 0, "--blocks must be positive");
    } else if (arg == "--ops") {
      options.ops = split_commas(value());
    } else if (arg == "--raw-vs-raw") {
      options.raw_vs_raw = true;
    } else if (arg == "--ring-min-bytes") {
      options.ring.min_bytes = parse_bytes(value());
    } else if (arg == "--ring-chunk") {
      options.ring.chunk_bytes = parse_bytes(value());
    } else if (arg == "--ring-lanes") {
      options.ring.lanes = std::stoi(value());
    } else if (arg == "--json") {
      options.json_path = value();
    } else if (arg == "--help" || arg == "-h") {
      std::printf(
          "usage: zt_bench_collectives [--quick] [--min-bytes 4K] [--max-bytes 64M] [--iters N] [--blocks "
          "B]\n"
          "                            [--ops "
          "all_reduce,reduce_scatter,all_gather,all_gather_in_place,broadcast]\n"
          "                            [--json PATH] [--raw-vs-raw] [--ring-min-bytes 4M] [--ring-chunk 1M]\n"
          "                            [--ring-lanes 2]\n");
      std::exit(0);
    } else {
      ZT_THROW("unknown option '", arg, "'; see --help");
    }
  }
  for (const std::string& op : options.ops) {
    ZT_CHECK(op == "all_reduce" || op == "reduce_scatter" || op == "all_gather" ||
                 op == "all_gather_in_place" || op == "broadcast",
             "unknown collective '", op,
             "' in --ops; expected all_reduce, reduce_scatter, all_gather, all_gather_in_place, broadcast");
  }
  return options;
}

/// One collective at one size: the zerotrain call and the raw MPI call on the same comm and buffers.
struct Benchmark {
  std::string op;
  std::size_t bytes = 0;  // S as NCCL-tests define it
  std::size_t count = 0;  // elements per rank passed to the call
  double bus_factor = 1.0;
  std::function<void()> zerotrain;
  std::function<void()> raw;
};

struct Result {
  std::string op;
  std::size_t bytes = 0;
  std::size_t count = 0;
  int iterations = 0;
  double zerotrain_seconds = 0;
  double raw_seconds = 0;
  double ratio = 1;  // median over blocks of raw time / zerotrain time, both from the same block
  double bus_factor = 1;
};

/// The fastest of `calls` individually timed raw calls, the slowest rank's (sizes the blocks; the
/// minimum, because on a shared machine a single slow call would otherwise shrink every block).
double fastest_raw_call(const Benchmark& bench, int calls, MPI_Comm comm) {
  double fastest = 1e30;
  for (int i = 0; i < calls; ++i) {
    MPI_Barrier(comm);
    const auto start = std::chrono::steady_clock::now();
    bench.raw();
    fastest =
        std::min(fastest, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  MPI_Allreduce(MPI_IN_PLACE, &fastest, 1, MPI_DOUBLE, MPI_MAX, comm);
  return fastest;
}

/// One block: `iterations` pairs of calls, zerotrain and raw alternating (which goes first
/// alternates from pair to pair and from block to block), each call timed on its own, so both sides see the
/// same machine load at the finest grain. Returns {zerotrain, raw} seconds per call, each the slowest rank's.
std::pair<double, double> time_block(const Benchmark& bench, int iterations, int block, MPI_Comm comm) {
  using Clock = std::chrono::steady_clock;
  MPI_Barrier(comm);
  double sums[2] = {0.0, 0.0};  // zerotrain, raw
  for (int i = 0; i < iterations; ++i) {
    for (int half = 0; half < 2; ++half) {
      const bool zerotrain_now = (half == 0) == ((i + block) % 2 == 0);
      const auto start = Clock::now();
      if (zerotrain_now) {
        bench.zerotrain();
      } else {
        bench.raw();
      }
      sums[zerotrain_now ? 0 : 1] += std::chrono::duration<double>(Clock::now() - start).count();
    }
  }
  MPI_Allreduce(MPI_IN_PLACE, sums, 2, MPI_DOUBLE, MPI_MAX, comm);
  return {sums[0] / iterations, sums[1] / iterations};
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t middle = values.size() / 2;
  return values.size() % 2 == 1 ? values[middle] : 0.5 * (values[middle - 1] + values[middle]);
}

Result measure(const Benchmark& bench, const Options& options, MPI_Comm comm) {
  // Warm up both (connections, registration, first-touch), then size the blocks from a few raw calls.
  const int warmup = bench.bytes >= (std::size_t{16} << 20) ? 1 : 3;
  for (int i = 0; i < warmup; ++i) {
    bench.raw();
    bench.zerotrain();
  }
  int iterations = options.fixed_iterations;
  if (iterations == 0) {
    const double estimate = std::max(fastest_raw_call(bench, warmup, comm), 1e-7);
    // Half the block per side; every rank must make the same number of calls: rank 0 decides.
    iterations = std::clamp(static_cast<int>(options.block_seconds / (2 * estimate)), 1, 1000);
    MPI_Bcast(&iterations, 1, MPI_INT, 0, comm);
  }
  std::vector<double> zerotrain_times;
  std::vector<double> raw_times;
  std::vector<double> ratios;
  for (int block = 0; block < options.blocks; ++block) {
    const auto [zerotrain_seconds, raw_seconds] = time_block(bench, iterations, block, comm);
    zerotrain_times.push_back(zerotrain_seconds);
    raw_times.push_back(raw_seconds);
    ratios.push_back(raw_seconds / zerotrain_seconds);
  }
  Result result;
  result.op = bench.op;
  result.bytes = bench.bytes;
  result.count = bench.count;
  result.iterations = iterations;
  result.zerotrain_seconds = median(zerotrain_times);
  result.raw_seconds = median(raw_times);
  result.ratio = median(ratios);
  result.bus_factor = bench.bus_factor;
  return result;
}

/// Buffers of one size, reused by both sides.
struct Buffers {
  std::vector<float> send;
  std::vector<float> recv;
};

Benchmark make_benchmark(const std::string& op, std::size_t target_bytes, zt::Communicator& comm,
                         Buffers& buffers) {
  const auto n = static_cast<std::size_t>(comm.size());
  const MPI_Comm raw_comm = zt::native_mpi_comm(comm);
  const double ranks = static_cast<double>(n);
  Benchmark bench;
  bench.op = op;
  const std::size_t elements = target_bytes / sizeof(float);
  if (op == "all_reduce" || op == "broadcast") {
    bench.count = elements;
    bench.bytes = elements * sizeof(float);
    buffers.send.assign(elements, 1.0f);
    buffers.recv.assign(elements, 0.0f);
  } else {  // reduce_scatter and all_gather: S is n blocks of `count`
    bench.count = elements / n;
    bench.bytes = bench.count * n * sizeof(float);
    buffers.send.assign(op == "reduce_scatter" ? bench.count * n : bench.count, 1.0f);
    buffers.recv.assign(op == "reduce_scatter" ? bench.count : bench.count * n, 0.0f);
  }
  // assign() wrote every element: the pages are touched (by this rank) before any timed call.
  float* send = buffers.send.data();
  float* recv = buffers.recv.data();
  const std::size_t count = bench.count;
  const int mpi_count = static_cast<int>(count);
  if (op == "all_reduce") {
    bench.bus_factor = 2.0 * (ranks - 1) / ranks;
    bench.zerotrain = [&comm, send, recv, count] {
      comm.all_reduce(send, recv, count, zt::DType::fp32, zt::ReduceOp::sum);
    };
    bench.raw = [=] { MPI_Allreduce(send, recv, mpi_count, MPI_FLOAT, MPI_SUM, raw_comm); };
  } else if (op == "reduce_scatter") {
    bench.bus_factor = (ranks - 1) / ranks;
    bench.zerotrain = [&comm, send, recv, count] {
      comm.reduce_scatter(send, recv, count, zt::DType::fp32, zt::ReduceOp::sum);
    };
    bench.raw = [=] { MPI_Reduce_scatter_block(send, recv, mpi_count, MPI_FLOAT, MPI_SUM, raw_comm); };
  } else if (op == "all_gather") {
    bench.bus_factor = (ranks - 1) / ranks;
    bench.zerotrain = [&comm, send, recv, count] { comm.all_gather(send, recv, count, zt::DType::fp32); };
    bench.raw = [=] { MPI_Allgather(send, mpi_count, MPI_FLOAT, recv, mpi_count, MPI_FLOAT, raw_comm); };
  } else if (op == "all_gather_in_place") {
    bench.bus_factor = (ranks - 1) / ranks;
    float* own_block = recv + static_cast<std::size_t>(comm.rank()) * count;  // zerotrain: MPI_IN_PLACE
    bench.zerotrain = [&comm, own_block, recv, count] {
      comm.all_gather(own_block, recv, count, zt::DType::fp32);
    };
    bench.raw = [=] {
      MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, mpi_count, MPI_FLOAT, raw_comm);
    };
  } else {
    bench.bus_factor = 1.0;
    bench.zerotrain = [&comm, send, count] { comm.broadcast(send, count, zt::DType::fp32, 0); };
    bench.raw = [=] { MPI_Bcast(send, mpi_count, MPI_FLOAT, 0, raw_comm); };
  }
  return bench;
}

std::string human_bytes(std::size_t bytes) {
  char text[32];
  if (bytes >= (std::size_t{1} << 20) && bytes % (std::size_t{1} << 20) == 0) {
    std::snprintf(text, sizeof text, "%zu MiB", bytes >> 20);
  } else if (bytes >= 1024 && bytes % 1024 == 0) {
    std::snprintf(text, sizeof text, "%zu KiB", bytes >> 10);
  } else {
    std::snprintf(text, sizeof text, "%zu B", bytes);
  }
  return text;
}

int run(zt::Runtime& runtime, int argc, char** argv) {
  const Options options = parse_options(argc, argv);
  auto comm = zt::make_mpi_communicator(runtime.world_comm(), "bench");
  zt::detail::set_mpi_ring_reduce_scatter(*comm, options.ring);
  const MPI_Comm raw_comm = zt::native_mpi_comm(*comm);
  const bool root = comm->rank() == 0;
  if (root) {
    std::printf("zerotrain collectives vs raw MPI: %d rank(s) on %d node(s), %s\n", comm->size(),
                runtime.node_count(), zt::Runtime::mpi_library_version().c_str());
    std::printf(
        "fp32 sum; median of %d interleaved blocks; per-call time = max over ranks; GB/s = 1e9 B/s\n\n",
        options.blocks);
    std::printf("%-19s %9s %11s %6s | %10s %8s %8s | %10s %8s %8s | %7s\n", "collective", "size", "count",
                "iters", "zt us", "algbw", "busbw", "raw us", "algbw", "busbw", "zt/raw");
  }
  std::vector<Result> results;
  Buffers buffers;
  for (const std::string& op : options.ops) {
    for (std::size_t bytes = options.min_bytes; bytes <= options.max_bytes; bytes *= 4) {
      Benchmark bench = make_benchmark(op, bytes, *comm, buffers);
      if (options.raw_vs_raw) bench.zerotrain = bench.raw;
      if (bench.count == 0) continue;
      const Result result = measure(bench, options, raw_comm);
      results.push_back(result);
      if (root) {
        const double zt_algbw = static_cast<double>(result.bytes) / result.zerotrain_seconds / 1e9;
        const double raw_algbw = static_cast<double>(result.bytes) / result.raw_seconds / 1e9;
        std::printf("%-19s %9s %11zu %6d | %10.1f %8.3f %8.3f | %10.1f %8.3f %8.3f | %6.2fx\n", op.c_str(),
                    human_bytes(result.bytes).c_str(), result.count, result.iterations,
                    result.zerotrain_seconds * 1e6, zt_algbw, zt_algbw * result.bus_factor,
                    result.raw_seconds * 1e6, raw_algbw, raw_algbw * result.bus_factor, result.ratio);
        std::fflush(stdout);
      }
    }
  }
  if (root && !options.json_path.empty()) {
    nlohmann::json report;
    report["benchmark"] = "collectives";
    report["ranks"] = comm->size();
    report["nodes"] = runtime.node_count();
    report["mpi"] = zt::Runtime::mpi_library_version();
    report["dtype"] = "fp32";
    report["blocks"] = options.blocks;
    report["raw_vs_raw"] = options.raw_vs_raw;
    report["results"] = nlohmann::json::array();
    for (const Result& r : results) {
      const double zt_algbw = static_cast<double>(r.bytes) / r.zerotrain_seconds / 1e9;
      const double raw_algbw = static_cast<double>(r.bytes) / r.raw_seconds / 1e9;
      report["results"].push_back({{"collective", r.op},
                                   {"bytes", r.bytes},
                                   {"count", r.count},
                                   {"iterations", r.iterations},
                                   {"zerotrain_us", r.zerotrain_seconds * 1e6},
                                   {"zerotrain_algbw_gbps", zt_algbw},
                                   {"zerotrain_busbw_gbps", zt_algbw * r.bus_factor},
                                   {"raw_us", r.raw_seconds * 1e6},
                                   {"raw_algbw_gbps", raw_algbw},
                                   {"raw_busbw_gbps", raw_algbw * r.bus_factor},
                                   {"ratio", r.ratio}});
    }
    std::ofstream out(options.json_path);
    ZT_CHECK(out.good(), "cannot open '", options.json_path, "' for writing");
    out << report.dump(2) << "\n";
    std::printf("\nwrote %s\n", options.json_path.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  zt::Runtime runtime(&argc, &argv);
  return zt::run_and_report([&] { return run(runtime, argc, argv); });
}
