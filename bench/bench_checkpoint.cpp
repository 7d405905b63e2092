// Checkpoint write and read bandwidth against plain sequential O_DIRECT I/O of the same bytes, in the
// same run, on the same file system.
//
//   mpirun -n N zt_bench_checkpoint [--path DIR] [--d-model D] [--layers L] [--stage S] [--rounds R]
//                                   [--block-size-mib B]
//
// A GPT (byte vocabulary, sequence 64; d_model 512 and 8 layers by default: 25.3 M parameters, a
// 304 MB checkpoint of fp32 parameters and two AdamW moments) trains one step on N ranks at ZeRO stage
// S (1), then every round does, in an order that alternates between rounds:
//   save    Engine::save_checkpoint: collective parallel-HDF5 write of every rank's pieces, then
//           rank 0 fsyncs the file, renames it and writes `latest` (docs/checkpoint-format.md);
//   load    the file's pages dropped from the page cache (posix_fadvise DONTNEED, so the read is
//           cold), then Engine::load_checkpoint (reads, checksums, conversion);
//   write   every rank writes its share of the same byte count (the checkpoint file's size / N) to
//           its own new file in DIR with O_DIRECT pwrite of B MiB (4) aligned blocks, fsync, close;
//   read    the same files read back with O_DIRECT;
//   and, as a second anchor that separates the page cache's share from HDF5's and MPI-IO's, the same
//   bytes written with plain buffered pwrite + fsync and read back cold (after POSIX_FADV_DONTNEED).
// Each operation is timed from a barrier to a barrier (the slowest rank); MB/s = 10^6 B/s of the
// bytes each side moved. Prints every round, the medians, and a line `RESULT ranks=... save_mb_s=...`
// with the median of the per-round ratios. Files live in a fresh directory under DIR (default /tmp)
// and are removed at the end.
#include <fcntl.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_helpers.hpp"
#include "zerotrain/checkpoint.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/runtime.hpp"
#include "zerotrain/swap.hpp"
#include "zerotrain/trainer.hpp"

namespace {

namespace fs = std::filesystem;
constexpr std::size_t kMiB = 1 << 20;
constexpr std::size_t kAlignment = 4096;

struct Arguments {
  std::string path = "/tmp";
  int d_model = 512;
  int layers = 8;
  int stage = 1;
  int rounds = 5;
  std::size_t block_mib = 4;
};

Arguments parse(int argc, char** argv) {
  Arguments arguments;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    ZT_CHECK_AS(zt::ConfigError, i + 1 < argc, flag, " needs a value");
    const std::string value = argv[++i];
    if (flag == "--path") {
      arguments.path = value;
    } else if (flag == "--d-model") {
      arguments.d_model = std::stoi(value);
    } else if (flag == "--layers") {
      arguments.layers = std::stoi(value);
    } else if (flag == "--stage") {
      arguments.stage = std::stoi(value);
    } else if (flag == "--rounds") {
      arguments.rounds = std::stoi(value);
    } else if (flag == "--block-size-mib") {
      arguments.block_mib = std::stoul(value);
    } else {
      ZT_THROW_AS(zt::ConfigError, "unknown argument ", flag,
                  "; see the usage at the top of bench/bench_checkpoint.cpp (--path, --d-model, --layers, "
                  "--stage, --rounds, --block-size-mib)");
    }
  }
  ZT_CHECK_AS(zt::ConfigError, arguments.rounds >= 1 && arguments.block_mib >= 1,
              "--rounds and --block-size-mib: at least 1");
  return arguments;
}

std::string config_text(const Arguments& arguments) {
  return R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
    "zero_optimization": {"stage": )" +
         std::to_string(arguments.stage) + R"(},
    "model": {"type": "gpt", "n_layer": )" +
         std::to_string(arguments.layers) + R"(, "n_head": 8, "d_model": )" +
         std::to_string(arguments.d_model) +
         R"(, "seq_len": 64, "vocab_size": 256},
    "data": {"format": "builtin", "seed": 1}, "seed": 1})";
}

/// A buffer aligned for O_DIRECT, freed with std::free.
struct AlignedFree {
  void operator()(std::byte* data) const { std::free(data); }
};
using AlignedBuffer = std::unique_ptr<std::byte, AlignedFree>;

AlignedBuffer aligned_buffer(std::size_t bytes) {
  auto* data = static_cast<std::byte*>(std::aligned_alloc(kAlignment, bytes));
  ZT_CHECK_AS(zt::IoError, data != nullptr, "cannot allocate ", bytes, " aligned bytes");
  return AlignedBuffer(data);
}

/// A file descriptor closed on scope exit.
class Fd {
 public:
  Fd(const std::string& path, int flags) : fd_(::open(path.c_str(), flags, 0600)), path_(path) {
    ZT_CHECK_AS(zt::IoError, fd_ >= 0, "cannot open '", path, "': ", std::strerror(errno),
                errno == EINVAL ? " (does this file system support O_DIRECT?)" : "");
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  const std::string& path() const { return path_; }

 private:
  int fd_;
  std::string path_;
};

/// Sequential O_DIRECT pwrite (with fsync) or pread of `bytes` (a multiple of 4096) in blocks.
/// Without `direct`, the same through the page cache; a buffered read is made cold first.
void direct_pass(const std::string& path, std::size_t bytes, std::byte* buffer, std::size_t block, bool write,
                 bool direct = true) {
  const int flags = (write ? (O_WRONLY | O_CREAT | O_TRUNC) : O_RDONLY) | (direct ? O_DIRECT : 0);
  const Fd fd(path, flags);
  if (!write && !direct) ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED);
  for (std::size_t done = 0; done < bytes;) {
    const std::size_t count = std::min(block, bytes - done);
    const ssize_t moved = write ? ::pwrite(fd.get(), buffer, count, static_cast<off_t>(done))
                                : ::pread(fd.get(), buffer, count, static_cast<off_t>(done));
    ZT_CHECK_AS(zt::IoError, moved > 0, write ? "pwrite" : "pread", " of '", path, "' at ", done,
                " failed: ", moved < 0 ? std::strerror(errno) : "end of file");
    done += static_cast<std::size_t>(moved);
  }
  if (write)
    ZT_CHECK_AS(zt::IoError, ::fsync(fd.get()) == 0, "fsync of '", path, "': ", std::strerror(errno));
}

/// Drop a file's pages from the page cache, so that the next read comes from the device.
void evict(const std::string& path) {
  const Fd fd(path, O_RDONLY);
  ::fdatasync(fd.get());
  ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED);
}

/// Seconds `work` takes on the slowest rank: barrier, work, barrier.
template <typename Work>
double timed(Work&& work) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto start = std::chrono::steady_clock::now();
  work();
  MPI_Barrier(MPI_COMM_WORLD);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string shared_directory(const std::string& parent, int rank) {
  std::string name;
  if (rank == 0) {
    std::string pattern = (fs::path(parent) / "zt-bench-checkpoint-XXXXXX").string();
    ZT_CHECK_AS(zt::IoError, ::mkdtemp(pattern.data()) != nullptr, "cannot create a directory under '",
                parent, "': ", std::strerror(errno));
    name = pattern;
  }
  int length = static_cast<int>(name.size());
  MPI_Bcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD);
  name.resize(static_cast<std::size_t>(length));
  MPI_Bcast(name.data(), length, MPI_CHAR, 0, MPI_COMM_WORLD);
  return name;
}

/// The temporary directory, removed however the benchmark ends (rank 0, after every rank is done).
class ScratchDirectory {
 public:
  ScratchDirectory(const std::string& parent, int rank)
      : path_(shared_directory(parent, rank)), rank_(rank) {}
  ScratchDirectory(const ScratchDirectory&) = delete;
  ScratchDirectory& operator=(const ScratchDirectory&) = delete;
  ~ScratchDirectory() {
    std::error_code ignored;
    fs::remove(fs::path(path_) / ("direct." + std::to_string(rank_)), ignored);
    // On an error, no barrier: the other ranks may never come (run_and_report aborts the job).
    if (std::uncaught_exceptions() == 0) MPI_Barrier(MPI_COMM_WORLD);
    if (rank_ == 0) fs::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int rank_;
};

int run(zt::Runtime& runtime, int argc, char** argv) {
  const Arguments arguments = parse(argc, argv);
  const int rank = runtime.world_rank();
  const int ranks = runtime.world_size();
  const bool root = rank == 0;

  const zt::Config config = zt::Config::from_string(config_text(arguments));
  auto model = zt::build_model(config);
  zt::Engine engine(runtime, *model, config);
  auto data = zt::make_training_data(engine.config(), engine, std::nullopt);
  engine.forward(data->load(0));  // one step, so that the moments hold real values
  engine.backward();
  engine.step();

  const ScratchDirectory scratch(arguments.path, rank);
  const std::string checkpoint_dir = (fs::path(scratch.path()) / "ckpt").string();
  const std::string direct_file = (fs::path(scratch.path()) / ("direct." + std::to_string(rank))).string();
  zt::SaveOptions save_options;
  save_options.tag = "bench";
  engine.save_checkpoint(checkpoint_dir, save_options);  // warm-up, and the byte count
  const std::string checkpoint = zt::checkpoint_file(checkpoint_dir, "bench");
  std::uint64_t checkpoint_bytes = root ? fs::file_size(checkpoint) : 0;
  MPI_Bcast(&checkpoint_bytes, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  const std::size_t share =
      (static_cast<std::size_t>(checkpoint_bytes) / static_cast<std::size_t>(ranks) + kAlignment - 1) /
      kAlignment * kAlignment;
  const std::size_t block = arguments.block_mib * kMiB;
  const AlignedBuffer buffer = aligned_buffer(block);
  for (std::size_t i = 0; i < block; ++i) buffer.get()[i] = static_cast<std::byte>((i * 131 + rank) & 0xFF);
  const double direct_bytes = static_cast<double>(share) * ranks;

  if (root) {
    std::printf(
        "checkpoint: GPT d_model %d, %d layers, %lld parameters; file %.1f MB (fp32 parameters + AdamW "
        "exp_avg, exp_avg_sq); %d ranks, ZeRO stage %d\n"
        "directory: %s (%s); O_DIRECT: %zu B per rank in %zu MiB blocks; %d rounds\n",
        arguments.d_model, arguments.layers, static_cast<long long>(engine.parameter_count()),
        static_cast<double>(checkpoint_bytes) / 1e6, ranks, arguments.stage, scratch.path().c_str(),
        zt::file_system_name(scratch.path()).c_str(), share, arguments.block_mib, arguments.rounds);
    std::printf("%-6s %10s %10s %14s %14s %14s %14s   (seconds)\n", "round", "save", "load", "O_DIRECT write",
                "O_DIRECT read", "buffered write", "buffered read");
  }
  std::vector<double> save_rate, load_rate, write_rate, read_rate, write_ratio, read_ratio,
      buffered_write_rate, buffered_read_rate;
  for (int round = 1; round <= arguments.rounds; ++round) {
    double save = 0, load = 0, write = 0, read = 0, buffered_write = 0, buffered_read = 0;
    const auto checkpoint_side = [&] {
      save = timed([&] { engine.save_checkpoint(checkpoint_dir, save_options); });
      if (root) evict(checkpoint);
      load = timed([&] { engine.load_checkpoint(checkpoint_dir); });
    };
    const auto direct_side = [&] {
      write = timed([&] { direct_pass(direct_file, share, buffer.get(), block, true); });
      read = timed([&] { direct_pass(direct_file, share, buffer.get(), block, false); });
      buffered_write = timed([&] { direct_pass(direct_file, share, buffer.get(), block, true, false); });
      buffered_read = timed([&] { direct_pass(direct_file, share, buffer.get(), block, false, false); });
    };
    if (round % 2) {
      checkpoint_side();
      direct_side();
    } else {
      direct_side();
      checkpoint_side();
    }
    const double bytes = static_cast<double>(checkpoint_bytes);
    save_rate.push_back(bytes / save / 1e6);
    load_rate.push_back(bytes / load / 1e6);
    write_rate.push_back(direct_bytes / write / 1e6);
    read_rate.push_back(direct_bytes / read / 1e6);
    write_ratio.push_back(save_rate.back() / write_rate.back());
    read_ratio.push_back(load_rate.back() / read_rate.back());
    buffered_write_rate.push_back(direct_bytes / buffered_write / 1e6);
    buffered_read_rate.push_back(direct_bytes / buffered_read / 1e6);
    if (root) {
      std::printf("%-6d %10.3f %10.3f %14.3f %14.3f %14.3f %14.3f\n", round, save, load, write, read,
                  buffered_write, buffered_read);
    }
  }
  if (root) {
    std::printf(
        "median MB/s: save %.1f, O_DIRECT write %.1f (save/O_DIRECT %.2f); load %.1f, O_DIRECT read %.1f "
        "(load/O_DIRECT %.2f)\n",
        zt::bench::median(save_rate), zt::bench::median(write_rate), zt::bench::median(write_ratio),
        zt::bench::median(load_rate), zt::bench::median(read_rate), zt::bench::median(read_ratio));
    std::printf("median MB/s of the buffered anchor: pwrite + fsync %.1f, cold pread %.1f\n",
                zt::bench::median(buffered_write_rate), zt::bench::median(buffered_read_rate));
    std::printf(
        "RESULT ranks=%d stage=%d bytes=%llu save_mb_s=%.1f direct_write_mb_s=%.1f write_ratio=%.3f "
        "load_mb_s=%.1f direct_read_mb_s=%.1f read_ratio=%.3f buffered_write_mb_s=%.1f "
        "buffered_read_mb_s=%.1f\n",
        ranks, arguments.stage, static_cast<unsigned long long>(checkpoint_bytes),
        zt::bench::median(save_rate), zt::bench::median(write_rate), zt::bench::median(write_ratio),
        zt::bench::median(load_rate), zt::bench::median(read_rate), zt::bench::median(read_ratio),
        zt::bench::median(buffered_write_rate), zt::bench::median(buffered_read_rate));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  zt::Runtime runtime(&argc, &argv);
  return zt::run_and_report([&] { return run(runtime, argc, argv); });
}
