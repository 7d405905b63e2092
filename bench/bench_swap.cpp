// NVMe swap bandwidth: sequential O_DIRECT writes and reads of one swap region through zt::SwapEngine,
// and how much of the I/O the double-buffered SwapPipeline hides behind work.
//
//   zt_bench_swap [--path DIR] [--size-mib N] [--block-size-kib K] [--queue-depth Q] [--backend B]
//                 [--intra-op P] [--repeats R] [--pipeline]
//
// Bandwidth: one region of N MiB (1024), written once to warm up (so measured writes overwrite
// allocated blocks, as the optimizer does after its first step and as fio does on an existing file),
// then R times written and read in full, each pass as requests of up to 256 MiB issued together and
// waited for at the end. The block size and queue depth are the engine's (aio.block_size,
// aio.queue_depth); bench/run_swap_vs_fio.sh runs fio with the same ones on the same file system.
// Prints each pass and the medians, and a last line `RESULT backend=... write_gib_s=... read_gib_s=...`.
//
// --pipeline: 8 groups of N/8 MiB, a work function that reads and writes each group's floats a few
// times (about as long as its I/O), run with 1 buffer (everything in turn) and 3 buffers (read ahead,
// write behind); prints wall time, work time and the time stalled on I/O for both.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "base/seconds_since.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/swap.hpp"

namespace {

using zt::base::Clock;
using zt::base::seconds_since;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr std::size_t kMiB = 1 << 20;

/// "prefix" followed by the number (built by appending: GCC 12 warns falsely on "literal" + string).
std::string numbered(const char* prefix, long long number) {
  std::string name(prefix);
  name += std::to_string(number);
  return name;
}

struct Arguments {
  std::string path = "/tmp";
  std::size_t size_mib = 1024;
  std::size_t block_size_kib = 1024;
  std::size_t queue_depth = 8;
  std::size_t intra_op = 1;
  zt::SwapBackend backend = zt::SwapBackend::automatic;
  int repeats = 3;
  bool pipeline = false;
};

Arguments parse(int argc, char** argv) {
  Arguments arguments;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      ZT_CHECK(i + 1 < argc, flag, " needs a value");
      return argv[++i];
    };
    if (flag == "--path") {
      arguments.path = value();
    } else if (flag == "--size-mib") {
      arguments.size_mib = std::stoul(value());
    } else if (flag == "--block-size-kib") {
      arguments.block_size_kib = std::stoul(value());
    } else if (flag == "--queue-depth") {
      arguments.queue_depth = std::stoul(value());
    } else if (flag == "--intra-op") {
      arguments.intra_op = std::stoul(value());
    } else if (flag == "--backend") {
      arguments.backend = zt::swap_backend_from_string(value());
    } else if (flag == "--repeats") {
      arguments.repeats = std::stoi(value());
    } else if (flag == "--pipeline") {
      arguments.pipeline = true;
    } else {
      ZT_THROW("unknown argument ", flag,
               "; see the usage at the top of bench/bench_swap.cpp (--path, --size-mib, --block-size-kib, "
               "--queue-depth, --backend, --intra-op, --repeats, --pipeline)");
    }
  }
  return arguments;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

/// One sequential pass over [0, bytes) of the region in requests of the buffer's size; GiB/s.
double pass(zt::SwapEngine& engine, bool is_write, std::uint64_t offset, std::size_t bytes,
            zt::Buffer& buffer) {
  const Clock::time_point start = Clock::now();
  for (std::size_t done = 0; done < bytes; done += buffer.size()) {
    const std::size_t count = std::min(buffer.size(), bytes - done);
    if (is_write) {
      engine.write(offset + done, buffer.data(), count);
    } else {
      engine.read(offset + done, buffer.data(), count);
    }
  }
  engine.wait_all();
  return static_cast<double>(bytes) / kGiB / seconds_since(start);
}

/// Memory-bound work of a chosen length on a group's floats (an optimizer step stands in here).
void busy_work(std::span<std::byte> data, int sweeps) {
  auto* values = reinterpret_cast<float*>(data.data());
  const std::size_t count = data.size() / sizeof(float);
  for (int sweep = 0; sweep < sweeps; ++sweep) {
    for (std::size_t i = 0; i < count; ++i) values[i] = values[i] * 0.999f + 0.001f;
  }
}

void run_pipeline(zt::SwapEngine& engine, const Arguments& arguments) {
  constexpr std::size_t kGroups = 8;
  const std::size_t group_bytes = std::max<std::size_t>(arguments.size_mib / kGroups, 1) * kMiB;
  std::vector<std::string> names;
  for (std::size_t g = 0; g < kGroups; ++g) {
    names.push_back(numbered("group.", g));
    engine.register_tensor(names.back(), group_bytes);
  }
  // Calibrate the work to take about as long as reading and writing one group.
  zt::Buffer probe = engine.allocate_buffer(group_bytes);
  std::memset(probe.data(), 0, group_bytes);
  Clock::time_point start = Clock::now();
  engine.wait(engine.swap_out(names[0], probe.data()));
  engine.wait(engine.swap_in(names[0], probe.data()));
  const double io_seconds = seconds_since(start);
  start = Clock::now();
  busy_work({probe.as<std::byte>(), group_bytes}, 1);
  const double sweep_seconds = seconds_since(start);
  const int sweeps = std::max(1, static_cast<int>(io_seconds / sweep_seconds + 0.5));
  for (const std::string& name : names) engine.wait(engine.swap_out(name, probe.data()));

  std::printf(
      "pipeline: %zu groups of %zu MiB, work = %d sweeps per group (I/O of one group %.1f ms, one sweep %.1f "
      "ms)\n",
      kGroups, group_bytes / kMiB, sweeps, io_seconds * 1e3, sweep_seconds * 1e3);
  for (std::size_t buffers : {1, 3}) {
    zt::SwapPipeline pipeline(engine, names, buffers);
    std::vector<double> wall, work, stalled;
    for (int r = 0; r < arguments.repeats; ++r) {
      const auto stats =
          pipeline.run([&](std::size_t, std::span<std::byte> data) { busy_work(data, sweeps); });
      wall.push_back(stats.wall_seconds);
      work.push_back(stats.work_seconds);
      stalled.push_back(stats.stalled_seconds);
    }
    std::printf("pipeline buffers=%zu: wall %.3f s, work %.3f s, stalled on I/O %.3f s (medians of %d)\n",
                buffers, median(wall), median(work), median(stalled), arguments.repeats);
  }
}

int run(int argc, char** argv) {
  const Arguments arguments = parse(argc, argv);
  zt::SwapOptions options;
  options.nvme_path = arguments.path;
  options.backend = arguments.backend;
  options.block_size = arguments.block_size_kib * 1024;
  options.queue_depth = arguments.queue_depth;
  options.intra_op_parallelism = arguments.intra_op;
  zt::SwapEngine engine(options);
  std::printf(
      "swap engine: backend %s%s%s, O_DIRECT %s, block %zu KiB, queue depth %zu, intra-op %zu, file %s\n",
      std::string(zt::to_string(engine.backend())).c_str(), engine.backend_note().empty() ? "" : " ",
      engine.backend_note().c_str(), engine.direct_io() ? "yes" : "no", arguments.block_size_kib,
      arguments.queue_depth, arguments.intra_op, engine.file_path().c_str());

  if (arguments.pipeline) {
    run_pipeline(engine, arguments);
    return 0;
  }

  const std::size_t bytes = arguments.size_mib * kMiB;
  const std::uint64_t offset = engine.reserve(bytes);
  zt::Buffer buffer = engine.allocate_buffer(std::min<std::size_t>(bytes, 256 * kMiB));
  std::memset(buffer.data(), 0x5A, buffer.size());
  pass(engine, true, offset, bytes, buffer);  // warm-up: allocate the blocks
  std::vector<double> writes, reads;
  for (int r = 0; r < arguments.repeats; ++r) {
    writes.push_back(pass(engine, true, offset, bytes, buffer));
    reads.push_back(pass(engine, false, offset, bytes, buffer));
    std::printf("pass %d: write %.3f GiB/s, read %.3f GiB/s\n", r + 1, writes.back(), reads.back());
  }
  std::printf(
      "RESULT backend=%s block_kib=%zu queue_depth=%zu size_mib=%zu write_gib_s=%.4f read_gib_s=%.4f\n",
      std::string(zt::to_string(engine.backend())).c_str(), arguments.block_size_kib, arguments.queue_depth,
      arguments.size_mib, median(writes), median(reads));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "%s\n", error.what());
    return 1;
  }
}
