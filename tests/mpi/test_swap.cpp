// NVMe swap under MPI: ranks sharing one nvme_path each get their own swap file, named with their
// world rank, round-trip their own data concurrently, and leave the directory empty.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "mpi_test_main.hpp"
#include "zerotrain/communicator.hpp"
#include "zerotrain/swap.hpp"

namespace {

namespace fs = std::filesystem;

/// "prefix" followed by the number (built by appending: GCC 12 warns falsely on "literal" + string).
std::string numbered(const char* prefix, long long number) {
  std::string name(prefix);
  name += std::to_string(number);
  return name;
}

TEST(SwapMpi, RanksShareTheDirectoryWithFilesOfTheirOwn) {
  zt::Communicator& world = zt::testing::runtime().world();
  const int rank = world.rank();
  std::int64_t job = ::getpid();  // rank 0's pid names the directory for everyone
  world.broadcast(&job, 1, zt::DType::int64, 0);
  const fs::path directory = fs::temp_directory_path() / (numbered("zt_test_swap_mpi.", job));
  if (rank == 0) fs::create_directories(directory);
  world.barrier();

  {
    zt::SwapOptions options;
    options.nvme_path = directory;
    options.block_size = 64 * 1024;
    options.queue_depth = 4;
    options.job_id = numbered("job", job);  // the same on every rank: the rank tells them apart
    zt::SwapEngine engine(options);
    EXPECT_EQ(engine.file_path().filename(),
              numbered("zerotrain-swap.rank", rank) + numbered(".job", job) + ".bin");

    std::vector<zt::Buffer> originals, copies;
    std::mt19937_64 generator(static_cast<std::uint64_t>(rank) * 1000 + 1);
    for (int t = 0; t < 16; ++t) {
      const std::size_t bytes = 1 + generator() % (700 << 10);
      const std::string name = numbered("t", t);
      engine.register_tensor(name, bytes);
      originals.push_back(engine.allocate_buffer(bytes));
      copies.push_back(engine.allocate_buffer(bytes));
      for (std::size_t i = 0; i < bytes; ++i)
        originals.back().as<unsigned char>()[i] = static_cast<unsigned char>(generator());
      engine.swap_out(name, originals.back().data());
    }
    engine.wait_all();
    world.barrier();  // every rank has written before anyone reads
    for (int t = 0; t < 16; ++t) engine.swap_in(numbered("t", t), copies[static_cast<std::size_t>(t)].data());
    engine.wait_all();
    for (int t = 0; t < 16; ++t) {
      const std::size_t bytes = engine.slot(numbered("t", t)).bytes;
      EXPECT_EQ(std::memcmp(originals[static_cast<std::size_t>(t)].data(),
                            copies[static_cast<std::size_t>(t)].data(), bytes),
                0)
          << "rank " << rank << " tensor " << t;
    }

    world.barrier();
    if (rank == 0) {
      std::set<std::string> names;
      for (const auto& entry : fs::directory_iterator(directory))
        names.insert(entry.path().filename().string());
      EXPECT_EQ(names.size(), static_cast<std::size_t>(world.size()));
    }
    world.barrier();
  }

  world.barrier();
  if (rank == 0) {
    EXPECT_TRUE(fs::is_empty(directory)) << "swap files left in " << directory;
    fs::remove_all(directory);
  }
}

}  // namespace
