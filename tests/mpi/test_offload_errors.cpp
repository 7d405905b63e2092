// NVMe optimizer and parameter offload under bad conditions, through the training engine: an unwritable, full
// or O_DIRECT-less nvme_path fails in Engine's constructor with a clear zt::IoError and leaves no file behind
// (buffered I/O only when asked for, and then it trains as in memory); a swap file truncated, or a disk
// filled, behind the engine's back mid-run stops the next optimizer step with an error naming the file and
// the offset, on every rank, and the engine is still destroyed cleanly.
//
// The bad conditions are made on purpose (tests/swap_test_fixtures.hpp): chattr +i, and ramfs and
// tmpfs mounts made by rank 0 for the job (the ranks of a test share one machine). Where this process
// cannot mount or chattr, those tests skip with the reason.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "engine_runs.hpp"
#include "job_directory.hpp"
#include "mpi_test_main.hpp"
#include "offload_configs.hpp"
#include "swap_test_fixtures.hpp"
#include "zerotrain/engine.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/trainer.hpp"

namespace {

using namespace zt::testing::engine_runs;
namespace fs = std::filesystem;

constexpr int kStage = 2;
constexpr int kSteps = 3;

int world_rank() {
  return zt::testing::runtime().world_rank();
}

/// Rank 0's text on every rank.
std::string broadcast(std::string text) {
  int length = static_cast<int>(text.size());
  MPI_Bcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD);
  text.resize(static_cast<std::size_t>(length));
  MPI_Bcast(text.data(), length, MPI_CHAR, 0, MPI_COMM_WORLD);
  return text;
}

/// Whether `ok` holds on every rank. ASSERT on it, not on a rank's own condition, where the ranks
/// are about to run collectives: all must return together, or those left behind wait forever.
bool on_every_rank(bool ok) {
  int all = ok ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

/// A file system that rank 0 mounts for the whole job; every rank learns whether it worked and why
/// not, so that all skip together. Detached after every rank is done with it.
class JobMount {
 public:
  JobMount(const fs::path& target, const char* type, const char* data) {
    if (world_rank() == 0) mount_.emplace(target, type, data);
    reason_ = broadcast(world_rank() == 0 && !mount_->mounted() ? mount_->reason() : std::string());
    mounted_ = reason_.empty();
  }
  ~JobMount() {
    MPI_Barrier(MPI_COMM_WORLD);
    mount_.reset();
  }
  JobMount(const JobMount&) = delete;
  JobMount& operator=(const JobMount&) = delete;
  bool mounted() const { return mounted_; }
  const std::string& reason() const { return reason_; }

 private:
  std::optional<zt::testing::ScopedMount> mount_;
  bool mounted_ = false;
  std::string reason_;
};

/// Files in `directory` as every rank sees them after all ranks got here ("" when there are none).
std::string leftovers(const fs::path& directory) {
  MPI_Barrier(MPI_COMM_WORLD);
  std::string names;
  for (const auto& entry : fs::directory_iterator(directory)) names += entry.path().filename().string() + " ";
  return names;
}

/// The message of the zt::IoError that `body` throws (a test failure if it throws none, or another type).
template <typename Body>
std::string io_error_of(Body&& body) {
  try {
    body();
  } catch (const zt::IoError& error) {
    return error.what();
  } catch (const std::exception& error) {
    ADD_FAILURE() << "expected a zt::IoError, got: " << error.what();
    return {};
  }
  ADD_FAILURE() << "expected a zt::IoError, nothing was thrown";
  return {};
}

/// Engine construction with this config: the error's message.
std::string construction_error(const zt::Config& config) {
  auto model = zt::build_model(config);
  return io_error_of([&] { zt::Engine engine(zt::testing::runtime(), *model, config); });
}

/// Bytes of this rank's swap file for the test GPT (an engine built on the job directory's disk).
std::uint64_t swap_bytes_of_this_rank(const std::string& nvme_path) {
  const zt::Config config = config_for(kStage, offload_section("nvme", nvme_path));
  auto model = zt::build_model(config);
  zt::Engine engine(zt::testing::runtime(), *model, config);
  return engine.optimizer_states_placement().swap_bytes;
}

/// Stage 3 with every parameter piece in a swap file under `nvme_path` (the optimizer in memory).
zt::Config parameters_on_nvme(const std::string& nvme_path) {
  return config_for(
      3, R"("offload_param": {"device": "nvme", "nvme_path": ")" + nvme_path + R"(", "max_in_cpu": 0})");
}

/// tmpfs "size=" of `bytes`, in whole pages.
std::string tmpfs_size(std::uint64_t bytes) {
  return "size=" + std::to_string(std::max<std::uint64_t>(bytes / 4096, 1) * 4) + "k";
}

/// On a tmpfs without O_DIRECT (Linux before 6.6) the engine must be allowed buffered I/O.
std::optional<std::string> buffered_io_unless_direct(const fs::path& directory) {
  if (zt::testing::supports_direct_io(directory)) return std::nullopt;
  return std::string("1");
}

/// On a tmpfs half the size of the smallest rank's swap file (this rank's: `needed` bytes), building
/// the engine of `config_on(path)` fails with one reservation of the whole file: the message names
/// the file, the swap tensors (`tensors`, a regex of the first and last), what the whole file needs
/// and what is free, and no file stays behind.
void expect_full_disk_refusal(const zt::testing::JobDirectory& directory, std::uint64_t needed,
                              const std::string& tensors,
                              const std::function<zt::Config(const std::string&)>& config_on) {
  std::uint64_t smallest = needed;
  MPI_Allreduce(&needed, &smallest, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  const std::string mount_point = directory / "small";
  JobMount tmpfs(mount_point, "tmpfs", tmpfs_size(smallest / 2).c_str());
  if (!tmpfs.mounted()) GTEST_SKIP() << "cannot make a small file system here: " << tmpfs.reason();
  zt::testing::ScopedEnvironment buffered("ZT_SWAP_BUFFERED_IO", buffered_io_unless_direct(mount_point));

  const std::string message = construction_error(config_on(mount_point));
  const std::regex reservation(
      "swap: cannot reserve ([0-9]+) bytes \\([0-9.]+ [KM]iB\\) for [0-9]+ swap tensors \\(" + tensors +
      "\\) at offset 0 of '([^']*)/zerotrain-swap\\.rank([0-9]+)\\.[^']*': No space left on device "
      "\\(nvme_path '([^']*)' has ([0-9]+) bytes(?: \\([^)]*\\))? free; the swap file needs ([0-9]+) bytes "
      "\\([^)]*\\) in all on this rank\\)");
  std::smatch parts;
  if (std::regex_search(message, parts, reservation)) {  // not ASSERT: every rank must reach leftovers()
    EXPECT_EQ(std::stoull(parts[1].str()), needed) << message;
    EXPECT_EQ(parts[2].str(), mount_point);
    EXPECT_EQ(parts[3].str(), std::to_string(world_rank()));
    EXPECT_EQ(parts[4].str(), mount_point);
    EXPECT_LT(std::stoull(parts[5].str()), needed) << message;
    EXPECT_EQ(std::stoull(parts[6].str()), needed) << message;
  } else {
    ADD_FAILURE() << "not a failed reservation of the whole swap file with its sizes: " << message;
  }
  EXPECT_EQ(leftovers(mount_point), "") << "no swap file may stay after a failed construction";
}

TEST(OffloadErrors, UnwritableNvmePathFailsAtConstruction) {
  zt::testing::JobDirectory directory("zt-offload-errors", "ZT_TEST_SWAP_DIR");
  const fs::path locked = directory / "locked";
  std::optional<zt::testing::UnwritableDirectory> unwritable;
  if (world_rank() == 0) {
    fs::create_directories(locked);
    unwritable.emplace(locked);  // as root: chattr +i, which root cannot write past either
  }
  const std::string refusal =
      broadcast(world_rank() == 0 && !unwritable->applied() ? unwritable->reason() : std::string());
  if (!refusal.empty()) GTEST_SKIP() << "cannot make a directory unwritable here: " << refusal;

  const std::string message = construction_error(config_for(kStage, offload_section("nvme", locked)));
  EXPECT_NE(message.find("cannot create the swap file '" + (locked / "zerotrain-swap.rank").string() +
                         std::to_string(world_rank()) + "."),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("nvme_path is not writable by this process"), std::string::npos) << message;
  EXPECT_EQ(leftovers(locked), "");
  MPI_Barrier(MPI_COMM_WORLD);  // every rank tried before rank 0 makes it writable again
}

TEST(OffloadErrors, FileSystemWithoutDirectIoFailsUnlessBufferedIoIsAsked) {
  zt::testing::JobDirectory directory("zt-offload-errors", "ZT_TEST_SWAP_DIR");
  const std::string mount_point = directory / "ramfs";
  JobMount ramfs(mount_point, "ramfs", nullptr);  // ramfs has no O_DIRECT
  if (!ramfs.mounted()) GTEST_SKIP() << "cannot make a file system without O_DIRECT here: " << ramfs.reason();
  const zt::Config config = config_for(kStage, offload_section("nvme", mount_point));
  {
    zt::testing::ScopedEnvironment direct_only("ZT_SWAP_BUFFERED_IO", std::nullopt);
    const std::string message = construction_error(config);
    EXPECT_NE(
        message.find("the file system of nvme_path '" + mount_point + "' (ramfs) does not support O_DIRECT"),
        std::string::npos)
        << message;
    EXPECT_NE(message.find("ZT_SWAP_BUFFERED_IO=1"), std::string::npos) << message;
    EXPECT_NE(message.find("allow_buffered_io"), std::string::npos) << message;
    EXPECT_EQ(leftovers(mount_point), "");
  }

  // Asked for: buffered I/O through the page cache, and the run is the in-memory one, bit for bit.
  const RunResult in_memory = run(config_for(kStage, ""), kSteps, nullptr);
  zt::testing::ScopedEnvironment buffered("ZT_SWAP_BUFFERED_IO", "1");
  {
    auto model = zt::build_model(config);
    zt::Engine engine(zt::testing::runtime(), *model, config);
    const zt::OptimizerStatesPlacement placement = engine.optimizer_states_placement();
    EXPECT_EQ(fs::path(placement.swap_file).parent_path(), fs::path(mount_point));
    EXPECT_TRUE(fs::exists(placement.swap_file));
  }
  expect_same_run(in_memory, run(config, kSteps, nullptr), "buffered I/O on ramfs");
  EXPECT_EQ(leftovers(mount_point), "");
}

TEST(OffloadErrors, FullNvmePathFailsAtConstruction) {
  zt::testing::JobDirectory directory("zt-offload-errors", "ZT_TEST_SWAP_DIR");
  const std::uint64_t needed = swap_bytes_of_this_rank(directory.path());
  // One reservation for the whole file: the message gives what all of it needs, not what the
  // sub-groups up to the first that did not fit need.
  expect_full_disk_refusal(
      directory, needed, "'optimizer\\.sub_group\\.0' to 'optimizer\\.sub_group\\.[0-9]+'",
      [](const std::string& path) { return config_for(kStage, offload_section("nvme", path)); });
}

/// The same for the parameter swap file (offload_param): refused on a file system without O_DIRECT,
/// and a disk too small fails with the size of all the pieces, naming the first and the last.
TEST(OffloadErrors, ParameterSwapFileOnABadFileSystemFailsAtConstruction) {
  zt::testing::JobDirectory directory("zt-offload-errors", "ZT_TEST_SWAP_DIR");
  const std::string ramfs_point = directory / "ramfs";
  {
    JobMount ramfs(ramfs_point, "ramfs", nullptr);
    if (!ramfs.mounted())
      GTEST_SKIP() << "cannot make a file system without O_DIRECT here: " << ramfs.reason();
    zt::testing::ScopedEnvironment direct_only("ZT_SWAP_BUFFERED_IO", std::nullopt);
    const std::string message = construction_error(parameters_on_nvme(ramfs_point));
    EXPECT_NE(
        message.find("the file system of nvme_path '" + ramfs_point + "' (ramfs) does not support O_DIRECT"),
        std::string::npos)
        << message;
    EXPECT_EQ(leftovers(ramfs_point), "");
  }

  std::uint64_t needed = 0;
  {
    const zt::Config on_disk = parameters_on_nvme(directory.path());
    auto model = zt::build_model(on_disk);
    zt::Engine engine(zt::testing::runtime(), *model, on_disk);
    needed = engine.parameters_placement().swap_bytes;
  }
  expect_full_disk_refusal(directory, needed, "'parameter\\.wte\\.weight' to 'parameter\\.[a-z_.0-9]+'",
                           parameters_on_nvme);
}

/// The swap file loses its second half behind the engine's back after a few steps (every rank its
/// own): the next optimizer step fails on every rank, naming the file and where the read stopped.
TEST(OffloadErrors, TruncatedSwapFileStopsTheStepNamingFileAndOffset) {
  zt::testing::JobDirectory directory("zt-offload-errors", "ZT_TEST_SWAP_DIR");
  const zt::Config config = config_for(kStage, offload_section("nvme", directory.path()));
  std::string swap_file;
  {
    auto model = zt::build_model(config);
    zt::Engine engine(zt::testing::runtime(), *model, config);
    auto data = zt::make_training_data(engine.config(), engine, std::nullopt);
    train_steps(engine, *data, 2);
    const zt::OptimizerStatesPlacement placement = engine.optimizer_states_placement();
    swap_file = placement.swap_file;
    const std::uint64_t cut = placement.swap_bytes / 2 / 4096 * 4096;
    const bool truncated = cut > 0 && ::truncate(swap_file.c_str(), static_cast<off_t>(cut)) == 0;
    const int error = errno;
    ASSERT_TRUE(on_every_rank(truncated)) << "truncate to " << cut << " bytes: " << std::strerror(error);

    const std::string message = io_error_of([&] { train_steps(engine, *data, 1); });
    const std::regex short_read(
        "swap: short read at offset ([0-9]+) of swap file '([^']*)': ([0-9]+) of ([0-9]+) "
        "bytes \\(was the file truncated or replaced behind zerotrain's back\\?\\)");
    std::smatch parts;
    if (std::regex_search(message, parts, short_read)) {  // not ASSERT: every rank must reach leftovers()
      EXPECT_EQ(parts[2].str(), swap_file);
      // The read stopped where the file now ends: a block that straddles the cut got the bytes up
      // to it, one wholly past it got none.
      const std::uint64_t offset = std::stoull(parts[1].str());
      const std::uint64_t got = std::stoull(parts[3].str());
      EXPECT_EQ(offset + got, std::max(offset, cut)) << message;
      EXPECT_LT(got, std::stoull(parts[4].str())) << message;
    } else {
      ADD_FAILURE() << "not a short read naming the swap file and offset: " << message;
    }
    EXPECT_EQ(engine.global_steps(), 2) << "the failed step must not count";
  }  // destroying the engine after the error must neither hang nor crash, and removes the file
  EXPECT_FALSE(fs::exists(swap_file));
  EXPECT_EQ(leftovers(directory.path()), "");
}

/// The space under the swap file is given back (holes punched, size kept) and another file takes it
/// all, behind the engine's back: the next optimizer step reads zeros but cannot write them back,
/// and fails on every rank naming the file and offset of the write.
TEST(OffloadErrors, FullDiskMidRunStopsTheStepNamingFileAndOffset) {
  zt::testing::JobDirectory directory("zt-offload-errors", "ZT_TEST_SWAP_DIR");
  std::uint64_t needed = swap_bytes_of_this_rank(directory.path());
  std::uint64_t total = needed;
  MPI_Allreduce(&needed, &total, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  const std::string mount_point = directory / "small";
  JobMount tmpfs(mount_point, "tmpfs", tmpfs_size(total + (256 << 10)).c_str());
  if (!tmpfs.mounted()) GTEST_SKIP() << "cannot make a small file system here: " << tmpfs.reason();
  zt::testing::ScopedEnvironment buffered("ZT_SWAP_BUFFERED_IO", buffered_io_unless_direct(mount_point));
  const zt::Config config = config_for(kStage, offload_section("nvme", mount_point));
  std::string swap_file;
  {
    auto model = zt::build_model(config);
    zt::Engine engine(zt::testing::runtime(), *model, config);
    auto data = zt::make_training_data(engine.config(), engine, std::nullopt);
    train_steps(engine, *data, 2);
    const zt::OptimizerStatesPlacement placement = engine.optimizer_states_placement();
    swap_file = placement.swap_file;
    {
      const int fd = ::open(swap_file.c_str(), O_RDWR | O_CLOEXEC);
      const bool punched = fd >= 0 && ::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
                                                  static_cast<off_t>(placement.swap_bytes)) == 0;
      const int error = errno;
      if (fd >= 0) ::close(fd);
      ASSERT_TRUE(on_every_rank(punched))
          << "punching holes in " << swap_file << ": " << std::strerror(error);
    }
    if (world_rank() == 0) {
      std::ofstream hog(fs::path(mount_point) / "hog", std::ios::binary);
      const std::vector<char> chunk(1 << 16, 'x');
      while (hog.write(chunk.data(), static_cast<std::streamsize>(chunk.size())) && hog.flush()) {
      }
    }
    MPI_Barrier(MPI_COMM_WORLD);

    const std::string message = io_error_of([&] { train_steps(engine, *data, 1); });
    const std::regex failed_write(
        "swap: (write of [0-9]+ bytes at offset [0-9]+ of swap file '([^']*)' failed: "
        "No space left on device|short write at offset [0-9]+ of swap file "
        "'([^']*)': [0-9]+ of [0-9]+ bytes)");
    std::smatch parts;
    if (std::regex_search(message, parts, failed_write)) {
      EXPECT_EQ(parts[2].matched ? parts[2].str() : parts[3].str(), swap_file);
    } else {
      ADD_FAILURE() << "not a failed write naming the swap file: " << message;
    }
    // Nothing may free space (an engine's file, the hog) before every rank has had its error.
    MPI_Barrier(MPI_COMM_WORLD);
  }
  EXPECT_FALSE(fs::exists(swap_file));
  if (world_rank() == 0) fs::remove(fs::path(mount_point) / "hog");
  EXPECT_EQ(leftovers(mount_point), "");
}

}  // namespace
