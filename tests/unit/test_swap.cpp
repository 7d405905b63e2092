// The NVMe swap engine on real files: exact round trips under many concurrent requests with each
// backend, the swap file's life cycle, the errors at initialization (missing, unwritable or full
// nvme_path, no O_DIRECT) and mid-run (short read, failed write), and the double-buffered pipeline
// against the same work done in memory.
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "src/engine/swap_options_from_config.hpp"
#include "swap_test_fixtures.hpp"
#include "test_helpers.hpp"
#include "zerotrain/build_info.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/report.hpp"
#include "zerotrain/swap.hpp"

namespace {

namespace fs = std::filesystem;
using zt::SwapBackend;
using zt::SwapEngine;
using zt::SwapHandle;
using zt::SwapOptions;
using zt::testing::error_of;
using zt::testing::ScopedMount;
using zt::testing::TestDirectory;
using zt::testing::UnwritableDirectory;

/// "prefix" followed by the number (built by appending: GCC 12 warns falsely on "literal" + string).
std::string numbered(const char* prefix, long long number) {
  std::string name(prefix);
  name += std::to_string(number);
  return name;
}

SwapOptions small_options(const fs::path& directory, SwapBackend backend = SwapBackend::automatic) {
  SwapOptions options;
  options.nvme_path = directory;
  options.backend = backend;
  options.block_size = 64 * 1024;  // small blocks: one request becomes many kernel requests
  options.queue_depth = 4;
  return options;
}

void fill_random(void* data, std::size_t bytes, std::uint64_t seed) {
  std::mt19937_64 generator(seed);
  auto* out = static_cast<unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) out[i] = static_cast<unsigned char>(generator());
}

bool same_bytes(const zt::Buffer& a, const zt::Buffer& b, std::size_t bytes) {
  return std::memcmp(a.data(), b.data(), bytes) == 0;
}

/// Many tensors of awkward sizes written and read back all at once, twice over (the second time
/// overwriting half of them while reading the other half).
void check_round_trips(SwapEngine& engine, int tensors, std::uint64_t seed) {
  std::mt19937_64 generator(seed);
  const std::vector<std::size_t> edge_sizes = {1, 4095, 4096, 4097, 65535, 65536, 65537, 3 * 65536 + 17};
  std::vector<std::string> names;
  std::vector<zt::Buffer> originals, copies;
  for (int t = 0; t < tensors; ++t) {
    const std::size_t bytes = t < static_cast<int>(edge_sizes.size())
                                  ? edge_sizes[static_cast<std::size_t>(t)]
                                  : 1 + generator() % (3 << 20);
    names.push_back(numbered("tensor.", t));
    engine.register_tensor(names.back(), bytes);
    originals.push_back(engine.allocate_buffer(bytes));
    copies.push_back(engine.allocate_buffer(bytes));
    fill_random(originals.back().data(), bytes, seed + static_cast<std::uint64_t>(t));
    std::memset(copies.back().data(), 0xAB, copies.back().size());
  }

  std::vector<SwapHandle> handles;
  for (int t = 0; t < tensors; ++t) handles.push_back(engine.swap_out(names[t], originals[t].data()));
  engine.wait_all();
  for (int t = 0; t < tensors; ++t) handles[t] = engine.swap_in(names[t], copies[t].data());
  for (auto& handle : handles) engine.wait(handle);
  for (int t = 0; t < tensors; ++t) {
    const std::size_t bytes = engine.slot(names[t]).bytes;
    ASSERT_TRUE(same_bytes(originals[t], copies[t], bytes)) << names[t] << " (" << bytes << " bytes)";
    // Bytes past the tensor in the caller's buffer are not touched by a read.
    for (std::size_t i = bytes; i < copies[t].size(); ++i) {
      ASSERT_EQ(copies[t].as<unsigned char>()[i], 0xAB) << names[t] << " byte " << i;
    }
  }

  // Even tensors get new contents while odd ones are read, all in flight together.
  handles.clear();
  for (int t = 0; t < tensors; ++t) {
    const std::size_t bytes = engine.slot(names[t]).bytes;
    if (t % 2 == 0) {
      fill_random(originals[t].data(), bytes, seed * 7 + static_cast<std::uint64_t>(t));
      handles.push_back(engine.swap_out(names[t], originals[t].data()));
    } else {
      std::memset(copies[t].data(), 0, bytes);
      handles.push_back(engine.swap_in(names[t], copies[t].data()));
    }
  }
  engine.wait_all();
  for (int t = 0; t < tensors; t += 2) handles[t] = engine.swap_in(names[t], copies[t].data());
  engine.wait_all();
  for (int t = 0; t < tensors; ++t) {
    ASSERT_TRUE(same_bytes(originals[t], copies[t], engine.slot(names[t]).bytes))
        << names[t] << " second pass";
  }
}

/// An engine with a forced backend, or nullptr and the kernel's reason when it refuses that backend.
std::unique_ptr<SwapEngine> engine_or_refusal(const SwapOptions& options, std::string& refusal) {
  try {
    return std::make_unique<SwapEngine>(options);
  } catch (const zt::IoError& error) {
    const std::string message = error.what();
    if (message.find("io_uring_queue_init") != std::string::npos ||
        message.find("io_setup") != std::string::npos || message.find("no io_uring") != std::string::npos) {
      refusal = message;
      return nullptr;
    }
    throw;
  }
}

class SwapBackends : public ::testing::TestWithParam<SwapBackend> {};

TEST_P(SwapBackends, RoundTripsExactlyUnderManyConcurrentRequests) {
  TestDirectory directory;
  std::string refusal;
  auto engine = engine_or_refusal(small_options(directory.path(), GetParam()), refusal);
  if (!engine) GTEST_SKIP() << "the kernel refuses " << zt::to_string(GetParam()) << " here: " << refusal;
  ASSERT_EQ(engine->backend(), GetParam());
  ASSERT_TRUE(engine->direct_io()) << "the test directory " << directory.path()
                                   << " should support O_DIRECT (set ZT_TEST_SWAP_DIR to a disk)";
  check_round_trips(*engine, 48, 42);
}

TEST_P(SwapBackends, RoundTripsWithEveryAioSetting) {
  TestDirectory directory;
  struct Variant {
    std::size_t lanes;
    bool single_submit;
    bool overlap_events;
    std::size_t queue_depth;
  };
  for (const Variant& variant : {Variant{3, false, true, 4}, Variant{1, true, true, 2},
                                 Variant{2, false, false, 3}, Variant{1, true, false, 1}}) {
    SwapOptions options = small_options(directory.path(), GetParam());
    options.intra_op_parallelism = variant.lanes;
    options.single_submit = variant.single_submit;
    options.overlap_events = variant.overlap_events;
    options.queue_depth = variant.queue_depth;
    std::string refusal;
    auto engine = engine_or_refusal(options, refusal);
    if (!engine) GTEST_SKIP() << "the kernel refuses " << zt::to_string(GetParam()) << " here: " << refusal;
    SCOPED_TRACE(testing::Message() << "lanes " << variant.lanes << " single_submit " << variant.single_submit
                                    << " overlap_events " << variant.overlap_events << " queue_depth "
                                    << variant.queue_depth);
    check_round_trips(*engine, 12, 7 + variant.lanes);
  }
}

INSTANTIATE_TEST_SUITE_P(Swap, SwapBackends,
                         ::testing::Values(SwapBackend::io_uring, SwapBackend::libaio, SwapBackend::posix),
                         [](const auto& test_info) { return std::string(zt::to_string(test_info.param)); });

TEST(SwapEngine, AutomaticBackendIsWhatTheProbeSays) {
  TestDirectory directory;
  const zt::SwapBackendProbe probe = zt::probe_swap_backend();
  SwapEngine engine(small_options(directory.path()));
  EXPECT_EQ(engine.backend(), probe.backend);
  EXPECT_EQ(engine.backend_note(), probe.note);
  EXPECT_NE(engine.backend(), SwapBackend::posix);
  EXPECT_EQ(zt::swap_backend_from_string("libaio"), SwapBackend::libaio);
  EXPECT_EQ(zt::swap_backend_from_string("auto"), SwapBackend::automatic);
  EXPECT_NE(error_of([] { zt::swap_backend_from_string("spdk"); }).find("expected auto, io_uring"),
            std::string::npos);
}

TEST(SwapEngine, ReportNamesTheBackend) {
  const zt::Report report = zt::io_report();
  const auto line = std::find_if(report.begin(), report.end(), [](const zt::ReportLine& entry) {
    return entry.key == "NVMe swap backend";
  });
  ASSERT_NE(line, report.end());
  EXPECT_EQ(line->value.rfind(std::string(zt::to_string(zt::probe_swap_backend().backend)), 0), 0u)
      << line->value;
}

/// Exit codes of the child process in FallsBackToLibaioWhenTheKernelRefusesIoUring.
enum ChildOutcome {
  kFellBack = 0,
  kNoSeccomp = 2,
  kWrongBackend = 3,
  kNoReason = 4,
  kThrew = 5,
  kBadData = 6
};

// Containers often block io_uring with seccomp (Docker's default profile does). A child process
// installs such a filter (io_uring_setup fails with EPERM) and builds an engine with the automatic
// backend: it must pick libaio, say why, and work.
TEST(SwapEngine, FallsBackToLibaioWhenTheKernelRefusesIoUring) {
  if (!zt::build_info::have_uring) GTEST_SKIP() << "built without io_uring: nothing to fall back from";
  TestDirectory directory;
  const SwapOptions options = small_options(directory.path());
  const pid_t child = ::fork();
  ASSERT_GE(child, 0) << std::strerror(errno);
  if (child == 0) {
    sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    sock_fprog program{static_cast<unsigned short>(std::size(filter)), filter};
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) != 0) {
      ::_exit(kNoSeccomp);
    }
    int outcome = kFellBack;
    try {
      SwapEngine engine(options);
      if (engine.backend() != SwapBackend::libaio) {
        outcome = kWrongBackend;
      } else if (engine.backend_note().find(
                     "io_uring: io_uring_queue_init(1) failed: Operation not permitted") ==
                 std::string::npos) {
        std::fprintf(stderr, "backend note: %s\n", engine.backend_note().c_str());
        outcome = kNoReason;
      } else {
        engine.register_tensor("x", 200'000);
        zt::Buffer data = engine.allocate_buffer(200'000), back = engine.allocate_buffer(200'000);
        fill_random(data.data(), 200'000, 8);
        engine.wait(engine.swap_out("x", data.data()));
        engine.wait(engine.swap_in("x", back.data()));
        if (!same_bytes(data, back, 200'000)) outcome = kBadData;
      }
    } catch (const std::exception& error) {
      std::fprintf(stderr, "%s\n", error.what());
      outcome = kThrew;
    }
    ::_exit(outcome);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died with status " << status;
  if (WEXITSTATUS(status) == kNoSeccomp) GTEST_SKIP() << "cannot install a seccomp filter here";
  EXPECT_EQ(WEXITSTATUS(status), kFellBack)
      << "3: not libaio, 4: no reason given, 5: threw, 6: data differ (see the child's stderr)";
  EXPECT_EQ(directory.file_count(), 0u);
}

TEST(SwapEngine, OptionsFromTheAioSection) {
  zt::AioConfig aio;
  aio.block_size = 2 << 20;
  aio.queue_depth = 16;
  aio.intra_op_parallelism = 2;
  aio.single_submit = true;
  aio.overlap_events = false;
  const SwapOptions options = zt::engine_detail::swap_options_from_config(aio, "/nvme");
  EXPECT_EQ(options.nvme_path, fs::path("/nvme"));
  EXPECT_EQ(options.block_size, 2u << 20);
  EXPECT_EQ(options.queue_depth, 16u);
  EXPECT_EQ(options.intra_op_parallelism, 2u);
  EXPECT_TRUE(options.single_submit);
  EXPECT_FALSE(options.overlap_events);
  EXPECT_FALSE(options.allow_buffered_io);
  const SwapOptions defaults = zt::engine_detail::swap_options_from_config(zt::AioConfig{}, "/nvme");
  EXPECT_EQ(defaults.block_size, 1u << 20);  // DeepSpeed's defaults
  EXPECT_EQ(defaults.queue_depth, 8u);
}

/// Swap files left in a directory: parsed from their names (hosts may hold dots), stale only when
/// made on this host by a process that is gone; other files are ignored.
TEST(SwapFiles, ListsThemAndCallsStaleOnlyThoseOfAGoneProcessOnThisHost) {
  TestDirectory directory;
  char host_name[256] = {};
  ASSERT_EQ(::gethostname(host_name, sizeof(host_name) - 1), 0);
  const std::string host = host_name;
  const pid_t gone = ::fork();  // a process that exits at once: its pid is then free
  if (gone == 0) ::_exit(0);
  ASSERT_GT(gone, 0);
  ::waitpid(gone, nullptr, 0);
  auto touch = [&](const std::string& name) { std::ofstream(directory.path() / name) << "x"; };
  touch("zerotrain-swap.rank3." + host + "." + std::to_string(gone) + ".7.bin");
  touch("zerotrain-swap.rank0." + host + "." + std::to_string(::getpid()) + ".0.bin");
  touch("zerotrain-swap.rank1.node-7.cluster.example.org." + std::to_string(gone) + ".0.bin");
  touch("zerotrain-swap.rank2.fixed.bin");
  touch("something-else.bin");
  const std::vector<zt::SwapFileEntry> files = zt::list_swap_files(directory.path());
  ASSERT_EQ(files.size(), 4u);
  // Sorted by name: rank0 (alive), rank1 (other host), rank2 (custom job id), rank3 (gone).
  EXPECT_EQ(files[0].rank, 0);
  EXPECT_EQ(files[0].pid, ::getpid());
  EXPECT_FALSE(files[0].stale) << "this process is alive";
  EXPECT_EQ(files[1].host, "node-7.cluster.example.org");
  EXPECT_FALSE(files[1].stale) << "another host's file is never called stale";
  EXPECT_EQ(files[2].host, "");
  EXPECT_EQ(files[2].pid, -1);
  EXPECT_FALSE(files[2].stale) << "a custom job id says nothing of its process";
  EXPECT_EQ(files[3].rank, 3);
  EXPECT_EQ(files[3].host, host);
  EXPECT_EQ(files[3].pid, gone);
  EXPECT_TRUE(files[3].stale);
  EXPECT_EQ(files[3].bytes, 1u);
  EXPECT_NE(error_of([&] { zt::list_swap_files(directory.path() / "missing"); }).find("is not usable"),
            std::string::npos);
}

TEST(SwapEngine, OneFilePerEngineNamedWithRankAndRemovedAtTheEnd) {
  TestDirectory directory;
  SwapOptions options = small_options(directory.path());
  options.rank = 3;
  fs::path first_path, second_path;
  {
    SwapEngine first(options);
    SwapEngine second(options);  // same rank, same directory: its own file
    first_path = first.file_path();
    second_path = second.file_path();
    EXPECT_NE(first_path, second_path);
    EXPECT_EQ(first_path.parent_path(), directory.path());
    EXPECT_NE(first_path.filename().string().find("rank3"), std::string::npos) << first_path;
    EXPECT_TRUE(fs::exists(first_path));
    first.register_tensor("a", 100'000);
    EXPECT_GE(fs::file_size(first_path), 100'000u);  // reserved on disk at registration
    // Destroyed with a request still in flight: it is finished, then the file goes.
    zt::Buffer data = first.allocate_buffer(100'000);
    fill_random(data.data(), 100'000, 1);
    first.swap_out("a", data.data());
  }
  EXPECT_FALSE(fs::exists(first_path));
  EXPECT_FALSE(fs::exists(second_path));
  EXPECT_EQ(directory.file_count(), 0u);

  options.job_id = "fixed";
  SwapEngine named(options);
  EXPECT_EQ(named.file_path().filename(), "zerotrain-swap.rank3.fixed.bin");
  // A second engine with the same job id never takes over the first one's file.
  const std::string message = error_of([&] { SwapEngine clash(options); });
  EXPECT_NE(message.find("File exists"), std::string::npos) << message;
  EXPECT_TRUE(fs::exists(named.file_path()));
}

TEST(SwapEngine, NothingLeftBehindWhenInitializationFails) {
  TestDirectory directory;
  SwapOptions options = small_options(directory.path());
  options.block_size = 4096 + 512;  // refused after the file was created
  const std::string message = error_of([&] { SwapEngine engine(options); });
  EXPECT_NE(message.find("aio.block_size (4608) must be a multiple of 4096"), std::string::npos) << message;
  EXPECT_EQ(directory.file_count(), 0u);
}

TEST(SwapEngine, MisuseIsAnErrorThatSaysWhatWasExpected) {
  TestDirectory directory;
  SwapEngine engine(small_options(directory.path()));
  engine.register_tensor("m", 10'000);
  zt::Buffer buffer = engine.allocate_buffer(20'000);
  EXPECT_NE(error_of([&] { engine.swap_out("m", buffer.as<char>() + 8); }).find("not aligned to 4096"),
            std::string::npos);
  EXPECT_NE(error_of([&] { engine.swap_in("v", buffer.data()); }).find("no swap tensor 'v'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { engine.register_tensor("m", 5); }).find("registered already"), std::string::npos);
  EXPECT_NE(
      error_of([&] { engine.write(0, buffer.data(), 20'000); }).find("goes past the 12288 bytes reserved"),
      std::string::npos);
  EXPECT_NE(error_of([&] { engine.read(100, buffer.data(), 10); }).find("multiples of 4096"),
            std::string::npos);
  // Raw regions work like tensors.
  const std::uint64_t offset = engine.reserve(8192);
  EXPECT_EQ(offset, 12288u);
  fill_random(buffer.data(), 8192, 5);
  engine.wait(engine.write(offset, buffer.data(), 8192));
  zt::Buffer back = engine.allocate_buffer(8192);
  engine.wait(engine.read(offset, back.data(), 8192));
  EXPECT_TRUE(same_bytes(buffer, back, 8192));
}

TEST(SwapEngine, MissingOrNonDirectoryPathIsAClearError) {
  TestDirectory directory;
  std::string message = error_of([&] { SwapEngine engine(small_options(directory.path() / "absent")); });
  EXPECT_NE(message.find("nvme_path '" + (directory.path() / "absent").string() + "' is not usable"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("create the directory first"), std::string::npos) << message;

  std::ofstream(directory.path() / "plain_file") << "x";
  message = error_of([&] { SwapEngine engine(small_options(directory.path() / "plain_file" / "below")); });
  EXPECT_NE(message.find("is a file, not a directory"), std::string::npos) << message;
  message = error_of([&] { SwapEngine engine(small_options(directory.path() / "plain_file")); });
  EXPECT_NE(message.find("is not a directory"), std::string::npos) << message;
  EXPECT_NE(error_of([] { SwapEngine engine(SwapOptions{}); }).find("nvme_path is empty"), std::string::npos);
}

TEST(SwapEngine, UnwritablePathIsAClearError) {
  TestDirectory directory;
  const fs::path locked = directory.path() / "locked";
  fs::create_directories(locked);
  std::string message;
  {
    UnwritableDirectory unwritable(locked);  // root ignores permission bits, but not chattr +i
    if (!unwritable.applied())
      GTEST_SKIP() << "cannot make a directory unwritable here: " << unwritable.reason();
    message = error_of([&] { SwapEngine engine(small_options(locked)); });
  }
  EXPECT_NE(message.find("cannot create the swap file '" + locked.string()), std::string::npos) << message;
  EXPECT_NE(message.find("not writable"), std::string::npos) << message;
  EXPECT_TRUE(fs::is_empty(locked));
}

TEST(SwapEngine, FileSystemWithoutDirectIoIsRefusedUnlessBufferedIoIsAllowed) {
  TestDirectory directory;
  const fs::path mount_point = directory.path() / "ramfs";
  ScopedMount ramfs(mount_point, "ramfs", nullptr);  // ramfs has no O_DIRECT
  if (!ramfs.mounted()) GTEST_SKIP() << "cannot make a file system without O_DIRECT here: " << ramfs.reason();
  SwapOptions options = small_options(mount_point);
  const std::string message = error_of([&] { SwapEngine engine(options); });
  EXPECT_NE(message.find("the file system of nvme_path '" + mount_point.string() +
                         "' (ramfs) does not support "
                         "O_DIRECT"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("allow_buffered_io"), std::string::npos) << message;
  EXPECT_TRUE(fs::is_empty(mount_point)) << "the refused open left a file behind";

  options.allow_buffered_io = true;
  auto engine = std::make_unique<SwapEngine>(options);
  EXPECT_FALSE(engine->direct_io());
  check_round_trips(*engine, 10, 3);
  engine.reset();
  EXPECT_TRUE(fs::is_empty(mount_point));
}

/// A 4 MiB tmpfs (O_DIRECT since Linux 6.6; buffered before).
SwapOptions options_on_small_tmpfs(const fs::path& mount_point) {
  SwapOptions options = small_options(mount_point);
  options.allow_buffered_io = !zt::testing::supports_direct_io(mount_point);
  return options;
}

TEST(SwapEngine, FullFileSystemFailsAtRegistrationAndLeavesTheEngineAsItWas) {
  TestDirectory directory;
  const fs::path mount_point = directory.path() / "small";
  ScopedMount tmpfs(mount_point, "tmpfs", "size=4m");
  if (!tmpfs.mounted()) GTEST_SKIP() << "cannot make a small file system here: " << tmpfs.reason();
  SwapEngine engine(options_on_small_tmpfs(mount_point));
  engine.register_tensor("fits", 1 << 20);
  const std::string message = error_of([&] { engine.register_tensor("too_big", 8 << 20); });
  EXPECT_NE(message.find("cannot reserve 8388608 bytes (8.0 MiB) for swap tensor 'too_big'"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("No space left on device"), std::string::npos) << message;
  EXPECT_NE(message.find("MiB) free; the swap file needs"), std::string::npos) << message;
  EXPECT_FALSE(engine.has_tensor("too_big"));
  EXPECT_EQ(engine.reserved_bytes(), 1u << 20);
  EXPECT_EQ(fs::file_size(engine.file_path()), 1u << 20);  // what fallocate took is given back

  // Several tensors in one reservation (as the optimizer's sub-groups): the message gives what the
  // whole set needs, and none of them is registered.
  const std::string all = error_of([&] { engine.register_tensors({{"x", 3 << 20}, {"y", 3 << 20}}); });
  EXPECT_NE(
      all.find("cannot reserve 6291456 bytes (6.0 MiB) for 2 swap tensors ('x' to 'y') at offset 1048576"),
      std::string::npos)
      << all;
  EXPECT_NE(all.find("the swap file needs 7340032 bytes (7.0 MiB) in all on this rank"), std::string::npos)
      << all;
  EXPECT_FALSE(engine.has_tensor("x"));
  EXPECT_EQ(fs::file_size(engine.file_path()), 1u << 20);
  const std::string twice = error_of([&] { engine.register_tensors({{"d", 1}, {"d", 1}}); });
  EXPECT_NE(twice.find("swap tensor 'd' is registered already"), std::string::npos) << twice;
  EXPECT_FALSE(engine.has_tensor("d"));
  engine.register_tensors({{"p", 5000}, {"q", 1}});  // one after the other, each at the alignment
  EXPECT_EQ(engine.slot("p").offset, 1u << 20);
  EXPECT_EQ(engine.slot("q").offset, engine.slot("p").offset + engine.slot("p").padded_bytes);
  EXPECT_EQ(engine.reserved_bytes(), engine.slot("q").offset + engine.slot("q").padded_bytes);
  check_round_trips(engine, 6, 11);  // and the engine still works
}

TEST(SwapEngine, ShortReadNamesTheFileAndOffset) {
  TestDirectory directory;
  SwapEngine engine(small_options(directory.path()));
  engine.register_tensor("a", 1 << 20);
  engine.register_tensor("b", 300'000);
  zt::Buffer data = engine.allocate_buffer(1 << 20);
  fill_random(data.data(), 1 << 20, 9);
  engine.wait(engine.swap_out("a", data.data()));
  engine.wait(engine.swap_out("b", data.data()));
  // Behind the engine's back, the file loses everything after the first 512 KiB.
  ASSERT_EQ(::truncate(engine.file_path().c_str(), 512 << 10), 0);
  const std::string message = error_of([&] { engine.wait(engine.swap_in("b", data.data())); });
  EXPECT_NE(message.find("short read at offset 1048576 of swap file '" + engine.file_path().string()),
            std::string::npos)
      << message;
  // wait_all reports a failure nobody waited on.
  engine.swap_in("a", data.data());
  const std::string later = error_of([&] { engine.wait_all(); });
  EXPECT_NE(later.find("short read at offset 524288"), std::string::npos) << later;
  EXPECT_NO_THROW(engine.wait_all());  // reported once
}

TEST(SwapEngine, FailedWriteMidRunNamesTheFileAndOffset) {
  TestDirectory directory;
  const fs::path mount_point = directory.path() / "small";
  ScopedMount tmpfs(mount_point, "tmpfs", "size=4m");
  if (!tmpfs.mounted()) GTEST_SKIP() << "cannot make a small file system here: " << tmpfs.reason();
  SwapEngine engine(options_on_small_tmpfs(mount_point));
  engine.register_tensor("a", 2 << 20);
  // Behind the engine's back, its reservation is released and another file takes all the space.
  ASSERT_EQ(::truncate(engine.file_path().c_str(), 0), 0);
  {
    std::ofstream hog(mount_point / "hog", std::ios::binary);
    const std::vector<char> chunk(1 << 16, 'x');
    while (hog.write(chunk.data(), static_cast<std::streamsize>(chunk.size())) && hog.flush()) {
    }
  }
  zt::Buffer data = engine.allocate_buffer(2 << 20);
  fill_random(data.data(), 2 << 20, 4);
  const std::string message = error_of([&] { engine.wait(engine.swap_out("a", data.data())); });
  EXPECT_NE(message.find("of swap file '" + engine.file_path().string() + "'"), std::string::npos) << message;
  EXPECT_NE(message.find("at offset "), std::string::npos) << message;
  EXPECT_TRUE(message.find("No space left on device") != std::string::npos ||
              message.find("short write") != std::string::npos)
      << message;
}

/// The pipeline's result for every buffer count equals the same work done group by group in memory.
TEST(SwapPipeline, SameResultAsSynchronousWork) {
  TestDirectory directory;
  const std::vector<std::size_t> sizes = {300'000, 1 << 20, 5, 4096, 777'777, 65536, 123'457};
  auto transform = [](std::size_t group, std::span<std::byte> data, int pass) {
    for (std::size_t i = 0; i < data.size(); ++i) {
      data[i] = static_cast<std::byte>(static_cast<unsigned>(data[i]) * 3u + group + i % 251 + pass);
    }
  };
  // The reference: all groups in memory.
  std::vector<std::vector<std::byte>> expected;
  for (std::size_t g = 0; g < sizes.size(); ++g) {
    expected.emplace_back(sizes[g]);
    fill_random(expected.back().data(), sizes[g], 100 + g);
  }
  const auto initial = expected;
  for (int pass = 0; pass < 3; ++pass) {
    for (std::size_t g = 0; g < sizes.size(); ++g) transform(g, expected[g], pass);
  }

  for (std::size_t buffer_count : {1, 2, 3, 4, 9}) {
    SCOPED_TRACE(testing::Message() << buffer_count << " buffers");
    SwapEngine engine(small_options(directory.path()));
    std::vector<std::string> names;
    for (std::size_t g = 0; g < sizes.size(); ++g) {
      names.push_back(numbered("group.", g));
      engine.register_tensor(names.back(), sizes[g]);
      zt::Buffer staging = engine.allocate_buffer(sizes[g]);
      std::memcpy(staging.data(), initial[g].data(), sizes[g]);
      engine.wait(engine.swap_out(names.back(), staging.data()));
    }
    zt::SwapPipeline pipeline(engine, names, buffer_count);
    std::vector<std::size_t> order;
    for (int pass = 0; pass < 3; ++pass) {
      const auto stats = pipeline.run([&](std::size_t group, std::span<std::byte> data) {
        ASSERT_EQ(data.size(), sizes[group]);
        order.push_back(group);
        transform(group, data, pass);
      });
      EXPECT_GE(stats.wall_seconds, stats.work_seconds);
    }
    ASSERT_EQ(order.size(), 3 * sizes.size());
    for (std::size_t i = 0; i < order.size(); ++i) EXPECT_EQ(order[i], i % sizes.size());
    // Read-only run: sees the final contents and writes nothing.
    pipeline.run(
        [&](std::size_t group, std::span<std::byte> data) {
          EXPECT_EQ(std::memcmp(data.data(), expected[group].data(), data.size()), 0) << "group " << group;
          std::memset(data.data(), 0, data.size());
        },
        /*write_back=*/false);
    for (std::size_t g = 0; g < sizes.size(); ++g) {
      zt::Buffer back = engine.allocate_buffer(sizes[g]);
      engine.wait(engine.swap_in(names[g], back.data()));
      EXPECT_EQ(std::memcmp(back.data(), expected[g].data(), sizes[g]), 0) << "group " << g;
    }
  }
}

TEST(SwapPipeline, AnExceptionInTheWorkLeavesNoRequestInFlight) {
  TestDirectory directory;
  SwapEngine engine(small_options(directory.path()));
  std::vector<std::string> names;
  for (int g = 0; g < 5; ++g) {
    names.push_back(std::string("group.").append(std::to_string(g)));
    engine.register_tensor(names.back(), 1 << 20);
  }
  zt::SwapPipeline pipeline(engine, names, 3);
  EXPECT_THROW(pipeline.run([](std::size_t group, std::span<std::byte>) {
    if (group == 2) throw std::runtime_error("work failed");
  }),
               std::runtime_error);
  EXPECT_NO_THROW(engine.wait_all());
  EXPECT_NO_THROW(pipeline.run([](std::size_t, std::span<std::byte>) {}));
}

}  // namespace
